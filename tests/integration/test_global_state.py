"""The state a graph is captured under travels with it: grad mode, autocast, the
thread count; and the default dtype holds.

Dynamo guards on all of them and leaves them out of the graph; the local backend's
AOTAutograd and Inductor then trace and generate code under them. A farm worker that
compiled under its own state would give an inference call a training graph, an autocast
call float32 kernels, and a CPU graph kernels sized for the worker's thread count.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch

import sdk
from tests.conftest import run_python

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def _farm_keys(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdk.backend" and "key=" in r.getMessage()]


def test_autocast_around_the_call_casts_as_eager_does(stack, client_cache_dir, caplog):
    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"), torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        ref = model(x)
    assert _farm_keys(caplog), "compiled on the farm"
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters())


class _FloatIsland(torch.nn.Module):
    """Part of the forward kept in float32 under autocast, as rotary embeddings keep
    their angles: `torch.autocast(..., enabled=False)` inside the compiled code."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        with torch.autocast("cpu", enabled=False):
            angles = h.float().cos()
        return self.b(h * angles.to(h.dtype))


def test_autocast_inside_the_compiled_code_compiles_on_the_farm(stack, client_cache_dir, caplog):
    model, eager, x = _FloatIsland(), _FloatIsland(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"), torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        ref = eager(x)
    assert _farm_keys(caplog), "compiled on the farm"
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    out.float().square().sum().backward()
    ref.float().square().sum().backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, atol=5e-2, rtol=5e-2)


def test_no_grad_gets_an_inference_graph_and_grad_a_training_one(stack, client_cache_dir, caplog):
    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        out = compiled(x)
    keys = _farm_keys(caplog)
    assert len(keys) == 2 and ": miss" in keys[1], keys  # grad mode is in the key
    assert out.requires_grad
    out.sum().backward()
    eager = _mlp()
    eager(x).sum().backward()
    for p, r in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, r.grad, atol=1e-4, rtol=1e-4)


def test_inference_mode_compiles_on_the_farm_and_matches_eager(stack, client_cache_dir, caplog):
    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"), torch.inference_mode():
        out = compiled(x)
        ref = model(x)
    assert _farm_keys(caplog), "compiled on the farm"
    assert out.is_inference() and not out.requires_grad
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _kernel_sources(store, short_key: str) -> list[str]:
    (name,) = [k.decode() for k in store.r.scan_iter(match=f"tf:artifact:{short_key}*")]
    manifest = store.get_manifest(name.removeprefix("tf:artifact:"))
    return [json.loads(store.get_blob(k.source.digest))["args"]["main_code"] for k in manifest.kernels]


@pytest.fixture
def more_threads():
    """This process's intra-op thread count raised past the worker's."""
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    yield before + 1
    torch.set_num_threads(before)


def test_cpu_kernels_use_the_callers_thread_count(stack, client_cache_dir, caplog, more_threads):
    """Inductor writes the thread count into each parallel C++ kernel (`#pragma omp
    parallel num_threads(N)`): the caller's, as a local compile would, not the worker's."""
    torch._dynamo.reset()
    compiled = sdk.compile(lambda x: (x.sin() * 2).relu(), remote=stack.address, fallback="error")
    x = torch.randn(512, 1024)
    with caplog.at_level(logging.INFO, logger="sdk"):
        torch.testing.assert_close(compiled(x), (x.sin() * 2).relu())
    (line,) = _farm_keys(caplog)
    sources = _kernel_sources(stack.store(), re.search(r"key=(\w+)", line).group(1))
    pragmas = {int(n) for src in sources for n in re.findall(r"omp parallel num_threads\((\d+)\)", src)}
    assert pragmas == {more_threads}, pragmas


