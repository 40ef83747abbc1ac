"""`PutPrecompiled`: a client's precompiled-frame package stored in its namespace.

The package's payload is a pickle of Dynamo's state made by the client that ran the
model (sdk/precompile.py). The coordinator never reads it: it parses the JSON manifest,
checks the key's prefix, the kind, the namespace, the size and every blob's digest,
and stores manifest and blobs as it stores a compile artifact, for FetchArtifact,
within the tenant's storage quota and upload rate (storage.py), expiring after
`precompiled_ttl_s`.
Who may load it is the clients' decision: only under a pinned precompile key.
The upload's record of the key's components (`PrecompiledRecord`), checked for bounds,
is indexed to explain later misses of the same model (torchfarm/storage/explain.py).
"""

from __future__ import annotations

import logging

from services.coordinator import storage
from services.coordinator.errors import InvalidRequest, RequestTooLarge
from torchfarm.storage import explain
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from torchfarm.wire.manifest import PRECOMPILED, PRECOMPILED_PREFIX, Manifest, ManifestError, check_blobs

log = logging.getLogger(__name__)


MAX_MANIFEST_BYTES = 1 << 20
"""Largest manifest of a precompiled package: it names its graphs' keys and its blobs,
and every cache listing of the namespace parses it."""


def check_upload(
    upload: farm_pb2.PrecompiledUpload, namespace: str, max_bytes: int
) -> tuple[Manifest, dict[str, bytes], explain.Record | None]:
    """The manifest, blobs and checked record (None when it has none) of a well-formed
    upload for `namespace`; InvalidRequest (RequestTooLarge over `max_bytes`) otherwise."""
    if upload.ByteSize() > max_bytes:
        raise RequestTooLarge(f"precompiled package of {upload.ByteSize()} bytes is over the limit of {max_bytes}")
    if len(upload.manifest) > MAX_MANIFEST_BYTES:
        raise InvalidRequest(
            f"precompiled package refused: its manifest is {len(upload.manifest)} bytes, over {MAX_MANIFEST_BYTES}"
        )
    try:
        manifest = Manifest.from_json(upload.manifest)
    except ManifestError as e:
        raise InvalidRequest(f"precompiled package refused: {e}") from e
    if manifest.kind != PRECOMPILED:
        raise InvalidRequest(f"precompiled package refused: its kind is {manifest.kind!r}")
    check_key(manifest.key, "precompiled package refused")
    if manifest.tenant != namespace:
        raise InvalidRequest("precompiled package refused: it names another namespace")
    if manifest.kernels:
        raise InvalidRequest("precompiled package refused: it carries kernels")
    record = None
    if upload.HasField("record"):
        try:
            record = explain.check_precompiled(upload.record, manifest.key)
        except ValueError as e:
            raise InvalidRequest(f"precompiled package refused: {e}") from e
    blobs = {b.digest: b.data for b in upload.blobs}
    try:
        check_blobs(manifest, blobs)
    except ManifestError as e:
        raise InvalidRequest(f"precompiled package refused: {e}") from e
    return manifest, blobs, record


def check_key(key: str, what: str) -> None:
    """InvalidRequest unless `key` is a precompiled key (no compile key has its prefix)
    made of what the farm names its Redis keys with (`keys.NAMED_KEY`)."""
    if not key.startswith(PRECOMPILED_PREFIX) or not keys.NAMED_KEY.match(key):
        raise InvalidRequest(f"{what}: key {key[:20]!r} is not a precompiled key")


def store_upload(store: Store, manifest: Manifest, blobs: dict[str, bytes], ttl_s: int) -> None:
    """Stores the package, expiring after `ttl_s` (0: never). The blobs it creates are
    recorded with its charge, so they leave the cache when it is evicted. A package
    uploaded again under its key replaces the earlier one: the blobs that one created
    and this one does not name leave now (else they stayed, charged to no one); those
    it names too stay its own only while no other entry has come to name them."""
    refs = list(manifest.blobs())
    existed = store.blobs.present(r.digest for r in refs)
    for ref in refs:
        store.put_blob(ref.digest, blobs[ref.digest])
    earlier = store.ledger().created_blobs(manifest.key)
    named = {r.digest for r in refs}
    created = [r.digest for r, there in zip(refs, existed, strict=True) if not there]
    kept = [d for d in earlier if d in named and d not in created]
    store.put_manifest(manifest, ttl_s=ttl_s, created_blobs=created, kept_blobs=kept)
    storage.drop_owned_blobs(store, manifest.key, (d for d in earlier if d not in named))
    log.info("key=%s precompiled package stored (%d frames' backends)", keys.short(manifest.key), len(manifest.graphs))
