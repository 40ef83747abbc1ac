"""Target descriptors, queue naming and the routing table: torch-free and server-free."""

from __future__ import annotations

import pytest

from torchfarm.v1 import farm_pb2
from torchfarm.wire import routing, targets
from torchfarm.wire.targets import TargetError


@pytest.mark.parametrize(
    "text, device, detail",
    [
        ("cpu", "cpu", ""),
        ("cpu:avx512", "cpu", "avx512"),
        ("cpu:AVX2", "cpu", "avx2"),
        ("cuda:sm_90", "cuda", "sm_90"),
        ("cuda:sm_90a", "cuda", "sm_90a"),
        ("cuda:sm_120", "cuda", "sm_120"),
        ("rocm:gfx942", "rocm", "gfx942"),
        ("rocm:gfx90a:sramecc+:xnack-", "rocm", "gfx90a"),
        ("rocm:gfx1100", "rocm", "gfx1100"),
        ("mps", "mps", ""),
        ("xpu:intel-data-center-gpu-max-1550", "xpu", "intel-data-center-gpu-max-1550"),
    ],
)
def test_parse_and_format_round_trip(text, device, detail):
    t = targets.parse(text)
    assert (t.device, t.detail) == (device, detail)
    assert targets.parse(str(t)) == t
    assert str(t) == (f"{device}:{detail}" if detail else device)


@pytest.mark.parametrize(
    "text, message",
    [
        ("tpu:v5", "unknown device 'tpu'"),
        ("cuda:90", "not a valid sm_XY"),
        ("cuda:sm_9", "not a valid sm_XY"),
        ("rocm:sm_90", "not a valid gfx"),
        ("mps:m3", "mps takes no architecture"),
        ("cpu:AVX 512!", "not a valid ISA"),
        ("xpu:" + "a" * 80, "not a valid device name"),
    ],
)
def test_invalid_targets_are_refused_with_the_reason(text, message):
    with pytest.raises(TargetError, match=message):
        targets.parse(text)


def test_exactness_and_device_facts():
    assert not targets.parse("cpu").exact and not targets.parse("cuda").exact
    assert targets.parse("mps").exact and targets.parse("cpu:avx2").exact
    with pytest.raises(TargetError, match="not exact.*cpu:avx512"):
        targets.require_exact(targets.parse("cpu"))
    assert targets.parse("rocm:gfx942").torch_device == "cuda"
    assert targets.cuda_capability(targets.parse("cuda:sm_90a")) == 90
    assert targets.warp_size(targets.parse("rocm:gfx942")) == 64
    assert targets.warp_size(targets.parse("rocm:gfx1100")) == 32
    assert targets.warp_size(targets.parse("cuda:sm_80")) == 32
    assert targets.normalize_isa("Z VECTOR") == "zvector"
    assert targets.normalize_xpu_name("Intel(R) Data Center GPU Max 1550") == "intel-r-data-center-gpu-max-1550"


def _msg(text: str) -> farm_pb2.Target:
    t = targets.parse(text)
    return farm_pb2.Target(device=t.device, arch=t.arch, isa=t.isa, compiler="g++ 12")


@pytest.mark.parametrize(
    "target, kind, queue",
    [
        ("cpu:avx512", routing.GRAPH, "cpu.avx512"),
        ("cpu:avx2", routing.GRAPH, "cpu.avx2"),
        ("cuda:sm_90", routing.GRAPH, "cuda.sm_90"),
        ("cuda:sm_80", routing.GRAPH, "cuda.sm_80"),
        ("rocm:gfx942", routing.GRAPH, "rocm.gfx942"),
        ("mps", routing.GRAPH, "mps"),
        ("xpu:arc-a770", routing.GRAPH, "xpu.arc-a770"),
        ("cuda:sm_90", routing.KERNEL, "kernels.cuda.sm_90"),
        ("rocm:gfx942", routing.KERNEL, "kernels.rocm.gfx942"),
    ],
)
def test_routing_table(target, kind, queue):
    assert routing.queue_for(_msg(target), kind) == queue
    assert str(routing.target_of_queue(queue)) == target
    assert routing.job_kind_of_queue(queue) == kind


def test_routing_refuses_inexact_and_kernel_less_targets():
    with pytest.raises(TargetError, match="not exact"):
        routing.queue_for(farm_pb2.Target(device="cpu"))
    with pytest.raises(TargetError, match="not exact"):
        routing.queue_for(farm_pb2.Target(device="cuda"), routing.KERNEL)
    with pytest.raises(TargetError, match="Triton kernels for cuda, rocm"):
        routing.queue_for(_msg("cpu:avx2"), routing.KERNEL)
    with pytest.raises(routing.UnknownDevice, match="unknown device"):
        routing.queue_for(farm_pb2.Target(device="tpu", arch="v5"))


def test_served_targets_from_registrations():
    new = {"queues": ["cpu.avx2", "kernels.cuda.sm_90"],
           "targets": {"cpu:avx2": ["graph"], "cuda:sm_90": ["kernel"]}}
    assert routing.served_targets(new) == {"cpu:avx2": {"graph"}, "cuda:sm_90": {"kernel"}}
    # A registration without targets is read from its queue names; "cpu" names none.
    old = {"queues": ["cpu", "cuda.sm_80", "kernels.rocm.gfx942"]}
    assert routing.served_targets(old) == {"cuda:sm_80": {"graph"}, "rocm:gfx942": {"kernel"}}
    message = routing.unserved_message("cuda:sm_80", routing.KERNEL, {"w": new})
    assert "cuda:sm_80" in message and "cpu:avx2 (graph)" in message and "cuda:sm_90 (kernel)" in message


def test_target_from_proto_uses_isa_on_cpu_and_arch_on_gpus():
    assert str(targets.from_proto(farm_pb2.Target(device="cpu", isa="avx512", arch="x"))) == "cpu:avx512"
    assert str(targets.from_proto(farm_pb2.Target(device="cuda", arch="sm_90", isa="avx2"))) == "cuda:sm_90"
    assert routing.describe(farm_pb2.Target(device="rocm", arch="gfx942")) == "rocm:gfx942"


def test_coordinator_side_modules_import_neither_torch_nor_triton():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import services.coordinator.triton_rpc, torchfarm.wire.routing, torchfarm.wire.targets, "
        "torchfarm.kernels.triton_check, torchfarm.kernels.triton_request, torchfarm.kernels.elf, cli\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
