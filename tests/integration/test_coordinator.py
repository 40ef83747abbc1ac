"""The coordinator's request path against the in-memory store (no process needed).

The shipped InlineDispatcher records what would be queued, and runs none of it; the full path through Celery is
covered by test_end_to_end.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kombu.exceptions import OperationalError

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator.errors import (
    BackendUnavailable,
    InvalidRequest,
    NotFound,
    NoWorker,
    RequestTooLarge,
)
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.store import JobState
from torchfarm.wire import keys
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest


@pytest.fixture
def store():
    """The store in memory (localfarm/memory_store.py): these tests are about
    the logic around Redis, which runs there unchanged, Lua scripts included."""
    return memory_store()


@pytest.fixture
def farm(store):
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    return Farm(CoordinatorSettings(poll_interval_s=0.01, chunk_bytes=5), store, InlineDispatcher())


def _sent(farm: Farm) -> list[tuple[str, str]]:
    return [(t.key, t.queue) for t in farm.dispatcher.sent]


def run(coro):
    return asyncio.run(coro)


def _put_artifact(store, key: str, payload: bytes = b"0123456789abcdef") -> Manifest:
    ref = BlobRef(blob_digest(payload), len(payload))
    store.put_blob(ref.digest, payload)
    m = Manifest(key=key, fingerprint={}, payload=ref, timings={"total": 1.0}, worker="w1")
    store.put_manifest(m)
    return m


def test_miss_queues_one_job_and_concurrent_submits_join_it(farm):
    req = relu_request()

    async def many():
        return await asyncio.gather(*(farm.submit(req, req.ByteSize()) for _ in range(8)))

    results = run(many())
    key = keys.compute_key(req)
    assert _sent(farm) == [(key, RELU_QUEUE)]
    assert sum(not r.deduplicated for r in results) == 1
    assert all(r.key == key and r.state == JobState.QUEUED for r in results)
    assert farm.store.get_request(key) == req.SerializeToString()


def test_cached_artifact_is_a_hit(farm):
    req = relu_request()
    key = keys.compute_key(req)
    _put_artifact(farm.store, key)
    result = run(farm.submit(req, req.ByteSize()))
    assert result.cache_hit and result.state == JobState.SUCCEEDED
    assert farm.dispatcher.sent == []


def test_evicted_blob_turns_a_hit_into_a_recompile(farm):
    req = relu_request()
    key = keys.compute_key(req)
    m = _put_artifact(farm.store, key)
    farm.store.r.delete(f"tf:blob:{m.payload.digest}")
    result = run(farm.submit(req, req.ByteSize()))
    assert not result.cache_hit
    assert _sent(farm) == [(key, RELU_QUEUE)]
    assert farm.store.get_manifest_bytes(key) is None


def test_fetch_streams_manifest_then_chunks(farm):
    req = relu_request()
    key = keys.compute_key(req)
    m = _put_artifact(farm.store, key, payload=b"x" * 12)

    async def collect():
        return [p async for p in farm.fetch(key)]

    pieces = run(collect())
    assert Manifest.from_json(pieces[0].data) == m
    assert [(p.offset, len(p.data)) for p in pieces[1:]] == [(0, 5), (5, 5), (10, 2)]
    with pytest.raises(NotFound):
        run(_fetch_all(farm, "0" * 64))


async def _fetch_all(farm, key):
    return [p async for p in farm.fetch(key)]


def test_no_live_worker_is_unavailable_naming_the_target(store, no_waiting):
    farm = Farm(CoordinatorSettings(), store, InlineDispatcher())
    req = relu_request()
    with pytest.raises(NoWorker, match="cpu:avx512"):
        run(farm.submit(req, req.ByteSize()))


def test_unknown_device_and_bad_graph_are_invalid(farm):
    req = relu_request()
    req.target.device = "tpu"
    with pytest.raises(InvalidRequest, match="unknown device 'tpu'"):
        run(farm.submit(req, req.ByteSize()))
    req = relu_request()
    req.graph.nodes[1].target = "torch.save"
    with pytest.raises(InvalidRequest, match="torch.save"):
        run(farm.submit(req, req.ByteSize()))
    assert farm.dispatcher.sent == []


def test_oversized_request_is_refused(farm):
    req = relu_request()
    with pytest.raises(RequestTooLarge, match="at most"):
        run(farm.submit(req, farm.settings.max_request_bytes + 1))


def test_failed_job_is_reported_until_it_expires(farm):
    req = relu_request()
    key = keys.compute_key(req)
    run(farm.submit(req, req.ByteSize()))
    farm.store.update_job(key, state=JobState.FAILED, error_code="COMPILE_ERROR", message="boom")
    again = run(farm.submit(req, req.ByteSize()))
    assert again.state == JobState.FAILED and not again.deduplicated
    updates = run(_watch(farm, key))
    assert updates[-1].state == JobState.FAILED and updates[-1].message == "boom"
    assert len(farm.dispatcher.sent) == 1


async def _watch(farm, key):
    return [j async for j in farm.watch(key)]


def test_watch_follows_stages_to_the_end(farm):
    req = relu_request()
    key = keys.compute_key(req)
    run(farm.submit(req, req.ByteSize()))

    async def scenario():
        async def worker():
            for stage in ("decode", "compile", "store"):
                await asyncio.sleep(0.05)
                farm.store.update_job(key, state=JobState.RUNNING, stage=stage)
            await asyncio.sleep(0.05)
            farm.store.update_job(key, state=JobState.SUCCEEDED, stage="done")

        task = asyncio.create_task(worker())
        seen = [(j.state, j.stage) async for j in farm.watch(key)]
        await task
        return seen

    seen = run(scenario())
    assert seen[0] == (JobState.QUEUED, "")
    assert seen[-1] == (JobState.SUCCEEDED, "done")
    assert (JobState.RUNNING, "compile") in seen


def test_stale_job_is_requeued(farm):
    req = relu_request()
    key = keys.compute_key(req)
    run(farm.submit(req, req.ByteSize()))
    farm.store.r.hset(f"tf:job:{key}", "updated", time.time() - farm.settings.stale_job_s - 1)
    run(farm.submit(req, req.ByteSize()))
    assert _sent(farm) == [(key, RELU_QUEUE), (key, RELU_QUEUE)]


def test_broker_down_is_unavailable_and_leaves_no_job(store):
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    farm = Farm(CoordinatorSettings(), store, InlineDispatcher(down=OperationalError("broker down")))
    req = relu_request()
    with pytest.raises(BackendUnavailable, match="broker down"):
        run(farm.submit(req, req.ByteSize()))
    assert store.get_job(keys.compute_key(req)) is None
