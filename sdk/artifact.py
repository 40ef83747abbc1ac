"""Verify an artifact against this machine and the farm's pinned keys, then load it.

An artifact is code: Inductor's loader unpickles its payload and imports generated
modules. So nothing is deserialized until, in this order:

1. the manifest parses (JSON, never pickle);
2. its signature verifies (sdk/trust.py says when one is required): a pinned key id,
   in date, and an Ed25519 signature over the requested key, this client's namespace,
   the content digest, this machine's fingerprint and the manifest's other fields;
3. it names the requested key and this client's namespace;
4. it was built for this machine's exact fingerprint (torch build, Triton, ISA, compiler);
5. every blob matches its digest.

Anything else raises ArtifactRejected, is counted in
`torchfarm_sdk_artifacts_rejected_total{reason}`, and the backend falls back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sdk import loader
from sdk.metrics import rejected
from sdk.trust import Trust
from torchfarm.fx.fingerprint import Fingerprint
from torchfarm.trust.signing import SignatureError
from torchfarm.wire.codes import Rejection
from torchfarm.wire.manifest import COMPILE, Manifest, ManifestError, check_blobs


def verify(
    manifest_bytes: bytes,
    blobs: dict[str, bytes],
    key: str,
    local: Fingerprint,
    trust: Trust,
    kind: str = COMPILE,
) -> Manifest:
    """The manifest, once everything above holds; ArtifactRejected otherwise.

    `trust` says which keys must have signed it, or that the user named the farm as a
    development farm whose artifacts load unsigned (sdk/trust.py).
    `kind` is what the caller loads: a torch.compile artifact or an export package
    (torchfarm/wire/manifest.py); the other is refused. `local` is the fingerprint the
    artifact must carry: this machine's, or for an export to another target, that
    target fleet's (sdk/exports.py)."""
    if not trust.loads_anything:
        raise rejected(
            Rejection.UNTRUSTED_FARM,
            "no signing key is known for the farm and it is not named in TORCHFARM_TRUST_UNSIGNED",
        )
    try:
        manifest = Manifest.from_json(manifest_bytes)
    except ManifestError as e:
        raise rejected(Rejection.MALFORMED, f"artifact {key[:12]} refused: {e}") from e
    mine = local.to_dict()
    if trust.verifies_signatures:
        try:
            trust.keys.verify(manifest, key=key, tenant=trust.namespace, fingerprint=mine)
        except SignatureError as e:
            raise rejected(e.reason, f"artifact {key[:12]} refused: {e}{_pins(trust, e)}") from e
    if manifest.kind != kind:
        raise rejected(Rejection.MISMATCH, f"artifact {key[:12]} refused: its kind is {manifest.kind!r}, not {kind!r}")
    if manifest.key != key:
        raise rejected(Rejection.MISMATCH, f"artifact refused: it is for key {manifest.key[:12]}, not {key[:12]}")
    if manifest.tenant != trust.namespace:
        raise rejected(
            Rejection.MISMATCH,
            f"artifact {key[:12]} refused: it belongs to namespace {manifest.tenant!r}, this "
            f"client to {trust.namespace!r} (is the token right, and authentication on?)",
        )
    diff = [
        f"{k} {manifest.fingerprint.get(k)!r} != local {v!r}"
        for k, v in mine.items()
        if manifest.fingerprint.get(k) != v
    ]
    if diff or set(manifest.fingerprint) != set(mine):
        raise rejected(
            Rejection.FINGERPRINT,
            f"artifact {key[:12]} was built for another machine: {'; '.join(diff) or 'fields differ'}",
        )
    try:
        check_blobs(manifest, blobs)
    except ManifestError as e:
        raise rejected(Rejection.DIGEST, f"artifact {key[:12]} refused: {e}") from e
    return manifest


def load(manifest: Manifest, blobs: dict[str, bytes]) -> Callable[..., Any]:
    """Places the kernel binaries and the Triton kernels' autotune records where local
    Inductor looks for them, then deserializes. ConfigError if another user could write
    those directories (`loader.check_private_cache`)."""
    loader.check_private_cache()
    loader.install_kernels(
        ((blobs[k.source.digest], blobs[k.binary.digest]) for k in manifest.kernels),
        manifest.toolchain,
    )
    loader.install_autotune_records(manifest.toolchain)
    return loader.load_compiled(blobs[manifest.payload.digest])


def _pins(trust: Trust, error: SignatureError) -> str:
    """For a key that is not pinned: which keys are, from where, and what to do."""
    if error.reason != Rejection.UNKNOWN_KEY:
        return ""
    return (
        f" (pinned: {', '.join(sorted(trust.keys.keys))}, from {trust.keys_from or 'the settings'}); "
        "if the farm's key changed, pin its new public keys (its trusted-keys.json)"
    )