def test_the_default_dtype_is_the_callers(stack, client_cache_dir, caplog):
    """A factory call with no dtype (`torch.full`, `torch.ones`) makes the default dtype."""

    def fn(x):
        mask = torch.full((x.shape[0], x.shape[0]), float("-inf")).triu(1)
        return (x @ x.T + mask).softmax(-1) + torch.ones(x.shape[0], 1)

    torch._dynamo.reset()
    compiled = sdk.compile(fn, remote=stack.address, fallback="error")
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.randn(6, 4)
        with caplog.at_level(logging.INFO, logger="sdk"):
            out = compiled(x)
        ref = fn(x)
    finally:
        torch.set_default_dtype(before)
    assert _farm_keys(caplog), "compiled on the farm"
    assert out.dtype == ref.dtype == torch.float64
    torch.testing.assert_close(out, ref)


MANY_THREADS = """
import sys, torch, sdk
torch.set_num_threads(16)
fn = lambda x: (x.sum(), x.amax())
compiled = sdk.compile(fn, remote=sys.argv[1], fallback="error")
x = torch.randn(1 << 22)
got, want = compiled(x), fn(x)
torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
print("ok")
"""


def test_a_client_with_more_threads_than_the_worker_runs_its_reductions(stack, client_cache_dir):
    """A reduction's per-thread buffers hold as many slots as threads it was compiled for,
    and its team is as large as the caller's when that count is the machine's: compiled
    for a 2-thread worker, it wrote past its buffers on a 16-thread client (SIGSEGV)."""
    proc = run_python(f"import sys; sys.argv = ['x', {stack.address!r}]\n" + MANY_THREADS,
                      {"TORCHINDUCTOR_CACHE_DIR": str(client_cache_dir)})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.returncode, proc.stderr[-2000:])


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


class _MathAttention(_Attention):
    """`_Attention` that picks the math kernel itself, inside the compiled code."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return super().forward(x)


def _wrapper_code(cache_dir) -> str:
    return "".join(p.read_text() for p in cache_dir.rglob("*.py"))


@pytest.mark.parametrize(("backends", "inside"), [(None, False), (["MATH"], False), (["MATH"], True)],
                         ids=["default", "around", "inside"])
def test_sdpa_backends_around_the_call_pick_the_kernel_a_local_compile_picks(
    stack, tmp_path, monkeypatch, caplog, backends, inside
):
    """`sdpa_kernel([SDPBackend.MATH])` around the call, or inside the compiled code:
    the decomposition the worker traces takes the math path (matmuls and a softmax), as
    a local torch.compile does, where the default takes CPU flash attention; the
    backends around the call are in the key, and those inside are in the graph."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    x = torch.randn(2, 8, 16)
    code = {}
    for where in ("local", "farm"):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / where))
        model = _MathAttention() if inside else _Attention()
        torch._dynamo.reset()
        compiled = torch.compile(model) if where == "local" else sdk.compile(
            model, remote=stack.address, fallback="error")
        caplog.clear()
        around = nullcontext()
        if backends and not inside:
            around = sdpa_kernel([getattr(SDPBackend, b) for b in backends])
        with caplog.at_level(logging.INFO, logger="sdk"), around:
            out = compiled(x)
            out.backward()
            reference = _Attention()
            expected = reference(x)
            expected.backward()
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model.qkv.weight.grad, reference.qkv.weight.grad, atol=1e-5, rtol=1e-5)
        code[where] = _wrapper_code(tmp_path / where)
        if where == "farm":
            assert _farm_keys(caplog), "compiled on the farm"
    flash = "_scaled_dot_product_flash_attention_for_cpu"
    assert (flash in code["farm"]) == (flash in code["local"]) == (backends is None)


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for the test, put back after."""
    prior = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(prior[0], warn_only=prior[1])


def test_deterministic_algorithms_around_the_call_train_on_the_farm(stack, client_cache_dir, caplog, deterministic):
    """AOTAutograd's compiled backward refuses to run under another
    `use_deterministic_algorithms` than it was compiled under: a worker that compiled
    under its own (off) gave every such client a backward that raised."""
    model, x = _mlp(), torch.randn(4, 16)
    eager = _mlp()
    eager(x).pow(2).sum().backward()
    torch._dynamo.reset()
    compiled = sdk.compile(model, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"):
        loss = compiled(x).pow(2).sum()
    assert _farm_keys(caplog), "compiled on the farm"
    loss.backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)
