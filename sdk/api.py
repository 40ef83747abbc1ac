"""`sdk.compile`: `torch.compile` with the compile done by a farm."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from sdk.backend import FarmBackend
from sdk.errors import ConfigError
from sdk.settings import SDKSettings
from torchfarm.settings import from_env

_TORCH_COMPILE_KWARGS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options", "disable"})


def compile(
    model: Callable | None = None,
    *,
    remote: str | None = None,
    target: str | None = None,
    fallback: str = "local",
    **torch_compile_kwargs: Any,
) -> Any:
    """Like `torch.compile(model, **kwargs)`, with each graph compiled on the farm at
    `remote` ("grpc://host:port", default `TORCHFARM_REMOTE`).

    `fallback="local"` compiles a graph locally when the farm cannot, with a warning;
    `fallback="error"` raises `sdk.errors.FarmError` instead. `target` names the
    target to compile for; today only the local machine ("cpu" or None) is supported.
    Used without a model, it returns a decorator, as `torch.compile` does.
    """
    unknown = set(torch_compile_kwargs) - _TORCH_COMPILE_KWARGS
    if unknown:
        raise ConfigError(f"unknown torch.compile arguments: {', '.join(sorted(unknown))}")
    if fallback not in ("local", "error"):
        raise ConfigError(f"fallback must be 'local' or 'error', not {fallback!r}")
    backend = torch_compile_kwargs.pop("backend", "inductor")
    if backend != "inductor":
        raise ConfigError(f"the farm compiles with Inductor; backend={backend!r} is not supported")
    if target not in (None, "cpu"):
        raise ConfigError(f"target {target!r}: this SDK compiles for the local machine only")
    mode = torch_compile_kwargs.pop("mode", None)
    options = torch_compile_kwargs.pop("options", None)
    if mode is not None and options is not None:
        raise ConfigError("either mode or options can be specified, not both (as torch.compile)")

    settings = from_env(SDKSettings)
    settings = dataclasses.replace(settings, remote=remote or settings.remote, fallback=fallback)

    def wrap(fn: Callable) -> Any:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        farm_backend = FarmBackend(
            settings,
            mode=mode,
            options=options,
            dynamic=torch_compile_kwargs.get("dynamic"),
            name=name,
        )
        return torch.compile(fn, backend=farm_backend, **torch_compile_kwargs)

    return wrap if model is None else wrap(model)
