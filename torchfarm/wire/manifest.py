"""The artifact manifest: what a worker built, and what a client checks before loading.

An artifact is a manifest plus content-addressed blobs: the serialized Inductor
artifact (the payload) and, for every kernel, its source and its compiled binary.
The manifest is canonical JSON; it names each blob by digest and size and records the
build fingerprint the artifact was compiled under, so a client can refuse an artifact
for another ISA, compiler or torch build before it deserializes a single byte.

A worker with a signing key adds a `Signature` (torchfarm/trust/signing.py): an Ed25519
signature over a statement that names the key, the tenant's namespace, the content
digest and the fingerprint, and the hash of the manifest's other fields. The signature
lives inside the manifest's JSON, so the two are written, evicted and fetched together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

MANIFEST_FORMAT = "torchfarm.artifact/1"
"""The manifest schema this code writes and reads."""


COMPILE = "compile"
"""Manifest kind: the payload is a serialized Inductor artifact (sdk.compile)."""

EXPORT = "export"
"""Manifest kind: the payload is an AOTInductor .pt2 package (sdk.export)."""

PRECOMPILED = "precompiled"
"""Manifest kind: the payload is a client's Dynamo package (its frames' bytecode and
guards, sdk/precompile.py), signed by a client's precompile key, never by the farm;
`graphs` names the compile artifacts its frames call."""

KERNEL = "kernel"
"""Manifest kind: one Triton kernel compiled for a named GPU target (sdk.compile_kernel):
the payload is Triton's metadata, the one kernel its assembly and binary
(torchfarm/kernels/kernel_artifact.py)."""

PRECOMPILED_PREFIX = "pc1-"
"""How a PRECOMPILED package's key begins; a compile key (hex) never does, so an upload
cannot take a compile artifact's place."""


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
class Signature:
    """An Ed25519 signature of a manifest (see torchfarm/trust/signing.py for what it covers)."""

    key_id: str
    """Which of the farm's signing keys made it; clients pin public keys by this id."""
    signed_at: int
    """Unix seconds."""
    expires_at: int
    """Unix seconds; clients refuse the artifact after this."""
    value: str
    """The 64-byte signature, base64."""
    alg: str = "ed25519"


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
    tenant: str = ""
    """The cache namespace the artifact was compiled for; "" on a farm without tokens."""
    kind: str = COMPILE
    """What the payload is: COMPILE (an Inductor artifact for sdk.compile), EXPORT (an
    AOTInductor .pt2 package for sdk.export), PRECOMPILED or KERNEL (above). Clients
    refuse every kind but the one they asked for."""
    guards: tuple[Any, ...] = ()
    """Shape guards the compile added, each a JSON tree over the client's symbol names
    (torchfarm/fx/guards.py); the client installs them in Dynamo's guards. Empty for a static graph."""
    stages: tuple[dict[str, Any], ...] = ()
    """A staged compile's stage records (workers/jobs/): each has "stage",
    "seconds" (running), "queued_seconds", "worker", "kernels", "kernels_hit". Empty for
    a whole-graph compile, whose `timings` say it all."""
    graphs: dict[str, str] = field(default_factory=dict)
    """A PRECOMPILED package's backends: Dynamo's backend id → the farm's compile
    artifact key whose graph it calls. Empty for every other kind."""
    toolchain: dict[str, Any] = field(default_factory=dict)
    """What the worker's Inductor probed and tuned, so a client need not probe or tune
    again: `vec_isa`, the vector-ISA probe's record (torchfarm/fx/vecisa.py); `autotune`,
    the Triton kernels' autotune records (torchfarm/fx/autotune.py), where any autotuned.
    Empty from older workers, whose clients probe for themselves."""
    signature: Signature | None = None

    def blobs(self) -> list[BlobRef]:
        """Every blob the artifact needs, payload first, without repeats."""
        seen: dict[str, BlobRef] = {self.payload.digest: self.payload}
        for k in self.kernels:
            seen.setdefault(k.source.digest, k.source)
            seen.setdefault(k.binary.digest, k.binary)
        return list(seen.values())

    def total_bytes(self) -> int:
        return sum(b.size for b in self.blobs())

    def content_digest(self) -> str:
        """One digest over every blob the artifact names, by role: what it is made of."""
        body = {
            "payload": asdict(self.payload),
            "kernels": [asdict(k) for k in self.kernels],
        }
        return blob_digest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())

    def to_json(self) -> bytes:
        body = asdict(self)
        body["kernels"] = [asdict(k) for k in self.kernels]
        if self.signature is None:
            del body["signature"]  # unsigned manifests read as they did before signing
        if not self.stages:
            del body["stages"]  # whole-graph manifests read as before the staged pipeline
        else:
            body["stages"] = [dict(s) for s in self.stages]
        if self.kind == COMPILE:
            del body["kind"]  # compile manifests read (and verify) as they did before exports
        if not self.graphs:
            del body["graphs"]  # every kind but PRECOMPILED reads as before
        if not self.toolchain:
            del body["toolchain"]  # manifests of workers that record no probe read as before
        if not self.guards:
            del body["guards"]  # and manifests without guards as before guards
        else:
            body["guards"] = list(self.guards)
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signing_bytes(self) -> bytes:
        """The canonical JSON of every field but the signature: what a signature covers."""
        return dataclasses.replace(self, signature=None).to_json()

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
                tenant=str(body.get("tenant", "")),
                kind=_kind(body.get("kind", COMPILE)),
                guards=_guards(body.get("guards", [])),
                stages=_stages(body.get("stages", [])),
                toolchain=_toolchain(body.get("toolchain", {})),
                graphs=_graphs(body.get("graphs", {})),
                signature=_signature(body.get("signature")),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            # RecursionError: JSON nested past the interpreter's depth (json recurses per level)
            raise ManifestError(f"malformed manifest: {type(e).__name__}: {str(e)[:200]}") from e


