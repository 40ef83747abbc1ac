"""Ed25519 signatures of artifact manifests: workers sign, clients (and the coordinator) verify.

What is signed is a statement, never the manifest alone::

    "torchfarm.artifact-signature/1\\n" + canonical JSON of
    {key, tenant, content, fingerprint, manifest, key_id, signed_at, expires_at}

- `key`: the cache key the artifact answers;
- `tenant`: the cache namespace it was compiled for;
- `content`: `Manifest.content_digest()`, one digest over every blob by role;
- `fingerprint`: the exact build the artifact was compiled under;
- `manifest`: SHA-256 of the manifest's canonical JSON without its signature, so every
  other field (kernel names, sizes, worker, timings) is covered too.

A verifier builds the statement from what *it* expects (the key it asked for, its own
namespace, its own fingerprint) and from the manifest it received. An artifact for
another key, tenant or machine therefore fails the signature check itself, even before
the field-by-field comparison that gives a readable reason.

Keys rotate by id: a worker signs with one key id; clients pin a map of key id →
public key and accept any of them. Publish the new public key, switch workers to the
new private key, then drop the old id from the pins (and from the coordinator's, which
then recompiles artifacts signed by it on demand).

Key files:
- private: PEM (PKCS#8) as `cryptography` writes it, mode 0600;
- trusted keys: JSON `{"<key id>": "<raw 32-byte public key, base64>"}`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from torchfarm.wire.codes import Rejection
from torchfarm.wire.manifest import Manifest, Signature

DOMAIN = b"torchfarm.artifact-signature/1\n"
"""Prefix of every signed statement, so these signatures mean nothing anywhere else."""

DEFAULT_TTL_S = 30 * 24 * 3600
"""How long a signature stays valid unless the worker is told otherwise."""

CLOCK_SKEW_S = 300
"""A signature dated up to this far in the future (a fast worker clock) is still accepted."""

_KEY_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")


class SignatureError(ValueError):
    """An artifact's signature is missing, unknown, expired, or does not verify.

    `reason` is a short stable label for metrics (a `Rejection`: unsigned, unknown_key,
    expired, not_yet_valid, mismatch, invalid).
    """

    def __init__(self, reason: Rejection, message: str):
        super().__init__(message)
        self.reason = reason


def key_id_of(public: Ed25519PublicKey) -> str:
    """The default id of a key: "ed25519:" and 16 hex digits of its SHA-256."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def public_b64(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def statement(manifest: Manifest, sig: Signature, *, key: str, tenant: str,
              fingerprint: Mapping[str, str]) -> bytes:
    body = {
        "key": key,
        "tenant": tenant,
        "content": manifest.content_digest(),
        "fingerprint": dict(fingerprint),
        "manifest": hashlib.sha256(manifest.signing_bytes()).hexdigest(),
        "key_id": sig.key_id,
        "signed_at": sig.signed_at,
        "expires_at": sig.expires_at,
    }
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Signer:
    """A worker's signing key."""

    def __init__(self, private: Ed25519PrivateKey, key_id: str = ""):
        self.private = private
        self.key_id = key_id or key_id_of(private.public_key())
        if not _KEY_ID_RE.match(self.key_id):
            raise ValueError(f"bad signing key id {self.key_id!r}")

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_file(cls, path: str | Path, key_id: str = "") -> Signer:
        private = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return cls(private, key_id)

    def save(self, path: str | Path) -> None:
        """Writes the private key to a new file `path`, mode 0600, whole or not at all (a
        worker starting meanwhile never reads half a key). An existing file is never
        replaced (FileExistsError): it may be the key workers sign with."""
        pem = self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd, staged = tempfile.mkstemp(prefix=".signing-key-", dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp's file is 0600
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
            os.link(staged, path)  # fails where `path` exists
        finally:
            os.unlink(staged)

    def trusted_entry(self) -> dict[str, str]:
        """This key's line in a trusted-keys file."""
        return {self.key_id: public_b64(self.private.public_key())}

    def sign(self, manifest: Manifest, ttl_s: int = DEFAULT_TTL_S, now: float | None = None) -> Manifest:
        """The manifest with a signature for its own key, tenant and fingerprint."""
        signed_at = int(now if now is not None else time.time())
        unsigned = dataclasses.replace(manifest, signature=None)
        sig = Signature(key_id=self.key_id, signed_at=signed_at, expires_at=signed_at + ttl_s, value="")
        message = statement(
            unsigned, sig, key=manifest.key, tenant=manifest.tenant, fingerprint=manifest.fingerprint
        )
        value = base64.b64encode(self.private.sign(message)).decode()
        return dataclasses.replace(unsigned, signature=dataclasses.replace(sig, value=value))


VERIFIED_MEMO = 4096
"""Signatures each TrustedKeys remembers as verified (`TrustedKeys.verify`)."""


class TrustedKeys:
    """Public keys a verifier accepts, by key id."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]):
        self.keys = dict(keys)
        self._verified: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()
        """(public key, statement, signature) triples that verified: the Ed25519 check is a
        pure function of them, and a hot artifact is checked on every hit (most of the
        cost of a hit's verification). Bounded, least recently used out first."""
        self._lock = threading.Lock()  # the coordinator verifies on several threads

    def __bool__(self) -> bool:
        return bool(self.keys)

    @classmethod
    def parse(cls, entries: Mapping[str, str], where: str = "trusted keys") -> TrustedKeys:
        keys: dict[str, Ed25519PublicKey] = {}
        for key_id, b64 in entries.items():
            if not _KEY_ID_RE.match(key_id):
                raise ValueError(f"{where}: bad key id {key_id!r}")
            try:
                keys[key_id] = Ed25519PublicKey.from_public_bytes(base64.b64decode(b64, validate=True))
            except ValueError as e:
                raise ValueError(f"{where}: key {key_id!r} is not a base64 Ed25519 public key") from e
        return cls(keys)

    @classmethod
    def load(cls, path: str = "", inline: str = "") -> TrustedKeys:
        """From a JSON file and/or inline "id=base64,id=base64" text; both may be empty."""
        entries: dict[str, str] = {}
        if path:
            try:
                body = json.loads(Path(path).read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e})") from None
            if not isinstance(body, dict):
                raise ValueError(f"{path}: want a JSON object of key id → public key")
            entries.update({str(k): str(v) for k, v in body.items()})
        for item in filter(None, (s.strip() for s in inline.split(","))):
            key_id, sep, b64 = item.partition("=")
            if not sep:
                raise ValueError(f"trusted key {item[:20]!r}...: want id=base64")
            entries[key_id] = b64
        return cls.parse(entries, path or "trusted keys")

    def verify(
        self,
        manifest: Manifest,
        *,
        key: str,
        tenant: str,
        fingerprint: Mapping[str, str],
        now: float | None = None,
    ) -> None:
        """Raises SignatureError unless a pinned key signed this manifest for exactly
        this key, tenant and fingerprint, and the signature is in date."""
        sig = manifest.signature
        if sig is None:
            raise SignatureError(Rejection.UNSIGNED, "the artifact is not signed")
        if sig.alg != "ed25519":
            raise SignatureError(Rejection.INVALID, f"unsupported signature algorithm {sig.alg!r}")
        public = self.keys.get(sig.key_id)
        if public is None:
            raise SignatureError(Rejection.UNKNOWN_KEY, f"signed by key {sig.key_id!r}, which is not pinned")
        now = time.time() if now is None else now
        if sig.expires_at <= now:
            raise SignatureError(Rejection.EXPIRED, f"the signature expired at {sig.expires_at} (now {int(now)})")
        if sig.signed_at > now + CLOCK_SKEW_S:
            raise SignatureError(Rejection.NOT_YET_VALID, f"the signature is dated {sig.signed_at}, in the future")
        for what, got, want in (("key", manifest.key, key), ("tenant", manifest.tenant, tenant)):
            if got != want:
                raise SignatureError(Rejection.MISMATCH, f"the artifact is for {what} {got!r}, not {want!r}")
        try:
            value = base64.b64decode(sig.value, validate=True)
            message = statement(manifest, sig, key=key, tenant=tenant, fingerprint=fingerprint)
            self._check(public, value, message)
        except (InvalidSignature, ValueError) as e:
            raise SignatureError(
                Rejection.INVALID, "the signature does not verify for this key, tenant, content and build"
            ) from e

    def _check(self, public: Ed25519PublicKey, value: bytes, message: bytes) -> None:
        """public.verify(value, message), remembered when it passes. The statement names
        everything signed (content, manifest bytes, key, tenant, build, dates), so a
        remembered triple never vouches for anything but exactly what verified."""
        memo = (public.public_bytes_raw(), message, value)  # the key itself, not only its id
        with self._lock:
            if memo in self._verified:
                self._verified.move_to_end(memo)
                return
        public.verify(value, message)
        with self._lock:
            self._verified[memo] = None
            if len(self._verified) > VERIFIED_MEMO:
                self._verified.popitem(last=False)
