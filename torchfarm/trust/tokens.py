"""Tenant tokens: their format, their hashes, and the table the coordinator checks them against.

A token is `tf1.<namespace>.<secret>`: the cache namespace it opens, then 32 random
bytes in unpadded base64url. The namespace travels in clear so the SDK knows, without
asking the farm, which namespace an artifact's signature must name. It grants nothing by
itself: the coordinator accepts a token only if the SHA-256 of the whole token is in
its table, and only for the namespace the table gives that hash.

The table is a JSON file the operator writes (`TORCHFARM_TOKENS_FILE`)::

    {"<sha256 hex of the token>": "alice",
     "<sha256 hex>": {"tenant": "bob", "namespace": "shared", "expires": 1767225600}}

A string value names a tenant whose namespace is its own name, and never expires (the
table's first format, still read); an object may put several tenants in one shared
namespace, and `expires` (unix seconds) ends the token. `torchfarm token` writes objects
that expire after DEFAULT_TOKEN_DAYS unless told otherwise. Only hashes are stored, and
a presented token is compared against every stored hash in constant time. The
coordinator reloads the file when it changes (services/coordinator/tokensource.py), so
removing a line revokes its token without a restart.

This module imports neither grpc nor torch.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from torchfarm.files import write_atomic

TOKEN_PREFIX = "tf1"
"""The token format's version tag, the first dot-separated field."""

SECRET_BYTES = 32
"""Random bytes in a token's secret: 256 bits, so guessing is out of the question."""

DEFAULT_TOKEN_DAYS = 90
"""How long a token `torchfarm token` makes is valid, unless told otherwise."""

_NAMESPACE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\Z")
_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{43}\Z")


class TokenError(ValueError):
    """A token, a namespace name or a token table is malformed."""


class TokenRefused(Exception):
    """A presented token does not admit its caller; `reason` is "invalid" or "expired"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Tenant:
    """Who a call comes from: the tenant's name (logs, quotas) and its cache namespace."""

    name: str
    namespace: str


OPEN = Tenant(name="", namespace="")
"""Every caller of a farm that runs without tokens: one tenant, the unnamed namespace."""


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE_RE.match(namespace):
        raise TokenError(
            f"namespace {namespace!r}: use 1-63 of a-z, 0-9, '_' and '-', starting with a letter or digit"
        )
    return namespace


def new_token(namespace: str) -> str:
    """A fresh token for `namespace`."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).rstrip(b"=").decode()
    return f"{TOKEN_PREFIX}.{check_namespace(namespace)}.{secret}"


def namespace_of(token: str) -> str:
    """The namespace a well-formed token names; TokenError otherwise."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not _SECRET_RE.match(parts[2]):
        raise TokenError(f"not a torchfarm token (expected {TOKEN_PREFIX}.<namespace>.<secret>)")
    return check_namespace(parts[1])


def token_hash(token: str) -> str:
    """What the table stores for a token: the hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode()).hexdigest()


def default_expiry(now: float | None = None) -> float:
    """When a token made now expires by default."""
    return (time.time() if now is None else now) + DEFAULT_TOKEN_DAYS * 86400


class TokenTable:
    """Hashes of the valid tokens, each with its tenant and expiry (None: never).
    Empty means nobody gets in."""

    def __init__(self, entries: dict[str, Tenant], expires: dict[str, float] | None = None):
        expires = expires or {}
        for h, tenant in entries.items():
            if not re.fullmatch(r"[0-9a-f]{64}", h):
                raise TokenError(f"token table: {h[:16]!r}... is not a hex SHA-256")
            check_namespace(tenant.namespace)
        self._entries = [(h.encode(), t, expires.get(h)) for h, t in entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def from_json(cls, data: str | bytes) -> TokenTable:
        try:
            body = json.loads(data)
        except ValueError as e:
            raise TokenError(f"token table is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise TokenError("token table must be a JSON object of sha256 → tenant")
        entries: dict[str, Tenant] = {}
        expires: dict[str, float] = {}
        for h, value in body.items():
            if isinstance(value, str):
                entries[h] = Tenant(name=value, namespace=value)
            elif isinstance(value, dict) and isinstance(value.get("tenant"), str):
                entries[h] = Tenant(
                    name=value["tenant"], namespace=str(value.get("namespace", value["tenant"]))
                )
                if "expires" in value:
                    expires[h] = _expiry(h, value["expires"])
            else:
                raise TokenError(f"token table entry {h[:16]}...: want a tenant name or an object")
        return cls(entries, expires)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenTable:
        return cls.from_json(Path(path).read_text())

    def check(self, token: str, now: float | None = None) -> Tenant:
        """The token's tenant; TokenRefused otherwise. Every entry is compared, in
        constant time each, so the time taken says nothing about which one matched."""
        try:
            claimed = namespace_of(token)
        except TokenError:
            claimed = None
        candidate = token_hash(token).encode()
        found: tuple[Tenant, float | None] | None = None
        for h, tenant, expires in self._entries:
            if hmac.compare_digest(candidate, h):
                found = (tenant, expires)
        if found is None or claimed != found[0].namespace:
            raise TokenRefused("invalid", "the token is not valid on this farm")
        tenant, expires = found
        if expires is not None and (time.time() if now is None else now) >= expires:
            raise TokenRefused("expired", "the token has expired; ask the farm's operator for a new one")
        return tenant

    def lookup(self, token: str, now: float | None = None) -> Tenant | None:
        """The token's tenant, or None (unknown, relabelled or expired)."""
        try:
            return self.check(token, now)
        except TokenRefused:
            return None


def _expiry(h: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TokenError(f"token table entry {h[:16]}...: expires must be unix seconds")
    return float(value)


def table_entry(token: str, tenant: str, expires: float | None = None) -> dict[str, object]:
    """The table line for a new token: {hash: tenant} or {hash: {tenant, namespace,
    expires}}; an entry that expires is always an object."""
    namespace = namespace_of(token)
    if expires is None and tenant == namespace:
        return {token_hash(token): tenant}
    value: dict[str, object] = {"tenant": tenant, "namespace": namespace}
    if expires is not None:
        value["expires"] = int(expires)
    return {token_hash(token): value}


def add_to_file(path: str | Path, entry: dict[str, object]) -> None:
    """Merges `entry` into the tokens file at `path`: written whole to a temporary file
    (mode 0600) and renamed into place, so a coordinator reloading it never reads half."""
    path = Path(path)
    body = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(body, dict):
        raise TokenError(f"{path} is not a token table")
    body.update(entry)
    write_atomic(path, (json.dumps(body, indent=2) + "\n").encode())
