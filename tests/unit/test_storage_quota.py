"""Quotas on what a tenant stores (issue 40, item 3): precompiled uploads and the
artifacts a tenant's compiles store are charged to its namespace in the state Redis;
past its quota its own oldest entries go, never another tenant's; uploads have a rate
and packages an expiry. The coordinator and the in-memory store, in this process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from localfarm.fakes import InProcessFarm
from localfarm.memory_store import MemoryStore
from services.coordinator.errors import CoordinatorError
from services.coordinator.settings import CoordinatorSettings
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.trust.tokens import Tenant
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import Reason
from torchfarm.wire.manifest import COMPILE, PRECOMPILED, BlobRef, Manifest, blob_digest

MIB = 1 << 20
ALICE, BOB = Tenant("alice", "alice"), Tenant("bob", "bob")


def _farm(**over) -> InProcessFarm:
    return InProcessFarm(settings=CoordinatorSettings(poll_interval_s=0.01, **over))


def _package(n: int, tenant: str = "alice", size: int = MIB) -> tuple[Manifest, bytes]:
    payload = n.to_bytes(4, "big") * (size // 4)
    key = "pc1-" + f"{n:064x}"
    manifest = Manifest(key=key, fingerprint={"torch": "x"}, payload=BlobRef(blob_digest(payload), len(payload)),
                        tenant=tenant, kind=PRECOMPILED, graphs={"__compiled_fn_1": "f" * 64})
    return manifest, payload


def _put(farm: InProcessFarm, n: int, tenant: Tenant = ALICE, size: int = MIB) -> str:
    manifest, payload = _package(n, tenant.namespace, size)
    upload = farm_pb2.PrecompiledUpload(
        manifest=manifest.to_json(), blobs=[farm_pb2.PrecompiledBlob(digest=manifest.payload.digest, data=payload)]
    )
    return asyncio.run(farm.farm.put_precompiled(upload, tenant))


def _refusal(farm: InProcessFarm, n: int, **kw) -> Reason:
    with pytest.raises(CoordinatorError) as info:
        _put(farm, n, **kw)
    return info.value.reason


def _artifact(farm: InProcessFarm, tenant: Tenant, n: int, size: int = MIB) -> str:
    """An artifact a compile stored in `tenant`'s namespace, as a worker stores it."""
    payload = b"k%d" % n + b"\0" * size
    key = f"{n:064x}"
    store = farm.store.tenant(tenant.namespace)
    store.put_blob(blob_digest(payload), payload)
    store.put_manifest(Manifest(key=key, fingerprint={}, payload=BlobRef(blob_digest(payload), len(payload)),
                                tenant=tenant.namespace, kind=COMPILE, created=time.time()))
    return key


def _kept(farm: InProcessFarm, tenant: Tenant, key: str) -> bool:
    return farm.store.tenant(tenant.namespace).get_manifest(key) is not None


