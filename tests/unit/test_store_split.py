"""Which Redis each key lives in when the state and the cache are apart (torchfarm/storage/store.py):
everything in flight in the state, what a miss can rebuild in the cache; and the staged
compile's claims and the blob collector still work across the two."""

from __future__ import annotations

import hashlib
import json

import fakeredis
import pytest

from localfarm.memory_store import MemoryStore
from tests.requests import kernel_manifest
from torchfarm.storage.blobgc import referenced
from torchfarm.storage.store import Store, state_eviction
from torchfarm.wire.manifest import BlobRef
from workers.board import BUILD, CACHED, WAIT, Plan, StageBoard


@pytest.fixture
def split():
    state = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    cache = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return MemoryStore(state, "tf", cache=cache), state, cache


def _names(client) -> set[str]:
    return {k.decode().split(":")[1] for k in client.scan_iter(count=1000)}


def test_in_flight_state_and_cache_keys_go_to_their_own_redis(split):
    store, state, cache = split
    t = store.tenant("alice")
    t.create_job("k1", "cpu.avx512", "a label", ttl_s=60, request=b"req")
    t.note_job("alice", "k1", 60)
    t.put_kernel_request("kk", b"kreq", 60)
    t.heartbeat("w1", ["cpu.avx512"], "build", ttl_s=30)
    data = b"payload"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    t.put_blob(digest, data)
    t.note_hit("k1")
    t.put_kernel(kernel_manifest("kk", data, "alice"))
    StageBoard(t).put_binary("kc", b"binary", "w1", 1.0)
    assert _names(state) == {"job", "req", "recent", "inflight", "kreq", "worker", "queues-seen"}
    assert _names(cache) == {"blob", "stat", "kernel", "kbin"}
    assert cache.hget("tf:stat:alice:k1", "label") == b"a label"  # the label joined the stats
    assert t.get_job("k1") is not None and t.get_request("k1") == b"req"


def test_claims_in_the_state_see_the_kernel_cache_in_the_cache(split):
    store, state, cache = split
    board = StageBoard(store)
    board.put_binary("built", b"binary", "w1", 1.0)
    verdicts = board.claim("job1", "waiter1", ["built", "new"], ttl_s=60, claim_ttl_s=60)
    assert verdicts == [CACHED, BUILD]
    assert board.claim("job2", "waiter2", ["new"], ttl_s=60, claim_ttl_s=60) == [WAIT]
    assert board.pending("job1") == {"new"}
    assert board.settle("new") == ["waiter2"]
    assert not any(k.startswith(b"tf:kclaim") for k in cache.scan_iter())


def test_the_collector_keeps_blobs_named_in_either_redis(split):
    store, state, cache = split
    named = b"a plan's payload"
    digest = "sha256:" + hashlib.sha256(named).hexdigest()
    store.put_blob(digest, named)
    StageBoard(store).put_plan("job1", Plan(payload=BlobRef(digest, len(named)), kernels=[], target="cpu"), 60)
    assert not any(b"plan" in k for k in cache.scan_iter())
    kernel = kernel_manifest("kk", b"a kernel's binary")
    store.put_kernel(kernel)  # in the cache
    assert referenced(store) == {digest, *(b.digest for b in kernel.blobs())}  # so `collect` keeps all


def test_one_url_plays_both_roles():
    store = Store(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    assert store.c is store.r and not store.split


class Info:
    def __init__(self, **memory):
        self.memory = memory

    def info(self, section):
        assert section == "memory"
        return self.memory


@pytest.mark.parametrize("maxmemory, policy, evicts", [
    (0, "allkeys-lru", False),  # no limit: nothing is ever evicted
    (1 << 20, "noeviction", False),
    (1 << 20, "allkeys-lru", True),
    (1 << 20, "volatile-ttl", True),
])
def test_which_state_redis_may_evict(maxmemory, policy, evicts):
    why = state_eviction(Info(maxmemory=maxmemory, maxmemory_policy=policy))  # type: ignore[arg-type]
    assert (why is not None) == evicts
    if evicts:
        assert policy in json.dumps(why)
