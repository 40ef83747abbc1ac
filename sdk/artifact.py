"""Verify an artifact against this machine, then load it.

An artifact is code: Inductor's loader unpickles its payload and imports generated
modules. So nothing is deserialized until the manifest names the requested key and
this machine's exact build fingerprint (torch build, Triton, ISA, compiler), and every
blob matches its digest. Anything else raises ArtifactRejected and the backend falls
back.
"""

from __future__ import annotations

from collections.abc import Callable

from sdk import loader
from sdk.errors import ArtifactRejected
from sdk.target import Fingerprint
from torchfarm.manifest import Manifest, ManifestError, check_blobs


def verify(
    manifest_bytes: bytes, blobs: dict[str, bytes], key: str, local: Fingerprint
) -> Manifest:
    try:
        manifest = Manifest.from_json(manifest_bytes)
        check_blobs(manifest, blobs)
    except ManifestError as e:
        raise ArtifactRejected(f"artifact {key[:12]} refused: {e}") from e
    if manifest.key != key:
        raise ArtifactRejected(f"artifact refused: it is for key {manifest.key[:12]}, not {key[:12]}")
    mine = local.to_dict()
    diff = [
        f"{k} {manifest.fingerprint.get(k)!r} != local {v!r}"
        for k, v in mine.items()
        if manifest.fingerprint.get(k) != v
    ]
    if diff or set(manifest.fingerprint) != set(mine):
        raise ArtifactRejected(
            f"artifact {key[:12]} was built for another machine: {'; '.join(diff) or 'fields differ'}"
        )
    return manifest


def load(manifest: Manifest, blobs: dict[str, bytes]) -> Callable:
    """Places the kernel binaries where local Inductor looks for them, then deserializes."""
    loader.install_kernels(
        (blobs[k.source.digest], blobs[k.binary.digest]) for k in manifest.kernels
    )
    return loader.load_compiled(blobs[manifest.payload.digest])
