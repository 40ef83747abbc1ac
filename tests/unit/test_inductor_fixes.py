"""The Inductor fixes the workers carry (workers/inductor_fixes.py): each bug's graph,
compiled without the fix and with it, against eager.

Each compile runs in a fresh process with an Inductor cache of its own, so neither sees
the other's kernels, and with four threads: the bug needs a parallel kernel."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from torchfarm.fx.internals import torch_minor
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from workers import inductor_fixes

pytestmark = pytest.mark.timeout(300)

MULTI_QUERY_GRADIENT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(4)
    if sys.argv[1] == "fixed":
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


def _gradient_error(tmp_path, variant: str) -> tuple[int, dict | None, str]:
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / variant), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", MULTI_QUERY_GRADIENT, variant],
        env=env, capture_output=True, text=True, timeout=240, cwd=str(_repo()),
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, (json.loads(lines[-1]) if lines else None), run.stderr[-2000:]


def _repo():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[2]


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


def test_apply_names_what_it_fixed_once():
    applied = inductor_fixes.apply()
    assert applied == inductor_fixes.apply()
    assert set(applied) <= set(keys.INDUCTOR_FIXES)
    store = torch._inductor.codegen.cpp.CppTile2DKernel.store
    assert ("pytorch/pytorch#191837" in applied) == hasattr(store, "__wrapped__")


def test_the_key_names_every_fix_the_workers_carry():
    assert tuple(fix.name for fix in inductor_fixes.FIXES) == keys.INDUCTOR_FIXES


def test_the_fixes_are_in_the_key(monkeypatch):
    request = farm_pb2.CompileRequest()
    request.target.device = "cpu"
    with_fixes = keys.compute_key(request)
    monkeypatch.setattr(keys, "INDUCTOR_FIXES", ())
    assert keys.compute_key(request) != with_fixes
