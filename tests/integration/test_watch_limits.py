"""Watch and CompileKernel's wait are woken by Redis pub/sub when a job record changes,
not by polling; a tenant's concurrent Watch streams are capped; CompileKernel counts
against the tenant's quota like Submit (issue 16, item 7). Real redis-server, no workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from localfarm.fakes import InlineDispatcher
from services.coordinator.errors import TenantQueueFull
from services.coordinator.farm import Farm
from services.coordinator.jobevents import JobEvents
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.kernels import triton_request
from torchfarm.storage.store import JobState
from torchfarm.trust.tokens import Tenant

pytestmark = pytest.mark.integration

HANG_GUARD_S = 60
"""Only so a broken test ends; nothing here waits for time to pass."""

NEVER_S = 3600.0
"""A poll interval no test outlives: whatever happens, happened by notification."""

ALICE, BOB = Tenant("alice", "alice"), Tenant("bob", "bob")
KERNEL_SOURCE = (Path(__file__).parents[1] / "targets" / "kernels" / "add_kernel.py").read_text()


def _settings(**over) -> CoordinatorSettings:
    return CoordinatorSettings(**{"poll_interval_s": NEVER_S, "watch_poll_s": NEVER_S, **over})


@pytest.fixture
def farm(store, redis_url):
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=60)

    def make(**over) -> Farm:
        return Farm(_settings(**over), store, InlineDispatcher(), events=JobEvents(redis_url))

    return make


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG_GUARD_S))


def test_watch_follows_a_job_by_notification_not_polling(farm, store):
    f = farm()
    req = relu_request()
    key = _run(f.submit(req, req.ByteSize(), ALICE)).key
    view = store.tenant("alice")
    reads = []
    real = view.get_job

    async def watch():
        seen = []
        store_tenant = f.store.tenant

        def counted(ns):
            s = store_tenant(ns)
            s.get_job = lambda k: reads.append(k) or real(k)
            return s

        f.store.tenant = counted
        async for job in f.watch(key, ALICE):
            seen.append(job.state)
            if len(seen) == 1:  # the first record is out: now the worker moves the job on
                await asyncio.to_thread(view.update_job, key, state=JobState.RUNNING, stage="lowering")
            elif job.state == JobState.RUNNING:
                await asyncio.to_thread(view.update_job, key, state=JobState.SUCCEEDED, stage="done")
        return seen

    assert _run(watch()) == [JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
    assert len(reads) <= 4  # one per change, not one per poll tick


def test_concurrent_watch_streams_are_capped_per_tenant(farm, store):
    f = farm(max_watches_per_tenant=2)
    req = relu_request()
    key_a = _run(f.submit(req, req.ByteSize(), ALICE)).key
    key_b = _run(f.submit(req, req.ByteSize(), BOB)).key

    async def scenario():
        first, second = f.watch(key_a, ALICE), f.watch(key_a, ALICE)
        await first.__anext__()
        await second.__anext__()
        with pytest.raises(TenantQueueFull) as info:
            await f.watch(key_a, ALICE).__anext__()
        assert info.value.reason == "WATCH_LIMIT"
        bob = f.watch(key_b, BOB)  # another tenant has its own cap
        await bob.__anext__()
        await first.aclose()  # a stream that ends gives its place back
        third = f.watch(key_a, ALICE)
        await third.__anext__()
        for gen in (second, third, bob):
            await gen.aclose()

    _run(scenario())


def _kernel(i: int = 0):
    req = triton_request.build_kernel_request(
        KERNEL_SOURCE, "add_kernel", target="rocm:gfx942", signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 64 * (i + 1)}, triton_version="3.7.0",
    )
    return req


@pytest.fixture
def kernel_fleet(store):
    store.heartbeat(
        "k1", ["kernels.rocm.gfx942"], "b", 60,
        targets={"rocm:gfx942": ["kernel"]}, fingerprint={"triton_version": "3.7.0"},
    )
    return store


def test_compile_kernel_counts_against_the_tenant_quota(farm, kernel_fleet):
    f = farm(max_jobs_per_tenant=1)
    service = KernelService(f, f.runner, wait_s=0.0)  # do not wait: the job stays in flight
    req = relu_request()
    _run(f.submit(req, req.ByteSize(), ALICE))  # alice's one job in flight
    with pytest.raises(TenantQueueFull):
        _run(service.compile(_kernel(), _kernel().ByteSize(), ALICE))
    assert len(f.dispatcher.sent) == 1  # the kernel job was not queued
    with pytest.raises(Exception) as other:  # bob has room: queued, then times out waiting
        _run(service.compile(_kernel(), _kernel().ByteSize(), BOB))
    assert not isinstance(other.value, TenantQueueFull)
    assert len(f.dispatcher.sent) == 2


def test_compile_kernel_waits_by_notification(farm, kernel_fleet):
    f = farm()
    service = KernelService(f, f.runner, wait_s=HANG_GUARD_S)
    req = _kernel()
    view = kernel_fleet.tenant("alice")

    async def scenario():
        call = asyncio.ensure_future(service.compile(req, req.ByteSize(), ALICE))
        while not f.dispatcher.sent:
            await asyncio.sleep(0.01)
        key = f.dispatcher.sent[0].key
        await asyncio.to_thread(view.fail_job, key, "KERNEL_COMPILE_ERROR", "no", 60)
        with pytest.raises(Exception, match="KERNEL_COMPILE_ERROR"):
            await call

    _run(scenario())
