"""Collecting blobs that nothing references any more.

A blob is referenced while any record in the cache or state Redis names its digest: an
artifact's manifest (any namespace), a kernel record, a staged compile's kernel-cache
entry, plan or barrier. Rather than know every record's shape, the collector reads the
values of every key under the prefix except the blobs themselves and keeps each
`sha256:<hex>` it finds; a record added tomorrow that names a blob keeps it alive too.
The records that hold what a client sent (`CLIENT_TEXT`) are skipped: they never name a
blob the farm stores, and a client must not keep one alive by writing its digest there.
Of a precompiled package's manifest, also a client's upload, only the blobs it names count.

Workers write blobs before the records that name them, so a blob can be unreferenced
for a moment while its manifest is on the way: only blobs older than the grace period
go. On Redis the age is the idle time (since the blob was last read or written), on
object storage the time since it was written (so a size bound there goes oldest
written first, not least recently used).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import cast

import redis

from torchfarm.storage.blobs import BlobInfo
from torchfarm.storage.store import Store
from torchfarm.wire.manifest import PRECOMPILED, PRECOMPILED_PREFIX, Manifest, ManifestError

log = logging.getLogger(__name__)

DIGEST = re.compile(rb"sha256:[0-9a-f]{64}")

CLIENT_TEXT = ("req", "kreq", "job", "stat", "explain", "explainidx", "explainparts", "why", "whyidx")
"""Kinds of records (torchfarm/storage/store.py, explain.py) whose values are a client's
requests, labels and miss records, or a job's progress: none names a stored blob."""

DEFAULT_GRACE_S = 24 * 3600.0
"""A day: far longer than any compile takes to write its blobs, then its records."""


def _values(store: Store) -> Iterator[bytes]:
    # Both Redis roles: manifests and kernel records are in the cache, the plans and
    # barriers of compiles in flight in the state Redis (torchfarm/storage/store.py).
    for client in (store.c, store.r) if store.split else (store.c,):
        yield from _values_in(client, store.prefix)


def _values_in(client: redis.Redis, prefix: str) -> Iterator[bytes]:
    skipped = tuple(f"{prefix}:{kind}:".encode() for kind in ("blob", "blobparts", *CLIENT_TEXT))
    manifests = f"{prefix}:artifact:".encode()
    for name in client.scan_iter(match=f"{prefix}:*", count=1000):
        if name.startswith(skipped):
            continue
        kind = client.type(name)
        if kind == b"string":
            value = cast("bytes | None", client.get(name)) or b""  # a client that never decodes
            # A precompiled package's key (`<prefix>:artifact:[<ns>:]pc1-...`): its
            # manifest is parsed; every other value is read as it is.
            package = name.startswith(manifests) and name.rsplit(b":", 1)[-1].startswith(_PACKAGE)
            yield _named_blobs(value) if package else value
        elif kind == b"hash":
            yield from cast("list[bytes]", client.hvals(name))
        elif kind == b"list":
            yield from cast("list[bytes]", client.lrange(name, 0, -1))


_PACKAGE = PRECOMPILED_PREFIX.encode()


def _named_blobs(manifest: bytes) -> bytes:
    """Of a precompiled package's manifest, a client's upload, the blobs it names, not
    its other text, whose fingerprint or worker field could otherwise keep any blob
    alive. A value that is no such manifest is kept whole."""
    try:
        parsed = Manifest.from_json(manifest)
    except ManifestError:
        return manifest
    if parsed.kind != PRECOMPILED:
        return manifest
    return " ".join(b.digest for b in parsed.blobs()).encode()


def referenced(store: Store) -> set[str]:
    """Every blob digest some record in the cache or state Redis names."""
    return {m.decode() for value in _values(store) for m in DIGEST.findall(value)}


def collect(store: Store, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False,
            max_age_s: float = 0.0, max_bytes: int = 0) -> list[BlobInfo]:
    """Deletes (unless `dry_run`) the blobs no record names that are older than
    `grace_s`, and returns them.

    Per-store bounds, each off at 0: `max_age_s` also takes blobs older than that,
    named or not; `max_bytes` then takes the oldest blobs until the rest fit. A manifest
    whose blob went this way is a miss (Store.get_manifest), so its key compiles again."""
    keep = referenced(store)
    blobs = list(store.blobs.list())
    garbage = [b for b in blobs if (b.digest not in keep and b.age_s >= grace_s)
               or (max_age_s and b.age_s >= max_age_s)]
    if max_bytes:
        chosen = {b.digest for b in garbage}
        left = sorted((b for b in blobs if b.digest not in chosen), key=lambda b: b.age_s)
        total = sum(b.size for b in left)
        while left and total > max_bytes:
            oldest = left.pop()
            garbage.append(oldest)
            total -= oldest.size
    if not dry_run:
        for blob in garbage:
            store.blobs.delete(blob.digest)
        log.info("collected %d unreferenced blobs, %d bytes", len(garbage), sum(b.size for b in garbage))
    return garbage
