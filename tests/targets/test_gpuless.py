"""Experimental: Inductor lowering for cuda:sm_90 on this GPU-less machine (workers/gpuless.py).

Needs a CUDA build of torch, which the project's environment does not have (it pins the
CPU build); point TORCHFARM_CUDA_PYTHON at an interpreter that has one, e.g. a venv made
with `pip install torch==2.14.1` (docs/targets.md). Skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from torchfarm.kernels import elf

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = [os.environ.get("TORCHFARM_CUDA_PYTHON", "")]

SCRIPT = r"""
import glob, json, os, sys
import torch
from torchfarm.wire import targets
from workers import gpuless

gpuless.install(targets.parse("cuda:sm_90"))
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

fake = FakeTensorMode(shape_env=ShapeEnv())
with fake:
    x = torch.empty(64, 64, device="cuda")

def f(a):
    return torch.sum(torch.relu(a) * 2, 1)

gm = torch.fx.symbolic_trace(f)
FakeTensorProp(gm, fake).propagate(x)
for node in gm.graph.nodes:  # as torchfarm/fx/decode.py does
    if "val" in node.meta:
        node.meta["example_value"] = node.meta["val"]
art = torch._inductor.standalone_compile(gm, [x], dynamic_shapes="from_example_inputs", aot=True, fake_mode=fake)
data = art.serialize()
cubins = sorted(glob.glob(os.environ["TRITON_CACHE_DIR"] + "/**/*.cubin", recursive=True))
print(json.dumps({"torch": torch.__version__, "artifact_bytes": len(data),
                  "elf_in_artifact": data.count(b"\x7fELF"), "cubins": cubins}))
"""


def _cuda_python() -> str:
    for python in CANDIDATES:
        if python and Path(python).exists():
            probe = subprocess.run(
                [python, "-c", "import torch, triton; print(torch.version.cuda or '')"],
                capture_output=True, text=True, timeout=120,
            )
            if probe.returncode == 0 and probe.stdout.strip():
                return python
    pytest.skip("no interpreter with a CUDA build of torch (set TORCHFARM_CUDA_PYTHON)")


def test_lowering_for_sm_90_without_a_gpu_makes_sm_90_cubins(tmp_path):
    python = _cuda_python()
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
    }
    p = subprocess.run([python, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["artifact_bytes"] > 0
    assert report["cubins"], "Triton compiled no kernel"
    for path in report["cubins"]:
        assert elf.check_binary(Path(path).read_bytes(), "cuda", "sm_90").arch == "sm_90"
    # The serialized artifact bundles the cubins (Inductor's Triton bundler).
    assert report["elf_in_artifact"] == len(report["cubins"])
