"""`sdk.compile` behaves as `torch.compile`, with a real stack (redis-server, coordinator,
Celery worker): the arguments, the forms (module, function, decorator), several models
in one process, and `torch.compiler.reset()`.

Numerics against eager: outputs and losses within 1e-5 (absolute and relative),
gradients within 1e-4, as in test_end_to_end.py. Graph counts are compared with a plain
`torch.compile` of the same code in the same process.
"""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
from torch._dynamo.utils import counters

import sdk
from examples.models import make_cnn, make_mlp
from torchfarm.fx.hooks import count_kernel_builds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

KEY = re.compile(r"key=([0-9a-f]{12})")


def _farm_lines(caplog) -> list[str]:
    """The backend's one line per graph served by the farm (and any fallback warning)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sdk.backend" and (KEY.search(r.getMessage()) or r.levelno >= logging.WARNING)
    ]


def _keys(lines: list[str]) -> list[str]:
    return [KEY.search(line).group(1) for line in lines]


def _assert_all_on_farm(lines: list[str]) -> None:
    assert lines and all(("miss" in l or " hit " in l or "joined" in l) for l in lines), lines


def _train_vs_eager(compiled, model, eager, inputs):
    out = compiled(*inputs)
    loss = out.pow(2).mean()
    loss.backward()
    ref = eager(*inputs)
    ref_loss = ref.pow(2).mean()
    ref_loss.backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters(), strict=False):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


def _fn(x, y):
    return torch.tanh(x) * y + x.cos()


def test_function_module_and_decorator_forms(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    torch.testing.assert_close(
        sdk.compile(_fn, remote=stack.address, fallback="error")(x, y), _fn(x, y), atol=1e-5, rtol=1e-5
    )

    @sdk.compile(remote=stack.address, fallback="error")
    def decorated(a):
        return torch.sigmoid(a) @ a.t()

    torch.testing.assert_close(decorated(x), torch.sigmoid(x) @ x.t(), atol=1e-5, rtol=1e-5)

    model, inputs = make_mlp(batch=4)
    eager = copy.deepcopy(model)
    _train_vs_eager(sdk.compile(model, remote=stack.address, fallback="error"), model, eager, inputs)
    lines = _farm_lines(caplog)
    _assert_all_on_farm(lines)
    assert len(lines) == 3 and len(set(_keys(lines))) == 3, lines


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mode": "default"},
        {"mode": "reduce-overhead"},
        {"mode": "max-autotune-no-cudagraphs"},
        {"mode": "max-autotune"},
        {"mode": "lite"},
        {"options": {"epilogue_fusion": False, "max_autotune": False}},
    ],
    ids=lambda k: k.get("mode") or ("options" if k else "no-mode"),
)
def test_modes_and_options_compile_on_the_farm(kwargs, stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    model, inputs = make_mlp(batch=4)
    eager = copy.deepcopy(model)
    compiled = sdk.compile(model, remote=stack.address, fallback="error", **kwargs)
    _train_vs_eager(compiled, model, eager, inputs)
    _assert_all_on_farm(_farm_lines(caplog))


def test_modes_and_options_have_their_own_keys():
    """Requests only: each compile setting names another artifact (mode "default" and
    no mode are the same compile, as in torch.compile)."""
    from sdk.backend import FarmBackend, build_request
    from sdk.settings import SDKSettings
    from torchfarm.fx.encode import encode_graph
    from torchfarm.fx.fingerprint import local_fingerprint
    from torchfarm.wire import keys

    graphs = []
    torch._dynamo.reset()
    torch.compile(_fn, backend=lambda gm, ex: graphs.append(encode_graph(gm, ex)) or gm.forward)(
        torch.randn(3), torch.randn(3)
    )
    fp = local_fingerprint("cpu")

    def key(**kw):
        backend = FarmBackend(SDKSettings(), **kw)
        return keys.compute_key(build_request(graphs[0], fp, backend.mode, backend.local.config, ""))

    variants = [
        key(),
        key(mode="reduce-overhead"),
        key(mode="max-autotune"),
        key(mode="max-autotune-no-cudagraphs"),
        key(mode="lite"),
        key(options={"epilogue_fusion": False}),
    ]
    assert len(set(variants)) == len(variants)
    assert key(mode="default") == key()


def test_fullgraph(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")

    def broken(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y + 1

    torch._dynamo.reset()
    x = torch.randn(8)
    # As torch.compile: a graph break under fullgraph=True is an error, before any compile.
    with pytest.raises(torch._dynamo.exc.Unsupported):
        sdk.compile(broken, remote=stack.address, fallback="error", fullgraph=True)(x)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(broken, fullgraph=True)(x)
    torch._dynamo.reset()
    out = sdk.compile(_fn, remote=stack.address, fallback="error", fullgraph=True)(x, x)
    torch.testing.assert_close(out, _fn(x, x), atol=1e-5, rtol=1e-5)
    lines = _farm_lines(caplog)
    _assert_all_on_farm(lines)
    assert len(lines) == 1, lines


def _count_graphs(compiled, calls) -> tuple[int, list]:
    torch._dynamo.reset()
    counters.clear()
    outs = [compiled(*args) for args in calls]
    return counters["stats"]["unique_graphs"], outs


@pytest.mark.parametrize("dynamic", [False, True, None], ids=lambda d: f"dynamic={d}")
def test_dynamic_argument_recompiles_as_torch_compile(dynamic, stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    calls = [(torch.randn(n, 3), torch.randn(n, 3)) for n in (4, 8, 12)]
    local, _ = _count_graphs(torch.compile(_fn, dynamic=dynamic), calls)
    farm, outs = _count_graphs(
        sdk.compile(_fn, remote=stack.address, fallback="error", dynamic=dynamic), calls
    )
    torch._dynamo.reset()
    # False: one static graph per size; True: one symbolic graph; None: static, then one
    # symbolic graph for the rest (automatic dynamic).
    assert local == {False: 3, True: 1, None: 2}[dynamic]
    assert farm == local
    for out, args in zip(outs, calls, strict=False):
        torch.testing.assert_close(out, _fn(*args), atol=1e-5, rtol=1e-5)
    lines = _farm_lines(caplog)
    _assert_all_on_farm(lines)
    assert len(lines) == farm, lines


def test_several_models_get_their_own_artifacts(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    runs = []
    for make in (make_mlp, make_cnn):
        model, inputs = make()
        eager = copy.deepcopy(model)
        runs.append((sdk.compile(model, remote=stack.address, fallback="error"), model, eager, inputs))
    for compiled, model, eager, inputs in runs:  # interleaved: both compiled before either runs
        _train_vs_eager(compiled, model, eager, inputs)
    lines = _farm_lines(caplog)
    _assert_all_on_farm(lines)
    assert len(lines) == 2 and len(set(_keys(lines))) == 2, lines
    assert "MLP" in lines[0] and "SmallCNN" in lines[1], lines


def test_compiler_reset_recaptures_and_is_served_by_the_farm(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    model, inputs = make_mlp(batch=4)
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    first = compiled(*inputs)
    torch.compiler.reset()  # drops Dynamo's caches: the next call must capture again
    counters.clear()
    with count_kernel_builds() as builds:
        second = compiled(*inputs)
    assert counters["stats"]["unique_graphs"] == 1  # captured again
    assert builds.count == 0  # and nothing compiled here
    torch.testing.assert_close(second, first, atol=0, rtol=0)
    torch.testing.assert_close(second, model(*inputs), atol=1e-5, rtol=1e-5)
    lines = _farm_lines(caplog)
    _assert_all_on_farm(lines)
    assert len(lines) == 2 and " hit " in lines[1], lines
    assert _keys(lines)[0] == _keys(lines)[1]


def _multi_query_scores(fused):
    """Falcon's multi-query split: one key head taken by an advanced index and broadcast
    over four query heads. Torch 2.13's Inductor wrote its gradient out of bounds
    (workers/inductor_fixes.py)."""
    key = fused.view(2, 8, 5, 16)[..., [-1], :].transpose(1, 2)
    return ((torch.ones(2, 4, 8, 16) @ key.transpose(-1, -2)) ** 2).sum()


def test_a_multi_query_gradient_from_the_farm_matches_eager(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    x = torch.randn(2, 8, 80, requires_grad=True)
    eager, = torch.autograd.grad(_multi_query_scores(x), x)
    compiled, = torch.autograd.grad(sdk.compile(_multi_query_scores, remote=stack.address, fallback="error")(x), x)
    _assert_all_on_farm(_farm_lines(caplog))
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
