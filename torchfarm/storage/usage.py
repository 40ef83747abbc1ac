"""What each namespace keeps in the cache, counted where nothing is evicted.

The cache Redis may evict (`allkeys-lru`), and its eviction knows nothing of tenants:
one tenant's uploads filling it evict another's artifacts. So every manifest written in
a namespace (a worker's artifact or a client's precompiled package, `Store.put_manifest`)
is charged to that namespace in the state Redis, which never evicts, and the coordinator
keeps each namespace within its quota by evicting that namespace's own oldest entries
(services/coordinator/storage.py). Keys, under the prefix:

- `tf:stored:<ns>`: sorted set of the namespace's artifact keys by when each was stored;
- `tf:storedbytes:<ns>`: hash of key → the bytes charged for it (`~total`: their sum),
  and key → the blobs its upload created (`~blobs:<key>`), which leave with it;
- `tf:uploaded:<ns>:<window>`: bytes uploaded in one rate window, expiring with it;
- `tf:blobowner:<digest>`: the entry (`<ns>/<key>`) that created a blob which leaves the
  cache with it (`BlobOwners`). Blobs are content-addressed and shared: any later entry
  that names the blob takes its owner away, for good, so no entry's eviction deletes
  bytes another entry, of any tenant, still names.

The open farm's unnamed namespace is `-`. An entry whose manifest the cache lost (its
expiry, Redis's own eviction, `torchfarm cache evict`) is dropped when found
(`Ledger.reconcile`), so the count never holds a namespace to what it no longer has.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import cast

import redis

TOTAL = "~total"
"""The hash field holding the namespace's sum."""

MIN_ENTRY_BYTES = 64 * 1024
"""Each entry is charged at least this, so a namespace's ledger holds at most its quota
over this many entries however small its packages are."""

_BLOBS = "~blobs:"
"""Prefix of the hash field listing the blobs an entry's upload created."""

_CHARGE = """
-- KEYS: stored zset, bytes hash. ARGV: key, bytes, now, created blobs (JSON; "" none).
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then redis.call('HINCRBY', KEYS[2], '~total', -tonumber(old)) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], '~blobs:' .. ARGV[1], ARGV[4]) end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return redis.call('HINCRBY', KEYS[2], '~total', ARGV[2])
"""
"""Charges one entry, replacing its earlier charge, in one step."""

_RELEASE = """
-- KEYS: stored zset, bytes hash. ARGV: keys.
for _, key in ipairs(ARGV) do
  local old = redis.call('HGET', KEYS[2], key)
  if old then redis.call('HINCRBY', KEYS[2], '~total', -tonumber(old)) end
  redis.call('HDEL', KEYS[2], key, '~blobs:' .. key)
  redis.call('ZREM', KEYS[1], key)
end
return tonumber(redis.call('HGET', KEYS[2], '~total') or '0')
"""
"""Forgets entries, and their bytes, in one step."""


