"""The coordinator's routing against the in-memory store: each job goes to the queue of
its exact target, and a target no live worker serves is refused at once (NoWorker), named.

The shipped InlineDispatcher runs the kernel path's worker job function in a thread
instead of Celery; the real gRPC + Celery path is in test_kernel_rpc.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator.errors import BackendUnavailable, InvalidRequest, NoWorker
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from tests.requests import queue_of, relu_request
from torchfarm.kernels import triton_request
from torchfarm.wire import builds
from workers.jobs.triton import KernelContext


@pytest.fixture
def store():
    """The store in memory (localfarm/memory_store.py): routing is logic."""
    return memory_store()

SOURCE = (Path(__file__).parent / "kernels" / "add_kernel.py").read_text()


def gpu_request(arch: str, device: str = "cuda"):
    req = relu_request()
    req.target.device, req.target.arch = device, arch
    return req


@pytest.fixture
def fleet(store):
    cpu, gpu = relu_request(isa="avx512"), gpu_request("sm_90")
    store.heartbeat(
        "cpu-1", [queue_of(cpu)], "b", 30, targets={"cpu:avx512": ["graph"]},
        fingerprint={**builds.of_request(cpu), "isa": "avx512"},
    )
    store.heartbeat(
        "h100-1", [queue_of(gpu), "kernels.cuda.sm_90"], "b", 30,
        targets={"cuda:sm_90": ["graph", "kernel"]}, fingerprint=builds.of_request(gpu),
    )
    store.heartbeat(
        "cpu-kernels", ["kernels.rocm.gfx942"], "b", 30,
        targets={"rocm:gfx942": ["kernel"]}, fingerprint={"triton_version": "3.7.0"},
    )
    return store


def test_graph_jobs_go_to_their_exact_target_queue(fleet):
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    for req, queue in [(relu_request(isa="avx512"), "cpu.avx512."), (gpu_request("sm_90"), "cuda.sm_90.")]:
        asyncio.run(farm.submit(req, req.ByteSize()))
        build = builds.digest(builds.of_request(req))
        assert farm.dispatcher.sent[-1].queue == queue + "b" + build


def _other_build(**changes):
    req = relu_request(isa="avx512", **{k: v for k, v in changes.items() if k != "torch_git"})
    req.build.torch_git = changes.get("torch_git", req.build.torch_git)
    return req


def test_a_client_of_one_build_never_reaches_a_worker_of_another(fleet):
    """Two workers of one target, of two builds of one torch version: each build's jobs
    go to its own worker's queue, and only there."""
    other = _other_build(torch_git="def")
    fleet.heartbeat(
        "cpu-2", [queue_of(other)], "b", 30, targets={"cpu:avx512": ["graph"]},
        fingerprint={**builds.of_request(other), "isa": "avx512"},
    )
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    mine = relu_request(isa="avx512")
    for req in (mine, other):
        asyncio.run(farm.submit(req, req.ByteSize()))
    workers = fleet.live_workers()
    q1, q2 = (t.queue for t in farm.dispatcher.sent)
    assert q1 != q2
    assert [n for n, w in workers.items() if q1 in w["queues"]] == ["cpu-1"]
    assert [n for n, w in workers.items() if q2 in w["queues"]] == ["cpu-2"]


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"torch_version": "2.12.0+cpu"}, "torch 2.12.0+cpu"),
        ({"torch_git": "fedcba98"}, "(git fedcba98)"),
        ({"triton_version": "3.6.0"}, "triton 3.6.0"),
    ],
)
def test_an_unserved_build_is_refused_at_submit_time_by_name(fleet, changes, named):
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    req = _other_build(**changes)
    with pytest.raises(NoWorker) as e:
        asyncio.run(farm.submit(req, req.ByteSize()))
    assert e.value.reason == "BUILD_NOT_SERVED"
    wanted, _, listed = str(e.value).partition("; builds served")
    assert "for target cpu:avx512 with build torch " in wanted
    assert named in wanted and named not in listed
    message = str(e.value)
    served = builds.label(builds.of_request(relu_request(isa="avx512")))
    assert f"builds served for cpu:avx512: {served}" in message
    assert farm.dispatcher.sent == []
    assert fleet.tenant("").get_job(farm_key(req)) is None  # nothing queued, no job left


def farm_key(req) -> str:
    from torchfarm.wire import keys

    return keys.compute_key(req, "")


@pytest.mark.parametrize(
    "req, named",
    [
        (relu_request(isa="avx2"), "cpu:avx2"),
        (gpu_request("sm_80"), "cuda:sm_80"),
        (gpu_request("gfx942", "rocm"), "rocm:gfx942"),  # served for kernels only
    ],
)
def test_unserved_graph_target_is_unavailable_at_once(fleet, req, named, no_waiting):
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    with pytest.raises(NoWorker, match=f"compiles graphs for target {named}") as e:
        asyncio.run(farm.submit(req, req.ByteSize()))
    assert "live targets: cpu:avx512 (graph), cuda:sm_90 (graph+kernel), rocm:gfx942 (kernel)" in str(e.value)
    assert "`torchfarm worker --targets " in str(e.value)
    assert farm.dispatcher.sent == []