def test_a_tenant_over_its_quota_loses_its_own_oldest_packages_never_anothers():
    farm = _farm(max_stored_bytes_per_tenant=3 * MIB + MIB // 2)
    bobs = _artifact(farm, BOB, 1)
    keys = [_put(farm, n) for n in range(8)]
    assert [_kept(farm, ALICE, k) for k in keys] == [False] * 5 + [True] * 3
    assert _kept(farm, BOB, bobs)
    # The evicted packages' blobs left with them: the bytes are free, not just unlisted.
    assert farm.store.get_blob(_package(0)[0].payload.digest) is None


def test_an_upload_larger_than_the_quota_is_refused():
    farm = _farm(max_stored_bytes_per_tenant=2 * MIB)
    assert _refusal(farm, 1, size=3 * MIB) == Reason.STORAGE_QUOTA
    assert farm.store.tenant("alice").get_manifest(_package(1)[0].key) is None


def test_uploads_have_a_rate_per_tenant():
    farm = _farm(upload_bytes_per_minute=3 * MIB)
    _put(farm, 1)
    _put(farm, 2)
    assert _refusal(farm, 3, size=2 * MIB) == Reason.UPLOAD_RATE
    _put(farm, 4, tenant=BOB, size=2 * MIB)  # another tenant's rate is its own


def test_a_precompiled_package_expires():
    farm = _farm(precompiled_ttl_s=3600)
    key = _put(farm, 1)
    ttl = farm.store.c.ttl(f"tf:artifact:alice:{key}")
    assert 0 < ttl <= 3600


def test_compiled_artifacts_count_and_their_tenant_sheds_its_own_oldest_at_its_next_compile():
    farm = _farm(max_stored_bytes_per_tenant=3 * MIB + MIB // 2)
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=60)
    bobs = _artifact(farm, BOB, 100)
    alices = [_artifact(farm, ALICE, n) for n in range(6)]
    asyncio.run(farm.farm.submit(relu_request(), 100, ALICE))
    assert [_kept(farm, ALICE, k) for k in alices] == [False] * 3 + [True] * 3
    assert _kept(farm, BOB, bobs)


def test_entries_the_cache_lost_stop_counting():
    farm = _farm(max_stored_bytes_per_tenant=3 * MIB + MIB // 2)
    keys = [_put(farm, n) for n in range(3)]
    farm.store.tenant("alice").evict_artifacts(keys[:2])  # `torchfarm cache evict`, or expiry
    _put(farm, 3)
    assert _kept(farm, ALICE, keys[2])  # room was found without evicting it


def test_torchfarm_up_caps_its_cache_and_keeps_the_state_apart(monkeypatch, tmp_path):
    """`torchfarm up` ran one Redis without maxmemory: it grew with every artifact."""
    import threading

    from cli import launch, main, up

    started: dict[str, list[str]] = {}

    class Started(Exception):
        pass

    def spawn(cmd, env, log):
        started[log.stem] = cmd
        if log.stem == "coordinator":
            raise Started
        urls = {Path(env[f"TORCHFARM_{name}_URL_FILE"]).read_text() for name in ("STATE", "CACHE")}
        assert len(urls) == 2

    monkeypatch.setattr(launch, "spawn", spawn)
    monkeypatch.setattr(launch, "wait_for_redis", lambda *a, **k: None)
    monkeypatch.setattr(up.trustfile, "publish", lambda *a, **k: tmp_path / "trust.json")
    args = main.build_parser().parse_args(["up"])
    farm = up._Farm(args, up.Layout(tmp_path, persistent=False).make(), threading.Event())
    with pytest.raises(Started):
        farm.start()
    cache, state = started["cache"], started["redis"]
    assert cache[cache.index("--maxmemory") + 1] == "2gb"
    assert cache[cache.index("--maxmemory-policy") + 1] == "allkeys-lru"
    assert state[state.index("--maxmemory-policy") + 1] == "noeviction"


@pytest.fixture
def capped(monkeypatch):
    """The in-memory cache with a maxmemory of 8 MiB (fakeredis itself never evicts)."""
    from localfarm.memory_store import MemoryStore

    monkeypatch.setattr(MemoryStore, "cache_memory", lambda self: (self.cache_bytes(), 8 * MIB))


def test_an_upload_makes_cache_room_of_its_own_oldest_packages(capped):
    farm = _farm()
    bobs = [_artifact(farm, BOB, n) for n in range(3)]
    keys = [_put(farm, n) for n in range(3)]  # 6 MiB of 8: 7.2 fit under the fill limit
    _put(farm, 3, size=3 * MIB // 2)
    assert [_kept(farm, ALICE, k) for k in keys] == [False, True, True]
    assert all(_kept(farm, BOB, k) for k in bobs)


def test_an_upload_the_uploaders_own_packages_cannot_make_room_for_evicts_nothing(capped):
    farm = _farm()
    bobs = [_artifact(farm, BOB, n) for n in range(6)]
    mine = _put(farm, 1)
    assert _refusal(farm, 2, size=2 * MIB) == Reason.STORAGE_QUOTA
    assert _kept(farm, ALICE, mine) and all(_kept(farm, BOB, k) for k in bobs)


def test_tiny_uploads_count_at_a_floor_against_rate_and_quota():
    """Bytes alone would let a tenant send packages of a few bytes by the hundred
    thousand, each an entry to count and scan."""
    farm = _farm(upload_bytes_per_minute=8 * MIB)
    outcomes = []
    for n in range(12):
        try:
            outcomes.append(bool(_put(farm, n, size=64)))
        except CoordinatorError as e:
            outcomes.append(e.reason)
    assert outcomes == [True] * 8 + [Reason.UPLOAD_RATE] * 4
    farm = _farm(max_stored_bytes_per_tenant=MIB, upload_bytes_per_minute=0)
    keys = [_put(farm, n, size=64) for n in range(40)]
    assert sum(_kept(farm, ALICE, k) for k in keys) == 16


def test_a_tenants_status_counts_its_own_entries_never_anothers():
    """Farm-wide counts would show one tenant when another's compiles land."""
    farm = _farm()
    _artifact(farm, ALICE, 1)
    before = asyncio.run(farm.farm.status(ALICE))
    _artifact(farm, BOB, 2, size=3 * MIB)
    after = asyncio.run(farm.farm.status(ALICE))
    assert (after.artifacts, after.cache_bytes) == (before.artifacts, before.cache_bytes) == (1, before.cache_bytes)
    assert MIB < before.cache_bytes < 2 * MIB
    everyone = asyncio.run(farm.farm.status())  # no tokens: one namespace, the whole cache
    assert everyone.artifacts == 2


def _put_bytes(farm: InProcessFarm, key: str, payload: bytes, tenant: Tenant = ALICE) -> None:
    manifest = Manifest(key=key, fingerprint={"torch": "x"}, payload=BlobRef(blob_digest(payload), len(payload)),
                        tenant=tenant.namespace, kind=PRECOMPILED, graphs={"__compiled_fn_1": "f" * 64})
    upload = farm_pb2.PrecompiledUpload(
        manifest=manifest.to_json(), blobs=[farm_pb2.PrecompiledBlob(digest=manifest.payload.digest, data=payload)]
    )
    asyncio.run(farm.farm.put_precompiled(upload, tenant))


def test_uploading_again_under_one_key_stores_nothing_past_the_quota():
    """A package uploaded again under its key replaces the earlier one, whose blobs
    leave with it: re-uploads once left them stored and charged to no one, unbounded
    bytes past the quota."""
    farm = _farm(max_stored_bytes_per_tenant=4 * MIB, upload_bytes_per_minute=0)
    key = "pc1-" + "a" * 64
    payloads = [bytes([n]) * (3 * MIB // 2) for n in range(6)]
    for payload in payloads:
        _put_bytes(farm, key, payload)
    assert [farm.store.get_blob(blob_digest(p)) is not None for p in payloads] == [False] * 5 + [True]
    assert farm.store.tenant("alice").get_manifest(key).payload.digest == blob_digest(payloads[-1])


def test_a_blob_another_entry_names_outlives_the_package_that_stored_it_first():
    """Content-addressed blobs are shared: bytes one tenant's package stored first, that
    another tenant's artifact names too, stay when the package is evicted."""
    farm = _farm(max_stored_bytes_per_tenant=2 * MIB + MIB // 2, upload_bytes_per_minute=0)
    shared = b"a kernel both compiles produce" * 1000
    _put_bytes(farm, "pc1-" + "b" * 64, shared)
    bobs = f"{7:064x}"
    store = farm.store.tenant(BOB.namespace)
    store.put_blob(blob_digest(shared), shared)
    store.put_manifest(Manifest(key=bobs, fingerprint={}, payload=BlobRef(blob_digest(shared), len(shared)),
                                tenant=BOB.namespace, kind=COMPILE, created=time.time()))
    for n in range(3):  # alice's later packages evict her first
        _put(farm, n)
    assert farm.store.tenant(ALICE.namespace).get_manifest("pc1-" + "b" * 64) is None
    assert _kept(farm, BOB, bobs)


def test_a_package_uploaded_again_never_takes_back_a_blob_another_entry_came_to_name():
    """A re-upload once claimed again every blob the upload it replaces had created,
    though another tenant's artifact had come to name one since; the next re-upload,
    without those bytes, then deleted them from under that artifact."""
    farm = _farm(upload_bytes_per_minute=0)
    shared = b"a kernel both compiles produce" * 1000
    key = "pc1-" + "c" * 64
    _put_bytes(farm, key, shared)
    bobs = f"{8:064x}"
    store = farm.store.tenant(BOB.namespace)
    store.put_blob(blob_digest(shared), shared)
    store.put_manifest(Manifest(key=bobs, fingerprint={}, payload=BlobRef(blob_digest(shared), len(shared)),
                                tenant=BOB.namespace, kind=COMPILE, created=time.time()))
    _put_bytes(farm, key, shared)  # unchanged: the blob stays bob's too
    _put_bytes(farm, key, b"another payload" * 1000)
    assert farm.store.get_blob(blob_digest(shared)) is not None
    assert _kept(farm, BOB, bobs)


def test_a_package_uploaded_again_unchanged_keeps_the_blobs_it_alone_names():
    """What only the package names still leaves with it after an unchanged re-upload."""
    farm = _farm(upload_bytes_per_minute=0)
    first = b"bytes no one else stores" * 1000
    key = "pc1-" + "d" * 64
    _put_bytes(farm, key, first)
    _put_bytes(farm, key, first)
    _put_bytes(farm, key, b"another payload" * 1000)
    assert farm.store.get_blob(blob_digest(first)) is None


def test_a_claim_never_takes_a_blob_another_entry_owns():
    """Two entries that both created a blob (each found it absent): neither owns it, so
    neither one's eviction deletes what the other names."""
    owners = MemoryStore.create().blob_owners()
    owners.claim("alice/pc1-a", ["sha256:1"])
    owners.claim("bob/pc1-b", ["sha256:1"])
    assert owners.release("alice/pc1-a", ["sha256:1"]) == []
    assert owners.release("bob/pc1-b", ["sha256:1"]) == []
