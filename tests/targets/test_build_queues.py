"""Queue names of target and build, for every device kind, without any device: the
plan a worker of a (faked) ROCm, MPS or XPU machine makes, and the names read back."""

from __future__ import annotations

import pytest

from torchfarm.wire import builds, routing, targets
from workers.serving import make_plan

BUILD = {"torch_version": "2.13.0+rocm6.4", "torch_git": "abc", "triton_version": "3.7.0",
         "python": "3.12", "platform": "linux-x86_64", "compiler": "g++ 12"}
CPU = targets.make("cpu", "avx2")


@pytest.mark.parametrize(
    "text", ["cpu:avx512", "cuda:sm_90", "rocm:gfx942", "mps", "xpu:intel-r-data-center-gpu-max-1550",
             "xpu:arc.b580"],  # a dotted Intel name still reads back
)
def test_graph_and_stage_queues_name_target_and_build_and_read_back(text):
    target, digest = targets.parse(text), builds.digest(BUILD)
    for queue in (routing.queue_name(target, routing.GRAPH, digest), routing.stage_queue(target, digest)):
        assert queue.endswith(".b" + digest) and len(queue) <= 100
        assert routing.target_of_queue(queue) == target
        assert routing.build_of_queue(queue) == digest


@pytest.mark.parametrize("text", ["rocm:gfx942", "mps", "xpu:intel-r-data-center-gpu-max-1550"])
def test_a_worker_of_a_faked_device_serves_its_builds_queues(text):
    device = targets.parse(text)
    digest = builds.digest(BUILD)
    plan = make_plan(["local"], [CPU, device], build=digest)
    assert plan.graph == (device,)
    graph_queue = routing.queue_name(device, routing.GRAPH, digest)
    assert plan.queues[:2] == [graph_queue, routing.stage_queue(device, digest)]
    kernels = [q for q in plan.queues if q.startswith("kernels.")]
    assert kernels == ([f"kernels.{text.replace(':', '.')}"] if device.device == "rocm" else [])


def test_the_digest_is_stable_and_covers_every_build_field():
    digest = builds.digest(BUILD)
    assert digest == builds.digest(dict(reversed(list(BUILD.items()))))  # order does not matter
    assert digest == builds.digest({**BUILD, "isa": "avx2", "device": "rocm"})  # the target's are not build
    for field in builds.FIELDS:
        assert builds.digest({**BUILD, field: BUILD[field] + "x"}) != digest, field


def test_a_bad_digest_and_kernel_queues_carry_no_build():
    with pytest.raises(ValueError, match="six hex digits"):
        routing.queue_name(CPU, routing.GRAPH, "cpu;rm")
    kernel = routing.queue_name(targets.parse("rocm:gfx942"), routing.KERNEL, builds.digest(BUILD))
    assert kernel == "kernels.rocm.gfx942" and routing.build_of_queue(kernel) == ""


def test_a_build_label_names_what_differs():
    label = builds.label(BUILD)
    assert label.startswith("torch 2.13.0+rocm6.4 (git abc), triton 3.7.0, py3.12, linux-x86_64, g++ 12 [b")
