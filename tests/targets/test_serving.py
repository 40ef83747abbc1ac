"""workers/serving.py: which targets and job kinds a worker takes, and its queues."""

from __future__ import annotations

import pytest

from torchfarm.wire import targets
from workers.serving import ServingError, make_plan

CPU = targets.parse("cpu:avx2")
H100 = targets.parse("cuda:sm_90")


def test_cpu_worker_with_gpu_kernel_targets():
    plan = make_plan(["local", "cuda:sm_90", "cuda:sm_80", "rocm:gfx942"], [CPU])
    assert plan.graph == (CPU,)
    assert [str(t) for t in plan.kernel] == ["cuda:sm_90", "cuda:sm_80", "rocm:gfx942"]
    assert plan.queues == ["cpu.avx2", "stages.cpu.avx2", "kernels.cuda.sm_90", "kernels.cuda.sm_80", "kernels.rocm.gfx942"]
    assert plan.registration() == {
        "cpu:avx2": ["graph"], "cuda:sm_90": ["kernel"], "cuda:sm_80": ["kernel"], "rocm:gfx942": ["kernel"],
    }


def test_gpu_worker_serves_graphs_and_kernels_of_its_own_gpu():
    plan = make_plan(["local"], [CPU, H100])
    assert plan.graph == (H100,) and plan.kernel == (H100,)
    assert plan.queues == ["cuda.sm_90", "stages.cuda.sm_90", "kernels.cuda.sm_90"]
    assert make_plan(["cuda"], [CPU, H100]).graph == (H100,)
    assert make_plan(["cpu"], [CPU, H100]).queues == ["cpu.avx2", "stages.cpu.avx2"]


def test_refusals_name_the_target():
    with pytest.raises(ServingError, match="cannot build for cpu:avx512.*ATEN_CPU_CAPABILITY"):
        make_plan(["cpu:avx512"], [CPU])
    with pytest.raises(ServingError, match="cannot build for mps"):
        make_plan(["mps"], [CPU])
    with pytest.raises(ServingError, match="no cuda device"):
        make_plan(["cuda"], [CPU])
    with pytest.raises(ServingError, match="one worker lowers graphs for one target"):
        make_plan(["cpu", "cuda"], [CPU, H100])
    with pytest.raises(ServingError, match="no target"):
        make_plan([], [CPU])


def test_lowering_without_a_gpu_is_opt_in_and_cuda_build_only():
    assert make_plan(["cuda:sm_90"], [CPU]).graph == ()
    with pytest.raises(ServingError, match="CUDA build of torch"):
        make_plan(["cuda:sm_90"], [CPU], lower_without_gpu=True)
    plan = make_plan(["cuda:sm_90"], [CPU], lower_without_gpu=True, cuda_build=True)
    assert plan.graph == (H100,) and plan.fake_gpu == H100
    assert plan.queues == ["cuda.sm_90", "stages.cuda.sm_90", "kernels.cuda.sm_90"]
