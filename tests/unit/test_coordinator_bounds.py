"""What one call may make the coordinator do is bounded by what it sends, and small:
a cache query's key list, an upload's manifest. Before, a 64 MiB list of key prefixes
cost minutes of a coordinator thread (prefixes × entries), and every listing parsed
manifests of up to the whole request size."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator import precompiled
from services.coordinator.cache import MAX_FILTER_KEYS, CacheService, Filters
from services.coordinator.errors import InvalidRequest, TenantQueueFull
from services.coordinator.farm import Farm
from services.coordinator.precompiled import MAX_MANIFEST_BYTES, check_upload
from services.coordinator.settings import CoordinatorSettings
from torchfarm.storage import explain
from torchfarm.trust.tokens import Tenant
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import Reason
from torchfarm.wire.manifest import PRECOMPILED, BlobRef, Manifest, blob_digest


def _service() -> CacheService:
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher())
    return CacheService(farm, farm.runner)


@pytest.mark.parametrize("prefixes", [
    tuple(f"{i:08x}" for i in range(MAX_FILTER_KEYS + 1)),  # too many
    ("ab" * 33,),  # longer than any key
])
def test_a_cache_query_names_a_bounded_list_of_keys(prefixes):
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(_service().list(Filters(keys=prefixes), 10))
    assert refused.value.reason == Reason.INVALID_FILTER


def test_the_most_keys_a_query_may_name_still_list():
    listing = asyncio.run(_service().list(Filters(keys=tuple(f"{i:08x}" for i in range(MAX_FILTER_KEYS))), 10))
    assert listing.entries == []


class _HeldListing:
    """A cache service whose reads of a namespace's manifests wait for `release`, as a
    large namespace's do (tens of thousands of manifests: seconds each)."""

    def __init__(self, **settings) -> None:
        self.release = threading.Event()
        self.farm = Farm(CoordinatorSettings(**settings), memory_store(), InlineDispatcher())
        self.service = CacheService(self.farm, self.farm.runner)
        tenant = self.farm.store.tenant
        release = self.release

        def slow_view(namespace: str):
            view = tenant(namespace)
            reads = view.my_artifacts

            def held():
                release.wait(30)
                return reads()

            view.my_artifacts = held
            return view

        self.farm.store.tenant = slow_view


