"""The coordinator's cache view: list and evict the caller's artifacts. Free of gRPC and torch.

Everything here goes through `Store.tenant(namespace)`: a tenant lists, counts and
evicts only its own namespace's entries. An entry is a manifest (`tf:artifact:<key>`)
with its use stats (`tf:stat:<key>`: hits, last hit, label), which `Farm.submit`
updates on every cache hit.

A listing or an eviction reads and parses every manifest of the namespace, so a tenant
runs `max_listings_per_tenant` of them at once at most, and parses in its share of the
check threads (runner.py): a namespace of tens of thousands of entries takes seconds.

Evicting removes the manifest and its stats; the key compiles again on its next submit.
Blobs are not deleted: they are content-addressed and shared between entries and
between namespaces (and with the kernel records), so knowing that none refers to a
blob any more would take a scan of every namespace, racing the workers that write
new manifests. Unreferenced blobs are left to the cache Redis's `allkeys-lru` policy
under its `maxmemory` (docs/operations.md).
"""

from __future__ import annotations

import bisect
import builtins
import logging
import re
import time
from dataclasses import dataclass, field

from services.coordinator.errors import InvalidRequest
from services.coordinator.farm import Farm
from services.coordinator.ratelimit import TenantSlots
from services.coordinator.runner import Runner
from torchfarm.trust.tokens import OPEN, Tenant
from torchfarm.wire import keys, targets
from torchfarm.wire.codes import Reason
from torchfarm.wire.manifest import Manifest, ManifestError

log = logging.getLogger(__name__)

MAX_FILTER_KEYS = 1024
"""Most keys (or prefixes) one cache query or eviction may name."""

KEY_CHARS = 64
"""A compile key's length: SHA-256 in hex."""

MIN_PREFIX = 8
"""Shortest key prefix `evict` and `ls` accept, so a typo cannot match half the cache."""

_HEX = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True)
class Entry:
    key: str
    label: str
    target: str
    bytes: int
    hits: int
    created: float
    last_hit: float
    kernels: int
    worker: str
    digests: dict[str, int]
    """Every blob's digest and size, to count shared blobs once in totals."""


@dataclass(frozen=True)
class Totals:
    entries: int = 0
    bytes: int = 0
    hits: int = 0


@dataclass(frozen=True)
class Listing:
    entries: list[Entry]
    """At most the query's limit, newest first."""
    matched: Totals
    by_target: dict[str, Totals] = field(default_factory=dict)


@dataclass(frozen=True)
class Filters:
    target: str = ""
    older_than_s: float = 0.0
    keys: tuple[str, ...] = ()


def target_of(manifest: Manifest) -> str:
    """The target an artifact was compiled for, from its build fingerprint."""
    fp = manifest.fingerprint
    device = fp.get("device", "")
    detail = fp.get("isa", "") if device == "cpu" else fp.get("arch", "")
    try:
        return str(targets.make(device, detail))
    except targets.TargetError:
        return f"{device}:{detail}" if detail else device or "?"


def _entry(key: str, data: bytes, stats: dict[str, str]) -> Entry | None:
    try:
        manifest = Manifest.from_json(data)
    except ManifestError:
        log.warning("key=%s has a corrupt manifest; not listed", keys.short(key))
        return None
    return Entry(
        key=key,
        label=stats.get("label", ""),
        target=target_of(manifest),
        bytes=manifest.total_bytes(),
        hits=int(stats.get("hits", 0)),
        created=manifest.created,
        last_hit=float(stats.get("last_hit", 0)),
        kernels=len(manifest.kernels),
        worker=manifest.worker,
        digests={b.digest: b.size for b in manifest.blobs()},
    )


def _totals(entries: list[Entry]) -> Totals:
    blobs: dict[str, int] = {}
    for e in entries:
        blobs.update(e.digests)
    return Totals(len(entries), sum(blobs.values()), sum(e.hits for e in entries))


