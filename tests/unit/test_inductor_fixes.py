"""The Inductor fixes the workers carry (workers/inductor_fixes.py): each bug's graph,
compiled without the fix and with it, against eager.

Each compile runs in a fresh process with an Inductor cache of its own, so neither sees
the other's kernels, and with four threads: the bug needs a parallel kernel."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import sympy
import torch

from tests.conftest import run_python
from torchfarm.fx.internals import torch_minor
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from workers import inductor_fixes

pytestmark = pytest.mark.timeout(300)

MULTI_QUERY_GRADIENT = textwrap.dedent("""
    import json, torch
    torch.set_num_threads(4)
    if ARG == "fixed":
        from workers import inductor_fixes
        inductor_fixes.apply()
    B, S, H, D = 2, 8, 4, 16

    def attention_scores(fused):
        # Falcon's multi-query split: one key head, by an advanced index, broadcast over H.
        key = fused.view(B, S, H + 1, D)[..., [-1], :].transpose(1, 2)
        return ((torch.ones(B, H, S, D) @ key.transpose(-1, -2)) ** 2).sum()

    x = torch.randn(B, S, (H + 1) * D, generator=torch.Generator().manual_seed(0), requires_grad=True)
    eager, = torch.autograd.grad(attention_scores(x), x)
    compiled, = torch.autograd.grad(torch.compile(attention_scores)(x), x)
    print(json.dumps({"error": (eager - compiled).abs().max().item(), "size": eager.abs().max().item()}))