def test_a_tenants_cache_listings_at_once_are_capped():
    """Each listing reads and parses every manifest of the namespace: a tenant running
    dozens at once held the coordinator's store threads, and the interpreter, from every
    other tenant's calls."""
    held = _HeldListing(max_listings_per_tenant=2)
    alice, bob = Tenant("alice", "alice"), Tenant("bob", "bob")

    async def scenario() -> None:
        running = [asyncio.ensure_future(held.service.list(Filters(), 10, alice)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(TenantQueueFull) as refused:
            await held.service.list(Filters(), 10, alice)
        assert refused.value.reason == Reason.LISTING_LIMIT
        with pytest.raises(TenantQueueFull):
            await held.service.evict(Filters(), True, alice)
        bobs = asyncio.ensure_future(held.service.list(Filters(), 10, bob))  # his own cap
        await asyncio.sleep(0.05)
        held.release.set()
        assert [(await r).matched.entries for r in (*running, bobs)] == [0, 0, 0]
        assert (await held.service.list(Filters(), 10, alice)).matched.entries == 0  # the slots came back

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_listings_manifests_are_parsed_in_the_tenants_check_share(monkeypatch):
    service = _service()
    compute = service.runner.compute
    shares: list[str] = []

    async def spied(fn, *args, tenant=""):
        shares.append(tenant)
        return await compute(fn, *args, tenant=tenant)

    monkeypatch.setattr(service.runner, "compute", spied)
    asyncio.run(service.list(Filters(), 10, Tenant("alice", "team-a")))
    asyncio.run(service.evict(Filters(), True, Tenant("alice", "team-a")))
    assert shares == ["team-a", "team-a"]


def test_an_upload_with_a_manifest_over_the_bound_is_refused():
    payload = b"a Dynamo package"
    manifest = Manifest(
        key="pc1-" + "a" * 64, fingerprint={"note": "x" * MAX_MANIFEST_BYTES}, kind=PRECOMPILED,
        payload=BlobRef(blob_digest(payload), len(payload)),
    )
    upload = farm_pb2.PrecompiledUpload(manifest=manifest.to_json(), blobs=[
        farm_pb2.PrecompiledBlob(digest=blob_digest(payload), data=payload),
    ])
    with pytest.raises(InvalidRequest, match="manifest"):
        check_upload(upload, "", 64 << 20)


class _CountingReads:
    """The cache Redis client, counting the bytes of the miss records read through it."""

    def __init__(self, client) -> None:
        self.client, self.read = client, 0

    def get(self, name):
        data = self.client.get(name)
        if data is not None and b":explain:" in (name if isinstance(name, bytes) else name.encode()):
            self.read += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.client, name)


def _big_record(i: int) -> farm_pb2.PrecompiledRecord:
    return farm_pb2.PrecompiledRecord(model="m.Net", components={"model_code": f"{i}"}, parts=[
        farm_pb2.PrecompiledPart(component="parameters", name=f"p{j}".ljust(explain.MAX_TEXT, "x"),
                                 value="v" * explain.MAX_TEXT)
        for j in range(explain.MAX_PARTS)
    ])


def test_a_precompiled_record_is_kept_bounded_and_an_explanation_reads_a_bounded_amount():
    """An upload's record could be 2 MB (4096 parts of 256-character texts), kept for 30
    days, and each explanation read every record of the model's index (32 of them)."""
    store = memory_store()
    index = explain.MissIndex(store)
    for i in range(explain.INDEX_SIZE):
        index.remember_precompiled(explain.check_precompiled(_big_record(i), f"pc1-{i:064x}"))
    kept = [store.c.strlen(name) for name in store.c.scan_iter(match="tf:explain:*")]
    assert len(kept) == explain.INDEX_SIZE and max(kept) <= explain.MAX_RECORD_BYTES
    counting = _CountingReads(store.c)
    store.c = counting
    found = index.explain_precompiled(_big_record(999), "pc1-" + "f" * 64)
    assert found.reason == "model_code"
    assert counting.read <= explain.READ_BUDGET_BYTES + explain.MAX_RECORD_BYTES


def test_an_explanation_stops_reading_records_when_its_budget_is_spent(monkeypatch):
    store = memory_store()
    index = explain.MissIndex(store)
    for i in range(explain.INDEX_SIZE):
        index.remember_precompiled(explain.check_precompiled(_big_record(i), f"pc1-{i:064x}"))
    record_bytes = max(store.c.strlen(name) for name in store.c.scan_iter(match="tf:explain:*"))
    monkeypatch.setattr(explain, "READ_BUDGET_BYTES", 4 * record_bytes)
    counting = _CountingReads(store.c)
    store.c = counting
    index.explain_precompiled(_big_record(999), "pc1-" + "f" * 64)
    assert 4 * record_bytes <= counting.read <= 5 * record_bytes


@pytest.mark.parametrize("key", ["pc1-*", "pc1-a:b", "pc1-" + "A" * 64, "pc1-x\n", "pc1-" + "a" * 125])
def test_a_precompiled_key_is_a_name_the_farm_can_use_as_a_redis_key(key):
    """An upload's or a miss's key becomes part of a Redis key and a scan pattern: only
    what the farm names other keys with passes (keys.NAMED_KEY)."""
    with pytest.raises(InvalidRequest):
        precompiled.check_key(key, "refused")


def test_a_precompiled_key_the_sdk_makes_passes():
    precompiled.check_key("pc1-" + "0f" * 32, "refused")


class _CountingAllReads(_CountingReads):
    """Counts every miss record's bytes read, its parts' included."""

    def get(self, name):
        data = self.client.get(name)
        if data is not None and b":explain" in (name if isinstance(name, bytes) else name.encode()):
            self.read += len(data)
        return data


def test_a_precompiled_explanation_parses_only_the_parts_of_the_closest_package():
    """One small miss made the coordinator read and parse every record of the model's
    index, up to 8 MiB of JSON (some 50 ms, holding the loop's thread); the ranking
    needs only the components, and the detail only the closest record's parts."""
    store = memory_store()
    index = explain.MissIndex(store)
    for i in range(explain.INDEX_SIZE):
        record = _big_record(i)
        del record.parts[explain.MAX_PARTS // 16:]  # about 130 KB each: kept whole
        record.parts.add(component="model_code", name="m.Net.forward", value=f"{i}")
        index.remember_precompiled(explain.check_precompiled(record, f"pc1-{i:064x}"))
    counting = _CountingAllReads(store.c)
    store.c = counting
    mine = _big_record(7)
    del mine.parts[:]
    mine.parts.add(component="model_code", name="m.Net.forward", value="7")
    mine.components["parameters"] = "changed"
    found = index.explain_precompiled(mine, "pc1-" + "f" * 64)
    assert (found.reason, found.closest_key) == ("parameters", f"pc1-{7:064x}")
    assert "p0" in found.detail  # the closest record's parts still name the part
    assert counting.read <= explain.MAX_RECORD_BYTES + explain.INDEX_SIZE * 4096


def _miss(key: str) -> farm_pb2.PrecompiledMiss:
    return farm_pb2.PrecompiledMiss(key=key, record=farm_pb2.PrecompiledRecord(
        model="other.Model", components={"model_code": "x"},
        parts=[farm_pb2.PrecompiledPart(component="model_code", name="N" * 256, value="V" * 256)],
    ))


def test_a_tenants_precompiled_miss_explanations_kept_are_bounded():
    """Each ExplainPrecompiledMiss kept a 30-day explanation of any key the caller made
    up, charged to no quota, in the cache whose LRU then evicted other tenants' entries
    for it; a namespace keeps its newest ones only."""
    store = memory_store()
    farm = Farm(CoordinatorSettings(explain_misses_per_minute=0), store, InlineDispatcher())
    mallory = Tenant("mallory", "mallory")
    calls = explain.MAX_PRECOMPILED_WHYS + 40
    for i in range(calls):
        asyncio.run(farm.explain_precompiled(_miss(f"pc1-{i:064x}"), mallory))
    kept = list(store.c.scan_iter(match="tf:why:mallory:*"))
    assert len(kept) == explain.MAX_PRECOMPILED_WHYS
    assert explain.MissIndex(store.tenant("mallory")).last(f"pc1-{calls - 1:064x}") is not None
    assert explain.MissIndex(store.tenant("mallory")).last(f"pc1-{0:064x}") is None


def test_precompiled_miss_explanations_have_a_rate_per_tenant():
    farm = Farm(CoordinatorSettings(explain_misses_per_minute=5), memory_store(), InlineDispatcher())
    mallory, bob = Tenant("mallory", "mallory"), Tenant("bob", "bob")
    for i in range(5):
        asyncio.run(farm.explain_precompiled(_miss(f"pc1-{i:064x}"), mallory))
    with pytest.raises(TenantQueueFull) as refused:
        asyncio.run(farm.explain_precompiled(_miss(f"pc1-{9:064x}"), mallory))
    assert refused.value.reason == Reason.EXPLAIN_RATE
    assert asyncio.run(farm.explain_precompiled(_miss(f"pc1-{9:064x}"), bob)).reason == "new"