class CacheService:
    def __init__(self, farm: Farm, runner: Runner):
        self.farm = farm
        self.runner = runner
        """Where each blocking store call runs: the one `farm` uses."""
        self._running = TenantSlots(
            farm.settings.max_listings_per_tenant, "cache listings and evictions", Reason.LISTING_LIMIT)

    async def list(self, filters: Filters, limit: int, tenant: Tenant = OPEN) -> Listing:
        async with self._running.hold(tenant):
            matched = await self._matching(filters, tenant)
        by_target: dict[str, list[Entry]] = {}
        for e in matched:
            by_target.setdefault(e.target, []).append(e)
        return Listing(
            entries=matched[:limit],
            matched=_totals(matched),
            by_target={t: _totals(es) for t, es in sorted(by_target.items())},
        )

    # `builtins.list`: in this class, after `def list`, a bare `list` names the method.
    async def evict(self, filters: Filters, everything: bool, tenant: Tenant = OPEN) -> builtins.list[Entry]:
        if not (everything or filters.keys or filters.target or filters.older_than_s):
            raise InvalidRequest(
                "evict needs keys, all, or a filter (target, older than)", Reason.NOTHING_TO_EVICT
            )
        async with self._running.hold(tenant):
            matched = await self._matching(filters, tenant)
            store = self.farm.store.tenant(tenant.namespace)
            await self.runner.run(store.evict_artifacts, [e.key for e in matched])
        for e in matched:
            log.info("key=%s evicted (%s, %d bytes, %d hits)", keys.short(e.key), e.target,
                     e.bytes, e.hits)
        return matched

    async def _matching(self, filters: Filters, tenant: Tenant) -> builtins.list[Entry]:
        """The tenant's entries the filters match, newest first."""
        wanted = _check_filters(filters)
        rows = await self.runner.run(self.farm.store.tenant(tenant.namespace).my_artifacts)
        return await self.runner.compute(_matched, rows, filters, wanted, tenant=tenant.namespace)


def _matched(rows: builtins.list[tuple[str, bytes, dict[str, str]]], filters: Filters,
             wanted: str) -> builtins.list[Entry]:
    entries = [e for e in (_entry(*row) for row in rows) if e is not None]
    if filters.keys:
        entries = _by_prefix(entries, filters.keys)
    now = time.time()
    return sorted(
        (
            e for e in entries
            if (not wanted or e.target == wanted)
            and (not filters.older_than_s or now - e.created >= filters.older_than_s)
        ),
        key=lambda e: e.created,
        reverse=True,
    )


def _check_filters(filters: Filters) -> str:
    """The canonical target filter ("" for none); InvalidRequest for a bad filter."""
    if filters.older_than_s < 0:
        raise InvalidRequest("older_than_seconds must not be negative", Reason.INVALID_FILTER)
    if len(filters.keys) > MAX_FILTER_KEYS:
        raise InvalidRequest(
            f"{len(filters.keys)} keys named; a query names at most {MAX_FILTER_KEYS}", Reason.INVALID_FILTER
        )
    for k in filters.keys:
        if not MIN_PREFIX <= len(k) <= KEY_CHARS or not _HEX.fullmatch(k):
            raise InvalidRequest(
                f"{k[:80]!r} is not a key or a prefix of {MIN_PREFIX} to {KEY_CHARS} lower-case hex digits",
                Reason.INVALID_FILTER,
            )
    if not filters.target:
        return ""
    try:
        return str(targets.parse(filters.target))
    except targets.TargetError as e:
        raise InvalidRequest(str(e), Reason.UNKNOWN_TARGET) from e


def _by_prefix(entries: list[Entry], prefixes: tuple[str, ...]) -> list[Entry]:
    """The entries the prefixes name; an ambiguous prefix is an error, an unknown one
    matches nothing (the caller sees which keys were found)."""
    ordered = sorted(entries, key=lambda e: e.key)
    names = [e.key for e in ordered]
    found: dict[str, Entry] = {}
    for p in prefixes:
        # A prefix's keys sort together, before the prefix followed by a non-hex character.
        hits = ordered[bisect.bisect_left(names, p):bisect.bisect_left(names, p + "g")]
        if len(hits) > 1:
            raise InvalidRequest(
                f"key prefix {p!r} matches {len(hits)} entries; give more digits",
                Reason.AMBIGUOUS_KEY,
            )
        found.update((e.key, e) for e in hits)
    return list(found.values())