""")


def _run(script: str, arg: str, cache: Path) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter, its `ARG` set to `arg`, with Inductor's cache at `cache`."""
    return run_python(f"ARG = {arg!r}\n{script}", {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, timeout=240)


def _gradient_error(tmp_path, variant: str, cache: str = "") -> tuple[int, dict | None, str]:
    run = _run(MULTI_QUERY_GRADIENT, variant, tmp_path / (cache or variant))
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, (json.loads(lines[-1]) if lines else None), run.stderr[-2000:]


needed = pytest.mark.skipif(
    not inductor_fixes._tile2d_atomic_add_needed(), reason="this torch has upstream's fix"
)
compiles = pytest.mark.skipif(
    torch_minor() < (2, 13),
    reason="before 2.13 Inductor fails to compile the graph: it transposes a tile at an index it computes in the loop",
)


@needed
@compiles
def test_without_the_fix_a_multi_query_gradient_is_wrong_or_crashes(tmp_path):
    rc, result, stderr = _gradient_error(tmp_path, "unfixed")
    assert rc != 0 or result["error"] > 1e-2 * result["size"], (rc, result, stderr)


@compiles
def test_with_the_fix_a_multi_query_gradient_matches_eager(tmp_path):
    rc, result, stderr = _gradient_error(tmp_path, "fixed")
    assert rc == 0, stderr
    assert result["error"] <= 1e-4 * max(result["size"], 1.0), result


RELATIVE_SHIFT_GRADIENTS = textwrap.dedent("""
    import json, torch
    from workers import inductor_fixes
    inductor_fixes.MAX_ANALYZED_OPS = int(ARG)
    inductor_fixes.apply()

    def relative_shift(scores, weight):
        # Funnel's relative-position shift: views through a reshape and a slice.
        b, h, q, k = scores.shape
        shifted = scores.reshape(b, h, k, q)[:, :, 1:, :].reshape(b, h, q, k - 1)[..., : q // 2]
        return (shifted * weight).softmax(-1).transpose(1, 2).reshape(b, q, -1) @ torch.ones(h * (q // 2), 3)

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 4, 12, 12, generator=g, requires_grad=True)
    weight = torch.randn(6, generator=g, requires_grad=True)
    eager = torch.autograd.grad(relative_shift(scores, weight).square().sum(), (scores, weight))
    compiled = torch.autograd.grad(torch.compile(relative_shift)(scores, weight).square().sum(), (scores, weight))
    print(json.dumps({"error": max((a - b).abs().max().item() for a, b in zip(eager, compiled))}))
""")


@pytest.mark.skipif(not inductor_fixes._index_analysis_needed(), reason="this torch has upstream's fix")
def test_with_every_index_past_the_bound_a_compile_still_matches_eager(tmp_path):
    """A bound of 0 sends every access of the compile down the unsimplified path: what an
    index over the real bound gets. The kernels take their general paths and stay right."""
    for bound in ("0", "200"):
        run = _run(RELATIVE_SHIFT_GRADIENTS, bound, tmp_path / bound)
        assert run.returncode == 0, run.stderr[-2000:]
        assert json.loads(run.stdout.splitlines()[-1])["error"] <= 1e-5, (bound, run.stdout)


SCATTERED_TWICE_GRADIENTS = textwrap.dedent("""
    import json, torch
    import torch.nn.functional as F
    if ARG == "fixed":
        from workers import inductor_fixes
        inductor_fixes.apply()
    g = torch.Generator().manual_seed(0)
    x, grid = torch.randn(2, 2, 8, 8, generator=g), torch.rand(2, 8, 8, 2, generator=g) * 2 - 1
    params = [torch.randn(*s, generator=g).mul(0.3).requires_grad_() for s in ((2, 2, 3, 3), (2,), (2, 2, 2, 2), (2,))]

    def loss(weight, bias, up_weight, up_bias):
        # A convolution's output upsampled and sampled: both backwards scatter into zeros.
        features = F.conv2d(x, weight, bias, padding=1)
        resized = F.interpolate(features, scale_factor=2, mode="bilinear", align_corners=False)
        target = F.conv_transpose2d(x, up_weight, up_bias, stride=2)
        return (resized - target).pow(2).mean() + F.grid_sample(features, grid, align_corners=False).sum()

    eager = torch.autograd.grad(loss(*params), params)
    compiled = torch.autograd.grad(torch.compile(loss)(*params), params)
    print(json.dumps({
        "error": max((a - b).abs().max().item() for a, b in zip(eager, compiled)),
        "size": max(a.abs().max().item() for a in eager),
    }))
""")

renames_needed = pytest.mark.skipif(
    not inductor_fixes._recompute_renames_needed(), reason="this torch has upstream's fix"
)


def _scattered_twice_error(tmp_path, variant: str) -> dict:
    run = _run(SCATTERED_TWICE_GRADIENTS, variant, tmp_path / variant)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


@renames_needed
@pytest.mark.skipif(torch_minor() < (2, 13), reason="2.12 has the code but compiles this graph right")
def test_without_the_fix_a_gradient_scattered_twice_is_wrong(tmp_path):
    result = _scattered_twice_error(tmp_path, "unfixed")
    assert result["error"] > 1e-3 * result["size"], result


def test_with_the_fix_a_gradient_scattered_twice_matches_eager(tmp_path):
    result = _scattered_twice_error(tmp_path, "fixed")
    assert result["error"] <= 1e-5 * max(result["size"], 1.0), result


def _deep_index(depth: int):
    """An index as a chain of views through reshapes gives: nested modular indexing."""
    from torch._inductor.utils import sympy_index_symbol
    from torch.utils._sympy.functions import ModularIndexing

    d0, d1, d2, d3 = (sympy_index_symbol(f"d{i}") for i in range(4))
    index = 56 * d0 + 224 * d1 + 4 * d2 + d3 - 8
    for _ in range(depth):
        index = ModularIndexing(index, 1, 14) + 14 * ModularIndexing(index, 14, 4) + 4 * ModularIndexing(index + 3, 4, 7)
    return index, d1


@pytest.mark.skipif(not inductor_fixes._index_analysis_needed(), reason="this torch has upstream's fix")
def test_past_the_bound_the_index_analysis_does_not_simplify():
    """Unbounded, this index (five views deep, 1,558 operations) took 72 s to analyze on
    the development machine; one of Funnel's (1,254 operations) had not returned after
    several minutes."""
    inductor_fixes.apply()
    sizevars = inductor_fixes.analysis_module()
    deep, var = _deep_index(5)
    assert deep.count_ops() > inductor_fixes.MAX_ANALYZED_OPS
    assert sizevars.simplify_index_in_vec_range(deep, var, 16) is deep
    stride = sizevars.stride_at_vec_range(deep, var, 16)
    assert not stride.is_number  # the general path
    assert sizevars.stride_at(deep, var) == sizevars.sympy_subs(deep, {var: var + 1}) - deep
    shallow, var = _deep_index(1)
    assert shallow.count_ops() <= inductor_fixes.MAX_ANALYZED_OPS
    assert sizevars.stride_at(shallow, var) == sympy.simplify(sizevars.sympy_subs(shallow, {var: var + 1}) - shallow)


@needed
@compiles
def test_a_cache_filled_before_the_fix_is_not_loaded_after_it(tmp_path):
    """One Inductor cache, as a long-lived worker keeps: the unfixed compile fills it, and
    the fixed process must compile again, not load the unfixed kernel."""
    _gradient_error(tmp_path, "unfixed", cache="shared")
    rc, result, stderr = _gradient_error(tmp_path, "fixed", cache="shared")
    assert rc == 0, stderr
    assert result["error"] <= 1e-4 * max(result["size"], 1.0), result


def test_apply_names_what_it_fixed_once():
    applied = inductor_fixes.apply()
    assert applied == inductor_fixes.apply()
    assert set(applied) <= set(keys.INDUCTOR_FIXES)
    store = torch._inductor.codegen.cpp.CppTile2DKernel.store
    assert ("pytorch/pytorch#191837" in applied) == hasattr(store, "__wrapped__")
    recompute = torch._inductor.scheduler.SchedulerNode.recompute_size_and_body
    assert ("pytorch/pytorch#185509" in applied) == hasattr(recompute, "__wrapped__")


def test_the_key_names_every_fix_the_workers_carry():
    assert tuple(fix.name for fix in inductor_fixes.FIXES) == keys.INDUCTOR_FIXES


def test_the_fixes_are_in_the_key(monkeypatch):
    request = farm_pb2.CompileRequest()
    request.target.device = "cpu"
    with_fixes = keys.compute_key(request)
    monkeypatch.setattr(keys, "INDUCTOR_FIXES", ())
    assert keys.compute_key(request) != with_fixes
