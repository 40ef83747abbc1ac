"""The per-user trust files: a farm's signing keys, published by the stack that runs it
and found by an SDK on the same machine without configuration.

`torchfarm up` (localfarm/stack.py) makes a signing key for its workers and writes the
public half to `$XDG_CONFIG_HOME/torchfarm/trusted/<host>_<port>.json` (by default
`~/.config/torchfarm/trusted/`), in the trusted-keys format of torchfarm/trust/signing.py.
The directory is 0700 and the file 0600, both the user's own: a file another user could
have written is refused, since whoever writes it chooses which farm's code this user
runs. An SDK whose settings pin no keys reads the file for the farm address it talks to
(sdk/trust.py), so every artifact it loads from a local stack is signed, and whatever
else answers on that port later (another user's process, a tunnel) cannot sign.

The key is the farm's address, `host:port`, with every loopback name of this machine
(`localhost`, `127.0.0.0/8`, `[::1]`) read as `127.0.0.1`: `grpc://localhost:50051`
finds the file `torchfarm up` wrote for `127.0.0.1:50051`. Whichever loopback socket
answers, what loads must be signed by the key in the file, so the names being one farm
lets no other process's code in. The stack withdraws its file when it stops.

This module imports neither grpc nor torch.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from pathlib import Path

from torchfarm.files import foreign, on_the_way, replaceable_above, write_atomic
from torchfarm.trust.signing import TrustedKeys

TRUST_DIR_MODE = 0o700
"""The trust directory's mode: only its owner lists or writes it."""

TRUST_FILE_MODE = 0o600
"""A trust file's mode."""


class TrustFileError(ValueError):
    """A trust file exists but cannot be trusted (owner, mode) or read."""


def default_dir() -> Path:
    """`$XDG_CONFIG_HOME/torchfarm/trusted`, or `~/.config/torchfarm/trusted`."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "torchfarm" / "trusted"


LOOPBACK = "127.0.0.1"
"""The name every loopback host stands for in trust files."""


def is_loopback_host(host: str) -> bool:
    """Whether `host` ("localhost", "127.0.0.1", "[::1]") names this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def farm_name(address: str) -> str:
    """The farm at "host:port" (a scheme, if any, dropped) as trust files name it: a
    loopback host is 127.0.0.1."""
    address = address.removeprefix("grpcs://").removeprefix("grpc://")
    host, _, port = address.rpartition(":")
    return f"{LOOPBACK}:{port}" if is_loopback_host(host) else address


def path_for(address: str, directory: Path | None = None) -> Path:
    """The trust file of the farm at "host:port" (`farm_name`'s)."""
    name = re.sub(r"[^A-Za-z0-9.-]", "_", farm_name(address))
    return (directory or default_dir()) / f"{name}.json"


def publish(address: str, entry: dict[str, str], directory: Path | None = None) -> Path:
    """Writes `entry` ({key id: public key}) as the farm's trust file, replacing any
    earlier one: a farm address has one stack, and a new stack has a new key."""
    path = path_for(address, directory)
    path.parent.mkdir(mode=TRUST_DIR_MODE, parents=True, exist_ok=True)
    path.parent.chmod(TRUST_DIR_MODE)
    write_atomic(path, (json.dumps(entry, indent=2) + "\n").encode(), TRUST_FILE_MODE)
    return path


def withdraw(address: str, key_id: str, directory: Path | None = None) -> None:
    """Removes the farm's trust file if it still names `key_id` (a later stack on the
    same address may have replaced it)."""
    path = path_for(address, directory)
    try:
        if key_id in json.loads(path.read_text()):
            path.unlink()
    except (OSError, ValueError):
        pass


def find(address: str, directory: Path | None = None) -> tuple[TrustedKeys, Path] | None:
    """The keys published for the farm at `address`, or None when there are none.
    TrustFileError when the file exists but someone other than this user could have
    written it, or it does not parse."""
    path = path_for(address, directory)
    if not path.exists():
        return None
    try:
        # A link is followed as the kernel would, and each one on the way is checked
        # with the file it leads to and its directory: whoever may replace any of them
        # chooses the keys (sdk/trust.py checks a pinned keys file alike).
        way = on_the_way(path)
        for what in way:
            if what.is_symlink() and what.lstat().st_uid != os.getuid():
                raise TrustFileError(f"{what} is a link owned by another user; refusing its keys")
            st = what.stat()
            if foreign(st):
                raise TrustFileError(
                    f"{what} is writable by others or not owned by this user (mode "
                    f"{stat.S_IMODE(st.st_mode):o}); refusing its keys (chmod go-w, or delete it)"
                )
        if why := replaceable_above(way):
            raise TrustFileError(f"{why}; refusing its keys")
    except OSError as e:
        raise TrustFileError(f"{path}: {e}") from e
    try:
        return TrustedKeys.load(str(path)), path
    except (OSError, ValueError) as e:
        raise TrustFileError(f"{path}: {e}") from e
