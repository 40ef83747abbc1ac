"""Each tenant pays for what it stores: quotas, an upload rate, and eviction that takes
only the payer's own entries.

The cache Redis evicts by its own LRU, which knows no tenants: one tenant's uploads
filling it would evict another's artifacts and miss explanations. So what a namespace
stores is counted in the state Redis (torchfarm/storage/usage.py), and the coordinator keeps
each namespace within `max_stored_bytes_per_tenant` by evicting that namespace's own
oldest entries, oldest stored first:

- at a precompiled upload (`admit_upload`), before anything is stored: past the upload
  rate, or larger than the whole quota, it is refused; otherwise the uploader's own
  entries go until the upload fits its quota, and, where the cache Redis has a
  `maxmemory`, its own packages go until the upload fits under `cache_fill_limit` of
  it, so Redis never has to evict for it. When the uploader's own would not make room,
  the upload is refused (STORAGE_QUOTA) and nothing is evicted: another tenant's
  entries are never made room of.
- at a compile's submit (`trim`), for what the tenant's finished compiles stored: a
  worker charges each artifact when it writes it (`Store.put_manifest`), so a tenant is
  over its quota by at most the artifacts of its compiles still in flight.

An evicted entry's manifest and use stats are deleted, and the blobs its own upload
created (none existed before it); blobs a compile wrote, which other artifacts may
share by content, are left to Redis's LRU and `torchfarm gc`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from services.coordinator import metrics
from services.coordinator.errors import StorageFull
from services.coordinator.settings import CoordinatorSettings
from torchfarm.storage.store import Store
from torchfarm.storage.usage import Ledger
from torchfarm.wire import keys as farm_keys
from torchfarm.wire.codes import Reason

log = logging.getLogger(__name__)

RATE_WINDOW_S = 60
"""The upload rate's window (`upload_bytes_per_minute`)."""

MIN_UPLOAD_BYTES = 1024 * 1024
"""Each upload counts at least this against the rate, so tiny packages cannot be sent
by the hundred thousand."""


def admit_upload(store: Store, settings: CoordinatorSettings, nbytes: int) -> None:
    """Makes room for an upload of `nbytes` in `store`'s namespace, evicting only its
    own entries; StorageFull (STORAGE_QUOTA or UPLOAD_RATE) when it cannot."""
    ledger = store.ledger()
    quota = settings.max_stored_bytes_per_tenant
    who = _who(store)
    if quota and nbytes > quota:
        raise _refused(f"an upload of {nbytes} bytes is larger than {who}'s storage quota ({quota} bytes)")
    limit = settings.upload_bytes_per_minute
    if limit:
        used = ledger.spend(max(nbytes, MIN_UPLOAD_BYTES), limit, RATE_WINDOW_S)
        if used is not None:
            raise _refused(
                f"{who} uploaded {used} bytes in the last minute; {nbytes} more is over its rate "
                f"of {limit} bytes a minute: retry later", Reason.UPLOAD_RATE,
            )
    trim(store, quota, nbytes)
    _make_cache_room(store, ledger, nbytes, settings.cache_fill_limit)


def _make_cache_room(store: Store, ledger: Ledger, nbytes: int, fill: float) -> None:
    """Evicts the namespace's own packages, oldest first, until `nbytes` more keep the
    cache Redis under `fill` of its maxmemory. Only entries whose eviction frees memory
    count (those whose upload created blobs); when even all of them would not make
    room, nothing is evicted and the upload is refused."""
    used, maxmemory = store.cache_memory()
    if not maxmemory or used + nbytes <= fill * maxmemory:
        return
    freeable = [k for k in ledger.keys() if ledger.created_blobs(k)]
    if sum(ledger.charged(k) for k in freeable) < used + nbytes - fill * maxmemory:
        raise _refused(
            f"no room for an upload of {nbytes} bytes: the cache is full of other entries, "
            f"and {_who(store)}'s own packages would not make room"
        )
    for key in freeable:
        evict(store, ledger, key)
        used, _ = store.cache_memory()
        if used + nbytes <= fill * maxmemory:
            return
    raise _refused(f"no room for an upload of {nbytes} bytes in the cache")


def trim(store: Store, quota: int, incoming: int = 0) -> None:
    """Evicts the namespace's own oldest entries while they and `incoming` more bytes
    are over `quota` (0: no quota)."""
    ledger = store.ledger()
    if not quota or ledger.total() + incoming <= quota:
        return
    total = reconcile(store, ledger)
    for key in ledger.keys():
        if total + incoming <= quota:
            return
        total = evict(store, ledger, key)


def reconcile(store: Store, ledger: Ledger) -> int:
    """Stops counting entries whose manifest the cache no longer holds (expired,
    evicted by Redis or by `torchfarm cache evict`), with the blobs their uploads
    created; returns the total left."""
    keys = ledger.keys()
    gone = [k for k, present in zip(keys, store.artifacts_present(keys), strict=True) if not present]
    for key in gone:
        _drop_created_blobs(store, ledger, key)
    return ledger.release(gone)


def evict(store: Store, ledger: Ledger, key: str) -> int:
    """Deletes one of the namespace's entries to make room; returns the total left."""
    store.evict_artifacts([key])
    _drop_created_blobs(store, ledger, key)
    metrics.STORAGE_EVICTIONS.inc()
    log.info("key=%s evicted to keep %s within its storage quota", farm_keys.short(key), _who(store))
    return ledger.release([key])


def _drop_created_blobs(store: Store, ledger: Ledger, key: str) -> None:
    drop_owned_blobs(store, key, ledger.created_blobs(key))


def drop_owned_blobs(store: Store, key: str, digests: Iterable[str]) -> None:
    """Deletes those of `digests` the entry `key` created and still owns: never a blob
    another entry, of any tenant, names too (torchfarm/storage/usage.py `BlobOwners`)."""
    owners = store.blob_owners()
    for digest in owners.release(owners.owner(store.namespace, key), digests):
        store.delete_blob(digest)


def _refused(message: str, reason: Reason = Reason.STORAGE_QUOTA) -> StorageFull:
    metrics.STORAGE_REFUSALS.labels(reason=reason.value).inc()
    return StorageFull(message, reason)


def _who(store: Store) -> str:
    return f"namespace {store.namespace!r}" if store.namespace else "this farm's (open) namespace"
