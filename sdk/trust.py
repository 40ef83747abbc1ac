"""What the SDK trusts: the farm's pinned signing keys, its own namespace, and the policy
for a farm whose artifacts it cannot verify.

The policy, in full:

- **Keys pinned** (`TORCHFARM_TRUSTED_KEYS_FILE` or `TORCHFARM_TRUSTED_KEYS`): an
  artifact loads only with a valid, unexpired signature by one of them, made for the
  requested key, this client's namespace and this machine's fingerprint. Loopback or
  not, unsigned artifacts are refused.
- **No keys pinned, farm on loopback** (127.0.0.0/8, ::1, localhost): local development
  (`torchfarm up` on this machine). Artifacts load after the key, namespace,
  fingerprint and blob digest checks, signed or not; a signature cannot be checked.
- **No keys pinned, farm elsewhere**: nothing the farm sends is ever loaded. The SDK
  does not even submit; every graph compiles locally, with one warning that says to pin
  the farm's keys.

The namespace is read from the token (`tf1.<namespace>.<secret>`); without a token it
is the unnamed namespace of a farm without authentication.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sdk.errors import ConfigError
from sdk.settings import SDKSettings
from torchfarm.signing import TrustedKeys
from torchfarm.tokens import TokenError, namespace_of


def is_loopback(address: str) -> bool:
    """Whether "host:port" names this machine."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Trust:
    keys: TrustedKeys
    namespace: str
    loopback: bool

    @property
    def verifies_signatures(self) -> bool:
        return bool(self.keys)

    @property
    def loads_anything(self) -> bool:
        """False when the policy refuses every artifact from this farm."""
        return bool(self.keys) or self.loopback

    @classmethod
    def from_settings(cls, settings: SDKSettings, address: str) -> Trust:
        try:
            keys = TrustedKeys.load(settings.trusted_keys_file, settings.trusted_keys)
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the farm's pinned keys: {e}") from e
        namespace = ""
        if settings.token:
            try:
                namespace = namespace_of(settings.token)
            except TokenError as e:
                raise ConfigError(f"TORCHFARM_TOKEN: {e}") from e
        return cls(keys=keys, namespace=namespace, loopback=is_loopback(address))
