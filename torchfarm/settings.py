"""Typed settings from environment variables with one prefix.

Each process (coordinator, worker, SDK) declares a frozen dataclass of its settings,
each field documented where it is declared, and builds it once at its entry point with
`from_env`. Code below the entry point receives the object; nothing reads os.environ.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any, TypeVar, get_type_hints

from torchfarm import envnames

log = logging.getLogger(__name__)

PREFIX = "TORCHFARM_"
"""Every torchfarm environment variable starts with this."""

T = TypeVar("T")


class SettingsError(ValueError):
    pass


def _parse(name: str, raw: str, kind: Any) -> Any:
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind in (int, float, str):
            return kind(raw)
        if kind == tuple[str, ...]:
            return tuple(s.strip() for s in raw.split(",") if s.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    raise SettingsError(f"{name}: unsupported settings type {kind!r}")


def from_env(cls: type[T], env: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Builds `cls` from `TORCHFARM_<FIELD>` variables; explicit overrides win. A
    `TORCHFARM_*` variable no torchfarm process reads is warned of, once a process."""
    env = os.environ if env is None else env
    warn_unknown(env)
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for field in fields:
        name = PREFIX + field.upper()
        if field in overrides:
            values[field] = overrides[field]
        elif name in env:
            values[field] = _parse(name, env[name], hints[field])
        elif hints[field] is str and f"{field}_file" not in fields and name + "_FILE" in env:
            values[field] = _read_secret(name + "_FILE", env[name + "_FILE"])
    return cls(**values)


_warned: set[str] = set()
"""Unknown names already warned of in this process."""


def forget_warnings() -> None:
    """Forgets which unknown names were warned of, so the next `from_env` warns of each
    again: for a process that builds its settings anew from a changed environment, and
    for the tests of the warning (tests/unit/test_envnames.py)."""
    _warned.clear()


def warn_unknown(env: Mapping[str, str]) -> None:
    """Warns of each `TORCHFARM_*` name in `env` that torchfarm does not read, with the
    known name it most likely misspells: a typo must not pass for a setting."""
    for name in envnames.unknown(env):
        if name in _warned:
            continue
        _warned.add(name)
        near = envnames.closest(name)
        log.warning(
            "%s is not a torchfarm setting and is ignored%s", name,
            f" (did you mean {near}?)" if near else "",
        )


def _read_secret(name: str, path: str) -> str:
    """`TORCHFARM_<FIELD>_FILE`: a string setting read from a file, as Docker and
    Kubernetes secrets are mounted, so a password-bearing URL or a token never sits in
    the environment (`docker inspect`, /proc/PID/environ) or the compose file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        raise SettingsError(f"{name}={path!r}: cannot read it: {e.strerror}") from e
