"""Seals on the records one worker stores and another acts on: HMAC-SHA256 under a key
that only the farm's workers hold.

Redis is storage, not a root of trust (docs/security.md). A staged compile hands its
work from job to job through Redis and the broker: the decomposition, the plan, the
kernel cache's records and the kernel-build messages. Whoever can write there must not
be able to steer a worker, so the worker that writes such a record seals it, and the
worker that reads it checks the seal before it acts on it. Torch-free.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from torchfarm.trust.signing import Signer

SEAL_FORMAT = b"torchfarm.trust.seal/1"
"""Enters every seal; change it to invalidate every sealed record."""


class TamperedRecord(Exception):
    """A record that should carry a worker's seal carries none, or a wrong one."""


class Seal:
    """Seals and checks records under one key."""

    def __init__(self, key: bytes):
        if len(key) < 32:
            raise ValueError("a record key has at least 32 bytes")
        self._key = key

    @classmethod
    def from_file(cls, path: str | Path) -> Seal:
        """A key file as `torchfarm keygen` or any 32+ random bytes make it."""
        return cls(Path(path).read_bytes().strip())

    @classmethod
    def from_signer(cls, signer: Signer) -> Seal:
        """A key derived from the workers' signing key, which they already share."""
        raw = signer.private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return cls(hmac.new(raw, SEAL_FORMAT + b" records", hashlib.sha256).digest())

    def mac(self, kind: str, *parts: str | bytes) -> str:
        """The seal of a record of `kind` made of `parts` (each length-prefixed, so no
        two records share a message)."""
        h = hmac.new(self._key, SEAL_FORMAT, hashlib.sha256)
        for part in (kind, *parts):
            data = part.encode() if isinstance(part, str) else part
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
        return h.hexdigest()

    def check(self, mac: str | bytes | None, kind: str, *parts: str | bytes) -> None:
        """Raises TamperedRecord unless `mac` seals these parts."""
        if isinstance(mac, bytes):
            mac = mac.decode(errors="replace")
        if not mac or not hmac.compare_digest(mac, self.mac(kind, *parts)):
            raise TamperedRecord(f"a {kind} record carries no valid seal of this farm's workers")
