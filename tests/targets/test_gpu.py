"""On a machine with a CUDA GPU and a CUDA build of torch only (skipped elsewhere by the
`gpu` marker hook in tests/conftest.py). scripts/gpu_check.sh runs these and the GPT
training check.

The workers start as shipped: Celery's prefork pool, warm-up on, the default sandbox
("auto"; the suite's conftest turns it off for CPU stacks, so it is set back here)."""

from __future__ import annotations

import copy

import pytest
import torch

import sdk
from localfarm.stack import LocalStack
from tests.targets.cubin_launch import KERNELS, launch_cubin, load_kernel_module
from torchfarm.fx.fingerprint import local_fingerprint, local_target
from torchfarm.kernels import elf

pytestmark = [pytest.mark.gpu, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SHIPPED = {"TORCHFARM_SANDBOX": "auto"}
START_S = 180
"""Seconds a stack may take to be ready: a GPU worker registers after its GPU check (a
CUDA context, Triton's launcher, one compile; workers/gpu_probe.py)."""


def _stack(workdir, env):
    stack = LocalStack(workers=1, workdir=workdir, extra_env=env)
    stack.start(timeout_s=START_S)
    try:
        yield stack
    finally:
        stack.stop()


def test_local_cuda_target_is_the_device_capability():
    major, minor = torch.cuda.get_device_capability(0)
    t = local_target("cuda")
    if torch.version.hip:
        assert t.device == "rocm" and t.arch.startswith("gfx")
    else:
        assert str(t) == f"cuda:sm_{major}{minor}"
    fp = local_fingerprint("cuda")
    assert (fp.device, fp.arch) == (t.device, t.arch)


@pytest.fixture(scope="module")
def cuda_stack(tmp_path_factory):
    yield from _stack(tmp_path_factory.mktemp("cuda"), {**SHIPPED, "TORCHFARM_TARGETS": "local"})


def test_the_gpu_worker_registered_after_its_gpu_path_ran(cuda_stack):
    (record,) = cuda_stack.store().live_workers().values()
    target = str(local_target("cuda"))
    assert record["targets"] == {target: ["graph", "kernel"]}
    log = (cuda_stack.root / "worker0.log").read_text(errors="replace")
    assert f"the GPU path runs for {target}" in log, log[-3000:]


def test_cuda_graph_through_the_farm_matches_eager(cuda_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "client"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(32, 64, device="cuda")
    eager = copy.deepcopy(model)
    compiled = sdk.compile(model, remote=cuda_stack.address, fallback="error")
    loss = compiled(x).pow(2).mean()
    loss.backward()
    ref = eager(x).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-3, rtol=1e-3)


@pytest.fixture(scope="module")
def cpu_only_kernel_stack(tmp_path_factory):
    """A worker that sees no GPU (CUDA_VISIBLE_DEVICES empty) and builds Triton kernels
    for this GPU's exact target, as a CPU-only worker of the fleet does."""
    env = {**SHIPPED, "TORCHFARM_TARGETS": str(local_target("cuda")), "CUDA_VISIBLE_DEVICES": ""}
    yield from _stack(tmp_path_factory.mktemp("cpu-only"), env)


def test_a_kernel_a_cpu_only_worker_built_runs_here_as_the_one_built_here(cpu_only_kernel_stack):
    if torch.version.hip:
        pytest.skip("the launcher loads cubins (CUDA's driver API); ROCm's hsaco is not loaded here")
    target = local_target("cuda")
    (record,) = cpu_only_kernel_stack.store().live_workers().values()
    assert record["targets"] == {str(target): ["kernel"]}  # it has no GPU of its own
    k = sdk.compile_kernel(
        (KERNELS / "add_kernel.py").read_text(), "add_kernel", target=str(target), signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 1024}, remote=cpu_only_kernel_stack.address,
    )
    assert elf.inspect_binary(k.binary).arch == target.arch
    n = 5000
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    from_farm, built_here = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    grid = (n + 1023) // 1024
    launch_cubin(k.binary, k.metadata, grid, [x, y, from_farm, n])
    load_kernel_module("add_kernel").add_kernel[(grid,)](x, y, built_here, n, BLOCK=1024)
    torch.cuda.synchronize()
    torch.testing.assert_close(from_farm, built_here, rtol=0, atol=0)
    torch.testing.assert_close(from_farm, x + y, rtol=0, atol=0)
