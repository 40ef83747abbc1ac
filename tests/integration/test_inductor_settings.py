"""Inductor settings changed globally reach the farm or keep the graph local, named
(torchfarm/wire/inductor_settings.py); freezing, which the farm's artifact cannot take,
compiles locally before anything runs."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._inductor.config as inductor_config

import sdk

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]


def test_freezing_under_no_grad_compiles_locally_and_matches_eager(stack, client_cache_dir, caplog):
    model, x = _mlp().eval(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="local")
    with caplog.at_level(logging.INFO, logger="sdk"), inductor_config.patch(freezing=True), torch.no_grad():
        out = compiled(x)
        ref = model(x)
    torch.testing.assert_close(out, ref)
    said = [m for m in _messages(caplog) if "compiles locally" in m]
    assert said and "freezing" in said[0], _messages(caplog)
    assert not [m for m in _messages(caplog) if "key=" in m], "nothing went to the farm"


def test_freezing_with_fallback_error_raises_naming_it(stack, client_cache_dir):
    torch._dynamo.reset()
    compiled = sdk.compile(_mlp().eval(), remote=stack.address, fallback="error")
    with inductor_config.patch(freezing=True), torch.no_grad(), pytest.raises(Exception, match="freezing"):
        compiled(torch.randn(4, 16))


def test_a_carried_global_setting_compiles_on_the_farm(stack, client_cache_dir, caplog):
    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"), inductor_config.patch(fallback_random=True):
        out = compiled(x)
    assert [m for m in _messages(caplog) if "key=" in m], "compiled on the farm"
    torch.testing.assert_close(out, model(x))


def test_export_carries_a_changed_global_setting_into_its_key(stack, tmp_path):
    model, x = _mlp().eval(), torch.randn(4, 16)
    plain = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "plain.pt2")
    with inductor_config.patch(deterministic=True):
        changed = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "changed.pt2")
    # Before sdk.export read global settings, this was the plain package again, a hit.
    assert changed.key != plain.key and not changed.cache_hit
    with torch.no_grad():
        torch.testing.assert_close(changed.load()(x), model(x), atol=1e-5, rtol=1e-5)


def test_donated_buffer_off_reaches_the_farm_and_retain_graph_gets_eagers_gradients(stack, client_cache_dir, caplog):
    """`torch._functorch.config.donated_buffer = False` is what torch's error names for a
    backward run with `retain_graph=True` (two losses of one forward). The farm dropped
    it: its backward reused the saved buffers the first backward had spent, and the
    second returned wrong gradients, silently."""
    import torch._functorch.config as functorch_config

    lin = torch.nn.Linear(8, 8)

    def f(x):
        h = lin(x).relu()
        return h.sum(), (h * h).mean()

    def step(fn, x):
        a, b = fn(x)
        a.backward(retain_graph=True)
        b.backward()
        grad = lin.weight.grad.clone()
        lin.weight.grad = None
        return grad

    x = torch.randn(4, 8)
    want = step(f, x)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="sdk"), functorch_config.patch(donated_buffer=False):
        got = step(sdk.compile(f, remote=stack.address, fallback="error"), x)
    assert [m for m in _messages(caplog) if "key=" in m], "compiled on the farm"
    torch.testing.assert_close(got, want)


def test_a_changed_aotautograd_setting_the_farm_does_not_take_compiles_locally_naming_it(stack, client_cache_dir, caplog):
    import torch._functorch.config as functorch_config

    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="local")
    with caplog.at_level(logging.INFO, logger="sdk"), functorch_config.patch(enable_activation_offloading=True):
        out = compiled(x)
    torch.testing.assert_close(out, model(x))
    said = [m for m in _messages(caplog) if "compiles locally" in m]
    assert said and "enable_activation_offloading" in said[0], _messages(caplog)


def test_export_takes_a_changed_aotautograd_setting(stack, tmp_path):
    """AOTInductor packages with Inductor's settings only: the AOTAutograd ones a
    request carries (`functorch.` names) once reached it, which refused them as unknown."""
    import torch._functorch.config as functorch_config

    model, x = _mlp().eval(), torch.randn(4, 16)
    plain = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "plain.pt2")
    with functorch_config.patch(donated_buffer=False):
        changed = sdk.export(model, (x,), remote=stack.address, path=tmp_path / "changed.pt2")
    assert changed.key != plain.key
    with torch.no_grad():
        torch.testing.assert_close(changed.load()(x), model(x), atol=1e-5, rtol=1e-5)