def test_inexact_target_is_invalid(fleet):
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    req = relu_request()
    req.target.isa = ""
    with pytest.raises(InvalidRequest, match="not exact"):
        asyncio.run(farm.submit(req, req.ByteSize()))


def _kernel_service(farm: Farm, **kw) -> KernelService:
    return KernelService(farm, farm.runner, **kw)


def _kernel(target: str, triton_version: str | None = "3.7.0"):
    return triton_request.build_kernel_request(
        SOURCE, "add_kernel", target=target, signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 64}, triton_version=triton_version,
    )


def test_kernel_jobs_route_compile_and_hit(fleet):
    ctx = KernelContext(store=fleet, name="cpu-kernels", targets=frozenset({"rocm:gfx942"}),
                        triton_version="3.7.0")
    farm = Farm(CoordinatorSettings(poll_interval_s=0.02), fleet, InlineDispatcher(kernel_context=ctx))
    service = KernelService(farm, farm.runner, wait_s=60)
    req = _kernel("rocm:gfx942", triton_version="")  # "": the farm's version
    first = asyncio.run(service.compile(req, req.ByteSize()))
    assert [(t.key, t.queue) for t in farm.dispatcher.sent] == [(first.key, "kernels.rocm.gfx942")]
    assert not first.cache_hit and first.binary[:4] == b"\x7fELF"
    assert first.manifest.fingerprint == {"triton_version": "3.7.0", "target": "rocm:gfx942"}
    again = asyncio.run(service.compile(req, req.ByteSize()))
    assert again.cache_hit and again.key == first.key and again.binary == first.binary
    assert len(farm.dispatcher.sent) == 1


def test_unserved_kernel_target_or_version_is_unavailable_at_once(fleet, no_waiting):
    service = _kernel_service(Farm(CoordinatorSettings(), fleet, InlineDispatcher()))
    for req, message in [
        (_kernel("cuda:sm_80"), "compiles Triton kernels for target cuda:sm_80"),
        (_kernel("rocm:gfx90a"), "compiles Triton kernels for target rocm:gfx90a"),
        (_kernel("cuda:sm_90", "3.6.0"), "cuda:sm_90 with Triton 3.6.0 \\(live: 3.7.0\\)"),
    ]:
        with pytest.raises(NoWorker, match=message):
            asyncio.run(service.compile(req, req.ByteSize()))


def test_bad_kernels_are_invalid_on_the_coordinator(fleet):
    service = _kernel_service(Farm(CoordinatorSettings(), fleet, InlineDispatcher()))
    req = _kernel("rocm:gfx942")
    req.source = "import os\n" + req.source
    with pytest.raises(InvalidRequest, match="import of 'os'"):
        asyncio.run(service.compile(req, req.ByteSize()))
    req = _kernel("rocm:gfx942")
    req.target.device = "cpu"
    with pytest.raises(InvalidRequest, match="not exact|Triton kernels for cuda, rocm"):
        asyncio.run(service.compile(req, req.ByteSize()))


def test_kernel_compile_errors_come_back_as_invalid(fleet):
    ctx = KernelContext(store=fleet, name="cpu-kernels", targets=frozenset({"rocm:gfx942"}),
                        triton_version="3.7.0")
    service = _kernel_service(Farm(CoordinatorSettings(poll_interval_s=0.02), fleet, InlineDispatcher(kernel_context=ctx)))
    req = _kernel("rocm:gfx942")
    req.source = req.source.replace("tl.store(", "tl.no_such_builtin(")
    with pytest.raises(InvalidRequest, match="INVALID_KERNEL: .*no attribute 'no_such_builtin'"):
        asyncio.run(service.compile(req, req.ByteSize()))


def test_a_kernel_job_nobody_takes_times_out(fleet):
    service = _kernel_service(Farm(CoordinatorSettings(poll_interval_s=0.02), fleet, InlineDispatcher()), wait_s=0.3)
    req = _kernel("cuda:sm_90")
    with pytest.raises(BackendUnavailable, match="did not compile within"):
        asyncio.run(service.compile(req, req.ByteSize()))


@pytest.mark.parametrize("device, arch", [("rocm", "gfx942"), ("mps", ""), ("xpu", "intel-r-data-center-gpu-max-1550")])
def test_rocm_mps_and_xpu_graphs_route_on_target_and_build(store, device, arch):
    """No such device here: a registered worker of each kind stands in (its heartbeat)."""
    req = gpu_request(arch, device)
    target = f"{device}:{arch}" if arch else device
    store.heartbeat(
        f"{device}-1", [queue_of(req)], "b", 30, targets={target: ["graph"]},
        fingerprint=builds.of_request(req),
    )
    farm = Farm(CoordinatorSettings(), store, InlineDispatcher())
    asyncio.run(farm.submit(req, req.ByteSize()))
    assert farm.dispatcher.sent[-1].queue == queue_of(req)
    other = gpu_request(arch, device)
    other.build.torch_version = "2.11.0"
    with pytest.raises(NoWorker, match=f"for target {target} with build torch 2.11.0") as e:
        asyncio.run(farm.submit(other, other.ByteSize()))
    assert e.value.reason == "BUILD_NOT_SERVED" and len(farm.dispatcher.sent) == 1
