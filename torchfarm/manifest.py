"""The artifact manifest: what a worker built, and what a client checks before loading.

An artifact is a manifest plus content-addressed blobs: the serialized Inductor
artifact (the payload) and, for every kernel, its source and its compiled binary.
The manifest is canonical JSON; it names each blob by digest and size and records the
build fingerprint the artifact was compiled under, so a client can refuse an artifact
for another ISA, compiler or torch build before it deserializes a single byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

MANIFEST_FORMAT = "torchfarm.artifact/1"
"""The manifest schema this code writes and reads."""


class ManifestError(ValueError):
    """The manifest is malformed, of an unknown format, or does not match its blobs."""


def blob_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BlobRef:
    digest: str
    size: int


@dataclass(frozen=True)
class KernelRef:
    name: str
    kind: str  # "cpp" today; "cubin" and "hsaco" for GPU targets
    source: BlobRef
    binary: BlobRef


@dataclass(frozen=True)
class Manifest:
    key: str
    fingerprint: dict[str, str]
    payload: BlobRef
    kernels: tuple[KernelRef, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    worker: str = ""
    created: float = 0.0
    format: str = MANIFEST_FORMAT

    def blobs(self) -> list[BlobRef]:
        """Every blob the artifact needs, payload first, without repeats."""
        seen: dict[str, BlobRef] = {self.payload.digest: self.payload}
        for k in self.kernels:
            seen.setdefault(k.source.digest, k.source)
            seen.setdefault(k.binary.digest, k.binary)
        return list(seen.values())

    def total_bytes(self) -> int:
        return sum(b.size for b in self.blobs())

    def to_json(self) -> bytes:
        body = asdict(self)
        body["kernels"] = [asdict(k) for k in self.kernels]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            body: dict[str, Any] = json.loads(data)
            if body.get("format") != MANIFEST_FORMAT:
                raise ManifestError(f"unknown manifest format {body.get('format')!r}")
            return cls(
                key=str(body["key"]),
                fingerprint={str(k): str(v) for k, v in body["fingerprint"].items()},
                payload=BlobRef(**body["payload"]),
                kernels=tuple(
                    KernelRef(
                        name=k["name"],
                        kind=k["kind"],
                        source=BlobRef(**k["source"]),
                        binary=BlobRef(**k["binary"]),
                    )
                    for k in body["kernels"]
                ),
                timings={str(k): float(v) for k, v in body["timings"].items()},
                worker=str(body["worker"]),
                created=float(body["created"]),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"malformed manifest: {e}") from e


def check_blobs(manifest: Manifest, blobs: dict[str, bytes]) -> None:
    """Raises ManifestError unless every blob the manifest names is present and intact."""
    for ref in manifest.blobs():
        data = blobs.get(ref.digest)
        if data is None:
            raise ManifestError(f"blob {ref.digest} is missing")
        if len(data) != ref.size or blob_digest(data) != ref.digest:
            raise ManifestError(f"blob {ref.digest} does not match its digest")