def _kind(body: Any) -> str:
    if body not in (COMPILE, EXPORT, PRECOMPILED, KERNEL):
        raise ManifestError(f"unknown artifact kind {body!r}")
    return str(body)


def _graphs(body: Any) -> dict[str, str]:
    if not isinstance(body, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in body.items()
    ):
        raise ManifestError("malformed graphs")
    return dict(body)


def _guards(body: Any) -> tuple[Any, ...]:
    # Only the outer shape here; torchfarm/fx/guards.py reads each tree against an allow-list.
    if not isinstance(body, list) or not all(isinstance(g, list) for g in body):
        raise ManifestError("malformed guards")
    return tuple(body)


def _stages(body: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(body, list) or not all(
        isinstance(s, dict) and isinstance(s.get("stage"), str) for s in body
    ):
        raise ManifestError("malformed stages")
    return tuple(body)


def _toolchain(body: Any) -> dict[str, Any]:
    # Only the outer shape here; torchfarm/fx/vecisa.py reads the record it names.
    if not isinstance(body, dict) or not all(isinstance(k, str) for k in body):
        raise ManifestError("malformed toolchain")
    return dict(body)


def _signature(body: Any) -> Signature | None:
    if body is None:
        return None
    if not isinstance(body, dict):
        raise ManifestError("malformed signature")
    return Signature(
        key_id=str(body["key_id"]),
        signed_at=int(body["signed_at"]),
        expires_at=int(body["expires_at"]),
        value=str(body["value"]),
        alg=str(body.get("alg", "ed25519")),
    )


def check_blobs(manifest: Manifest, blobs: dict[str, bytes]) -> None:
    """Raises ManifestError unless every blob the manifest names is present and intact."""
    for ref in manifest.blobs():
        data = blobs.get(ref.digest)
        if data is None:
            raise ManifestError(f"blob {ref.digest} is missing")
        if len(data) != ref.size or blob_digest(data) != ref.digest:
            raise ManifestError(f"blob {ref.digest} does not match its digest")
