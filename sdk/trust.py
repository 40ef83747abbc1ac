"""What the SDK trusts: the farm's signing keys, its own namespace, and whether the user
named this farm as a development farm whose unsigned artifacts may load.

The policy, in full, for the farm at "host:port":

- **Keys pinned** (`TORCHFARM_TRUSTED_KEYS_FILE` or `TORCHFARM_TRUSTED_KEYS`): an
  artifact loads only with a valid, unexpired signature by one of them, made for the
  requested key, this client's namespace and this machine's fingerprint.
- **No keys pinned, but a per-user trust file for this farm's address**
  (`~/.config/torchfarm/trusted/<host>_<port>.json`, torchfarm/trust/trustfile.py, written by
  `torchfarm up` on this machine; every loopback name, `localhost` too, finds the one
  `up` wrote for `127.0.0.1`): the same, with the keys from that file.
- **No key known, and the farm named in `TORCHFARM_TRUST_UNSIGNED`** (a comma-separated
  list of farm addresses, compared exactly): a development farm without signing.
  Artifacts load after the key, namespace, fingerprint and blob digest checks, signed or
  not; a signature cannot be checked.
- **Otherwise**: nothing the farm sends is ever loaded, on loopback or not (a loopback
  port may be a port-forward, an ssh tunnel, or another user's process). The SDK does
  not even submit; every graph compiles locally, with one warning that says how to pin
  the farm's keys, once the farm answers (a farm that is down is reported as down:
  `FarmUnavailable`, the trust question being moot).

The namespace is read from the token (`tf1.<namespace>.<secret>`); without a token it
is the unnamed namespace of a farm without authentication.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sdk.errors import ConfigError
from sdk.settings import SDKSettings
from torchfarm.files import foreign, on_the_way, replaceable_above
from torchfarm.trust import trustfile
from torchfarm.trust.signing import TrustedKeys
from torchfarm.trust.tokens import TokenError, namespace_of


def pinned_keys(path: str, inline: str) -> TrustedKeys:
    """The keys pinned by a file and/or inline text (TrustedKeys.load), once the file
    and its directory are this user's or root's and no one else may write them: another
    user who could add a key there would have whatever they serve as the farm trusted.
    A symbolic link is followed: the file checked is the one it names, and each link on
    the way (its owner, what it leads to, and its directory), a linked directory's
    included, is checked too, and every directory above them. Raises OSError or ValueError."""
    if path:
        way = on_the_way(Path(path))
        for where in way:
            if where.is_symlink():
                if where.lstat().st_uid not in (os.getuid(), 0):
                    raise ValueError(f"{where} is a link owned by another user; refusing its keys")
            st = where.stat()  # a link's, where it leads: a linked directory is read through
            # A sticky directory of the user's or root's (/tmp): others may write in it,
            # but not replace the file.
            sticky = where.is_dir() and st.st_mode & stat.S_ISVTX and st.st_uid in (os.getuid(), 0)
            if foreign(st, root_ok=True, private_group=True) and not sticky:
                raise ValueError(
                    f"{where} is writable by others or owned by another user (uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):o}); refusing its keys (chmod go-w it)"
                )
        if why := replaceable_above(way):
            raise ValueError(f"{why}; refusing its keys (keep the file where only you and root may write)")
    return TrustedKeys.load(path, inline)


def is_loopback(address: str) -> bool:
    """Whether "host:port" names this machine."""
    return trustfile.is_loopback_host(address.rpartition(":")[0])


def _farm(remote: str) -> str:
    """"grpc://host:port", "grpcs://host:port" or "host:port" → "host:port"."""
    return remote.strip().removeprefix("grpcs://").removeprefix("grpc://")


def names_farm(trust_unsigned: str, address: str) -> bool:
    """Whether the TORCHFARM_TRUST_UNSIGNED list names the farm at "host:port" exactly;
    ConfigError for an entry that names no farm (`yes`, `*`)."""
    named = {_farm(a) for a in trust_unsigned.split(",") if a.strip()}
    unnamed = sorted(a for a in named if ":" not in a)
    if unnamed:
        raise ConfigError(
            f"TORCHFARM_TRUST_UNSIGNED: {unnamed[0]!r} is not a farm address "
            "(host:port, or grpc://host:port, each farm named exactly)"
        )
    return _farm(address) in named


@dataclass(frozen=True)
class Trust:
    keys: TrustedKeys
    namespace: str
    unsigned: bool = False
    """The user named this farm in TORCHFARM_TRUST_UNSIGNED and no key is known for it:
    its artifacts load without a signature."""
    keys_from: str = ""
    """Where the keys came from (a setting or a trust file), for messages."""

    @property
    def verifies_signatures(self) -> bool:
        return bool(self.keys)

    @property
    def loads_anything(self) -> bool:
        """False when the policy refuses every artifact from this farm."""
        return bool(self.keys) or self.unsigned

    @classmethod
    def from_settings(cls, settings: SDKSettings, address: str) -> Trust:
        try:
            keys = pinned_keys(settings.trusted_keys_file, settings.trusted_keys)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"cannot read the farm's pinned keys (TORCHFARM_TRUSTED_KEYS_FILE, TORCHFARM_TRUSTED_KEYS): {e}"
            ) from None
        keys_from = settings.trusted_keys_file or "TORCHFARM_TRUSTED_KEYS"
        if not keys:
            try:
                found = trustfile.find(address)
            except trustfile.TrustFileError as e:
                raise ConfigError(f"cannot use the keys published for the farm at {address}: {e}") from None
            keys, keys_from = (found[0], str(found[1])) if found else (keys, "")
        namespace = ""
        if settings.token:
            try:
                namespace = namespace_of(settings.token)
            except TokenError as e:
                raise ConfigError(f"TORCHFARM_TOKEN: {e}") from e
        unsigned = names_farm(settings.trust_unsigned, address) and not keys
        return cls(keys=keys, namespace=namespace, unsigned=unsigned, keys_from=keys_from)


def untrusted_message(address: str) -> str:
    """Why nothing from the farm at `address` can load, and the ways to fix it."""
    return (
        f"no signing key is known for the farm at {address}, so none of its artifacts "
        "could be loaded; set TORCHFARM_TRUSTED_KEYS_FILE to the farm's public keys (a "
        f"`torchfarm up` on this machine publishes them in {trustfile.path_for(address)}), "
        f"or, for a development farm that does not sign, TORCHFARM_TRUST_UNSIGNED={address}"
    )
