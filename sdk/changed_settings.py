"""The Inductor and AOTAutograd settings a user changed, and which of them keep a graph
off the farm.

Carried settings travel in the request and enter its key (torchfarm/wire/options.py);
refused ones (torchfarm/wire/inductor_settings.py) make the graph compile locally, with
their names in the log line, rather than be dropped. `sdk.compile` and `sdk.export`
both read them here.
"""

from __future__ import annotations

from typing import Any

from sdk.errors import GraphRejected
from torchfarm.fx.internals import resolve
from torchfarm.wire import inductor_settings, options


def changed_global() -> dict[str, Any]:
    """Settings of `torch._inductor.config` that are not at their defaults now."""
    return _changed(resolve("inductor_config"))


def changed_functorch() -> dict[str, Any]:
    """Settings of `torch._functorch.config` (AOTAutograd's) that are not at their
    defaults now, by their names on the wire (`functorch.` and the name)."""
    return {options.FUNCTORCH + name: value for name, value in _changed(resolve("functorch_config")).items()}


def _changed(config: Any) -> dict[str, Any]:
    # A patch that has ended leaves its names marked as set, at their default values.
    return {
        name: getattr(config, name)
        for name, entry in config._config.items()
        if not config._is_default(name) and getattr(config, name) != entry.default
    }


def split(per_call: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings to carry (global changes, then `options=` over them), and the refused
    ones the user changed, each with why. A refused setting passed in `options=` at its
    default (`freezing=False`) changes nothing and refuses nothing."""
    config = resolve("inductor_config")
    changed = {**changed_functorch(), **changed_global(), **per_call}
    carried: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for name, value in changed.items():
        kind = inductor_settings.classify(name)
        if kind == "carried":
            carried[name] = value
        elif kind != "client-only" and not _at_default(config, name, value):
            refused[name] = inductor_settings.why_refused(name)
    return carried, refused


def _at_default(config: Any, name: str, value: Any) -> bool:
    """Whether `value` is torch's default for `name`, which a worker compiles with."""
    entry = config._config.get(name)
    if entry is None:
        return False
    try:
        return bool(entry.default == value)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is taken as a change
        return False


def carried(per_call: dict[str, Any]) -> dict[str, Any]:
    """The settings a request carries (`split`); GraphRejected naming each changed one
    the farm refuses, before anything is sent or run."""
    carried, refused = split(per_call)
    if refused:
        named = "; ".join(f"{name} ({why})" for name, why in sorted(refused.items()))
        raise GraphRejected(f"Inductor or AOTAutograd settings the farm does not take are changed: {named}")
    return carried