class Ledger:
    """One namespace's stored entries and bytes, in the state Redis."""

    def __init__(self, state: redis.Redis, prefix: str, namespace: str):
        self.r = state
        name = namespace or "-"
        self.zset = f"{prefix}:stored:{name}"
        self.hash = f"{prefix}:storedbytes:{name}"
        self.uploads = f"{prefix}:uploaded:{name}"
        self._charge = state.register_script(_CHARGE)
        self._release = state.register_script(_RELEASE)

    def charge(self, key: str, nbytes: int, created_blobs: Iterable[str] = (), now: float | None = None) -> int:
        """Counts `nbytes` (at least MIN_ENTRY_BYTES) for `key`, its earlier charge
        replaced; returns the total. `created_blobs`: the blobs that did not exist
        before this entry stored them, which leave the cache with it."""
        created = sorted(created_blobs)
        total = self._charge(
            keys=[self.zset, self.hash],
            args=[
                key, max(int(nbytes), MIN_ENTRY_BYTES), time.time() if now is None else now,
                json.dumps(created) if created else "",
            ],
        )
        return int(cast(int, total))

    def release(self, keys: Iterable[str]) -> int:
        """Forgets these entries; returns the total left."""
        keys = list(keys)
        if not keys:
            return self.total()
        return int(cast(int, self._release(keys=[self.zset, self.hash], args=keys)))

    def total(self) -> int:
        return int(cast("bytes | None", self.r.hget(self.hash, TOTAL)) or 0)

    def keys(self) -> list[str]:
        """Every charged key, oldest first."""
        return [k.decode() for k in cast("list[bytes]", self.r.zrange(self.zset, 0, -1))]

    def charged(self, key: str) -> int:
        """The bytes charged for `key` (0: none)."""
        return int(cast("bytes | None", self.r.hget(self.hash, key)) or 0)

    def created_blobs(self, key: str) -> list[str]:
        raw = cast("bytes | None", self.r.hget(self.hash, _BLOBS + key))
        return list(json.loads(raw)) if raw else []

    def spend(self, nbytes: int, limit: int, window_s: int, now: float | None = None) -> int | None:
        """Counts `nbytes` against this window's `limit`: None when they fit (and are
        counted), else the bytes already uploaded in the window (and nothing counted)."""
        window = int((time.time() if now is None else now) // window_s)
        name = f"{self.uploads}:{window}"
        used = int(self.r.incrby(name, nbytes))
        self.r.expire(name, 2 * window_s)
        if used <= limit:
            return None
        self.r.decrby(name, nbytes)
        return used - nbytes


_RELEASE_OWNED = """
-- KEYS: owner keys, one per blob. ARGV: the owner. Returns the indexes still owned by it.
local owned = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    table.insert(owned, i - 1)
  end
end
return owned
"""
"""Gives up the blobs an entry still owns, in one step, and says which they were."""

_CLAIM = """
-- KEYS: owner keys, one per blob. ARGV: the owner, then per key 'c' (this write created
-- the blob) or 'k' (an earlier write of this entry created it). Returns the indexes owned.
local owned = {}
for i, key in ipairs(KEYS) do
  local now = redis.call('GET', key)
  if now == ARGV[1] then
    table.insert(owned, i - 1)
  elseif not now and ARGV[i + 1] == 'c' then
    redis.call('SET', key, ARGV[1])
    table.insert(owned, i - 1)
  elseif now then
    redis.call('DEL', key)
  end
end
return owned
"""
"""Takes the blobs an entry created, in one step: never one another entry owns (that
entry and this one both name it: it is shared now), nor, of those an earlier write
created, one whose owner was dropped since (another entry named it)."""


class BlobOwners:
    """Which entry created each blob that leaves the cache with it. An entry owns the
    blobs its upload created until another entry names one (`share`): only the blobs it
    still owns are deleted with it (`release`)."""

    def __init__(self, state: redis.Redis, prefix: str):
        self.r = state
        self.prefix = f"{prefix}:blobowner:"
        self._release = state.register_script(_RELEASE_OWNED)
        self._claim = state.register_script(_CLAIM)

    @staticmethod
    def owner(namespace: str, key: str) -> str:
        return f"{namespace or '-'}/{key}"

    def claim(self, owner: str, created: Iterable[str], kept: Iterable[str] = ()) -> list[str]:
        """Of the blobs this write `created` and those an earlier write of the same entry
        created (`kept`), those `owner` owns now. A blob is owned by one entry or by
        none: a record naming another entry is dropped, not taken, and a kept blob whose
        record was dropped stays shared (a re-upload once took it back, and deleted it
        from under the entry that had come to name it)."""
        roles = {d: "k" for d in kept} | {d: "c" for d in created}
        if not roles:
            return []
        digests = list(roles)
        owned = cast("list[int]", self._claim(
            keys=[self.prefix + d for d in digests], args=[owner, *roles.values()],
        ))
        return [digests[int(i)] for i in owned]

    def share(self, digests: Iterable[str]) -> None:
        """These blobs are named by more than the entry that created them: no eviction
        deletes them; Redis's own eviction or `torchfarm gc` does, once nothing names them."""
        names = [self.prefix + d for d in digests]
        if names:
            self.r.delete(*names)

    def release(self, owner: str, digests: Iterable[str]) -> list[str]:
        """Of `digests`, those `owner` still owned, now owned by no one: to delete."""
        digests = list(digests)
        if not digests:
            return []
        owned = cast("list[int]", self._release(keys=[self.prefix + d for d in digests], args=[owner]))
        return [digests[int(i)] for i in owned]
