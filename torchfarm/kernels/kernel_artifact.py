"""A compiled Triton kernel as a signed artifact: what the worker stores, what a client checks.

The record `tf:kernel:<key>` is a Manifest (torchfarm/wire/manifest.py) of kind KERNEL:

- `payload`: Triton's metadata (kernel name, num_warps, shared memory, ...), canonical JSON;
- `kernels`: one KernelRef, its `source` the PTX or AMDGCN text, its `binary` the cubin
  or hsaco;
- `fingerprint`: the target and the Triton version the kernel was built for;
- `timings["kernel"]`: Triton's compile seconds.

Where the farm signs, the worker signs it as it signs a graph's artifact
(torchfarm/trust/signing.py): the statement names the kernel key, the tenant's
namespace, every blob by digest and that fingerprint. A client (`check_reply`) trusts
nothing in a `KernelReply` but what the manifest vouches for, against the key it
computes itself from its own request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from torchfarm.kernels import elf
from torchfarm.trust.signing import SignatureError, TrustedKeys
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, targets
from torchfarm.wire.codes import Rejection
from torchfarm.wire.manifest import (
    KERNEL,
    BlobRef,
    KernelRef,
    Manifest,
    ManifestError,
    blob_digest,
    check_blobs,
)


class KernelRefused(ValueError):
    """The farm's answer is not a kernel this client can trust; `reason` says why."""

    def __init__(self, reason: Rejection, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CheckedKernel:
    """A reply's kernel, every field taken from the checked manifest and blobs."""

    manifest: Manifest
    binary: bytes
    assembly: str
    metadata: dict[str, Any]
    info: elf.KernelBinaryInfo

    @property
    def kind(self) -> str:
        return self.manifest.kernels[0].kind

    @property
    def triton_version(self) -> str:
        return self.manifest.fingerprint["triton_version"]


def fingerprint(target: str, triton_version: str) -> dict[str, str]:
    """What a kernel is built for: its exact target and the Triton that compiled it."""
    return {"target": target, "triton_version": triton_version}


def build_manifest(
    key: str,
    namespace: str,
    *,
    target: str,
    triton_version: str,
    name: str,
    kind: str,
    binary: bytes,
    assembly: str,
    metadata: dict[str, Any],
    worker: str,
    seconds: float,
) -> tuple[Manifest, dict[str, bytes]]:
    """The unsigned manifest of a compiled kernel, and its blobs by digest."""
    blobs = {
        "metadata": json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode(),
        "assembly": assembly.encode(),
        "binary": binary,
    }
    refs = {role: BlobRef(blob_digest(data), len(data)) for role, data in blobs.items()}
    manifest = Manifest(
        key=key,
        fingerprint=fingerprint(target, triton_version),
        payload=refs["metadata"],
        kernels=(KernelRef(name=name, kind=kind, source=refs["assembly"], binary=refs["binary"]),),
        timings={"kernel": seconds},
        worker=worker,
        created=time.time(),
        tenant=namespace,
        kind=KERNEL,
    )
    return manifest, {refs[role].digest: data for role, data in blobs.items()}


def expected_key(request: farm_pb2.KernelRequest, reply_version: str, namespace: str) -> str:
    """The key the reply must be for, with `reply_version` as its Triton: the request's
    version, or, where the request left it to the farm, the one the farm says it chose."""
    if request.triton_version and reply_version != request.triton_version:
        raise KernelRefused(
            Rejection.MISMATCH,
            f"the farm compiled with Triton {reply_version!r}; the request named {request.triton_version!r}",
        )
    pinned = farm_pb2.KernelRequest()
    pinned.CopyFrom(request)
    pinned.triton_version = reply_version
    return keys.compute_kernel_key(pinned, namespace)


def check_reply(
    reply: farm_pb2.KernelReply,
    request: farm_pb2.KernelRequest,
    *,
    namespace: str,
    trusted: TrustedKeys | None,
) -> CheckedKernel:
    """The reply's kernel once its manifest (signed by a key in `trusted`, unless that is
    None: a development farm named as unsigned) answers this request in `namespace`, its
    blobs match their digests and the binary is code for the request's target;
    KernelRefused otherwise."""
    key = expected_key(request, reply.triton_version, namespace)
    short = keys.short(key)
    if reply.key != key:
        raise KernelRefused(Rejection.MISMATCH, f"the farm answered for kernel {keys.short(reply.key)}, not {short}")
    try:
        manifest = Manifest.from_json(reply.manifest)
    except ManifestError as e:
        raise KernelRefused(Rejection.MALFORMED, f"kernel {short} refused: {e}") from e
    target = targets.from_proto(request.target)
    wanted = fingerprint(str(target), reply.triton_version)
    if trusted is not None:
        try:
            trusted.verify(manifest, key=key, tenant=namespace, fingerprint=wanted)
        except SignatureError as e:
            raise KernelRefused(e.reason, f"kernel {short} refused: {e}") from e
    if (manifest.kind, manifest.key, manifest.tenant) != (KERNEL, key, namespace) or len(manifest.kernels) != 1:
        raise KernelRefused(
            Rejection.MISMATCH,
            f"kernel {short} refused: the manifest is a {manifest.kind!r} for key "
            f"{keys.short(manifest.key)} in namespace {manifest.tenant!r}",
        )
    if manifest.fingerprint != wanted:
        raise KernelRefused(
            Rejection.FINGERPRINT, f"kernel {short} refused: built for {manifest.fingerprint}, not {wanted}"
        )
    ref = manifest.kernels[0]
    metadata_bytes, assembly_bytes = reply.metadata_json.encode(), reply.assembly.encode()
    blobs = {
        manifest.payload.digest: metadata_bytes,
        ref.source.digest: assembly_bytes,
        ref.binary.digest: reply.binary,
    }
    try:
        check_blobs(manifest, blobs)
    except ManifestError as e:
        raise KernelRefused(Rejection.DIGEST, f"kernel {short} refused: {e}") from e
    try:
        info = elf.check_binary(reply.binary, target.device, target.arch)
    except elf.NotAKernel as e:
        raise KernelRefused(Rejection.WRONG_ARCH, f"kernel {short} refused: {e}") from e
    if ref.kind != info.kind:
        raise KernelRefused(Rejection.MISMATCH, f"kernel {short} refused: a {info.kind} named as a {ref.kind!r}")
    try:
        metadata = json.loads(metadata_bytes)
    except ValueError as e:
        raise KernelRefused(Rejection.MALFORMED, f"kernel {short} refused: its metadata is not JSON") from e
    if not isinstance(metadata, dict):
        raise KernelRefused(Rejection.MALFORMED, f"kernel {short} refused: its metadata is not an object")
    return CheckedKernel(manifest, reply.binary, reply.assembly, metadata, info)
