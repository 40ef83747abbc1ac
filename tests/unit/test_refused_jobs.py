"""A compile the tenant's job quota refuses leaves nothing behind: no request in the state
Redis (which never evicts), no miss record, no label. Before, each refused Submit or
CompileKernel kept its request (up to 16 MiB) for a day, so a tenant at its quota could
fill the state Redis every tenant's jobs need."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InlineDispatcher, InProcessFarm, memory_store
from services.coordinator.errors import TenantQueueFull
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from tests.requests import queue_of, relu_request
from torchfarm.kernels import triton_request
from torchfarm.storage.store import Store
from torchfarm.trust.tokens import Tenant

MALLORY = Tenant("mallory", "mallory")
KERNEL = "import triton\n\n\n@triton.jit\ndef k(x):\n    pass\n"


def _names(client, kind: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"tf:{kind}:mallory:*"))


def test_a_submit_refused_for_the_quota_stores_nothing():
    farm = InProcessFarm(settings=CoordinatorSettings(poll_interval_s=0.01, max_jobs_per_tenant=1))
    farm.store.heartbeat("w", [queue_of(relu_request())], "build", 3600)
    admitted = relu_request(label="admitted")
    asyncio.run(farm.farm.submit(admitted, admitted.ByteSize(), MALLORY))
    before = {kind: _names(store, kind) for store, kind in
              ((farm.store.r, "req"), (farm.store.r, "job"), (farm.store.c, "explain"), (farm.store.c, "stat"))}
    assert all(len(names) == 1 for names in before.values()), before  # what an admitted job keeps
    refused = relu_request(label="refused")
    refused.graph.nodes[0].tensor.shape[0].expr = "11"
    refused.graph.nodes[0].tensor.shape[0].hint = 11
    with pytest.raises(TenantQueueFull):
        asyncio.run(farm.farm.submit(refused, refused.ByteSize(), MALLORY))
    after = {kind: _names(store, kind) for store, kind in
             ((farm.store.r, "req"), (farm.store.r, "job"), (farm.store.c, "explain"), (farm.store.c, "stat"))}
    assert after == before


def _kernel_service(wait_s: float, **settings: int) -> tuple[Store, KernelService]:
    """A kernel service over a memory store whose one worker compiles for cuda:sm_90."""
    store = memory_store()
    store.heartbeat("w", ["kernels.cuda.sm_90"], "b", 3600, targets={"cuda:sm_90": ["kernel"]},
                    fingerprint={"triton_version": ""}, triton="3.7.0")
    farm = Farm(CoordinatorSettings(poll_interval_s=0.05, **settings), store, InlineDispatcher())
    return store, KernelService(farm, farm.runner, wait_s=wait_s)


def test_a_kernel_compile_refused_for_the_quota_stores_nothing():
    store, service = _kernel_service(0.5, max_jobs_per_tenant=1)

    def request(i: int):
        return triton_request.build_kernel_request(
            KERNEL + f"# {i}\n", "k", target="cuda:sm_90", signature="*fp32", label=f"kernel {i}",
            triton_version="",  # the farm's: its worker runs 3.7.0, whatever this machine has
        )

    async def both() -> None:
        first = request(0)
        waiting = asyncio.create_task(service.compile(first, first.ByteSize(), MALLORY))  # holds the quota
        await asyncio.sleep(0.2)
        second = request(1)
        with pytest.raises(TenantQueueFull):
            await service.compile(second, second.ByteSize(), MALLORY)
        waiting.cancel()

    asyncio.run(both())
    assert len(_names(store.r, "kreq")) == 1 and len(_names(store.r, "job")) == 1
    assert len(_names(store.c, "stat")) == 1


def test_kernel_waits_count_against_the_tenants_watch_cap():
    _, service = _kernel_service(1.0, max_watches_per_tenant=2)
    kernel = triton_request.build_kernel_request(KERNEL, "k", target="cuda:sm_90", signature="*fp32", triton_version="")

    async def three() -> None:
        waiting = [asyncio.create_task(service.compile(kernel, kernel.ByteSize(), MALLORY)) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(TenantQueueFull) as refused:
            await service.compile(kernel, kernel.ByteSize(), MALLORY)
        assert refused.value.reason == "WATCH_LIMIT"
        for task in waiting:
            task.cancel()

    asyncio.run(three())


def test_a_request_nobody_serves_expires_with_its_job_record():
    """A job no worker takes frees its tenant's quota when its record expires; its request
    (up to 16 MiB, in the state Redis) must go then too, not a day later, or a tenant
    could keep its quota's worth of requests stored every half hour."""
    farm = InProcessFarm(settings=CoordinatorSettings(poll_interval_s=0.01, job_ttl_s=600))
    farm.store.heartbeat("w", [queue_of(relu_request())], "build", 3600)
    request = relu_request(label="unserved")
    asyncio.run(farm.farm.submit(request, request.ByteSize(), MALLORY))
    [job], [stored] = _names(farm.store.r, "job"), _names(farm.store.r, "req")
    assert 0 < farm.store.r.ttl(stored) <= farm.store.r.ttl(job) <= 600
