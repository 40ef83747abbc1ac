"""`sdk.compile`: `torch.compile` with the compile done by a farm."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

import torch

from sdk import naming, nonblocking, precompile, report, warm_mode
from sdk import settings as sdk_settings
from sdk.backend import FarmBackend
from sdk.errors import CompileArgumentError, ConfigError
from torchfarm.fx import fingerprint as sdk_target
from torchfarm.wire.targets import Target, TargetError

_TORCH_COMPILE_KWARGS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options", "disable"})


def compile(
    model: Callable[..., Any] | None = None,
    *dynamo_args: Any,
    remote: str | None = None,
    target: str | None = None,
    fallback: str | None = None,
    wait: bool = True,
    **torch_compile_kwargs: Any,
) -> Any:
    """Like `torch.compile(model, **kwargs)`, with each graph compiled on the farm at
    `remote` ("grpc://host:port", default `TORCHFARM_REMOTE`).

    `fallback="local"` (the default, or `TORCHFARM_FALLBACK`) compiles a graph locally
    when the farm cannot, with a warning; `fallback="error"` raises `sdk.errors.FarmError`
    instead. Under "local", a graph with calls the farm refuses by name is split at them:
    they run eagerly and the rest compiles on the farm (sdk/split.py).

    `target` is what to compile for (docs/targets.md): None, or an inexact kind such as
    "cpu" or "cuda", means this machine's own (detected: CPU ISA, CUDA capability, HIP
    gcnArchName, MPS, XPU name). An exact target this process is not, such as
    "cuda:sm_90" on a laptop, fills the farm's cache for that fleet and runs the graphs
    eagerly here: what the farm builds for another target cannot be loaded here.
    `wait=False` returns at once from each graph's compile: the graph runs eagerly
    while the farm compiles it, and switches to the compiled code at the start of a
    later call of the returned model, once the artifact is verified and loaded
    (sdk/nonblocking.py; `sdk.wait_ready(model, timeout)` waits for it).
    Used without a model, it returns a decorator, as `torch.compile` does. Passed as a
    backend itself (`torch.compile(fn, backend=sdk.compile)`, or a `functools.partial`
    of it with `remote=` and the rest), it compiles each graph Dynamo gives it on the
    farm, as `farm_backend` does.
    """
    if dynamo_args:
        return _as_backend(model, dynamo_args, remote, target, fallback, wait, torch_compile_kwargs)
    unknown = set(torch_compile_kwargs) - _TORCH_COMPILE_KWARGS
    if unknown:
        raise CompileArgumentError(f"unknown torch.compile arguments: {', '.join(sorted(unknown))}")
    settings = _settings(remote, fallback)
    if not isinstance(wait, bool):
        raise ConfigError(f"wait must be True or False, not {wait!r}")
    backend = torch_compile_kwargs.pop("backend", "inductor")
    if backend != "inductor":
        raise ConfigError(f"the farm compiles with Inductor; backend={backend!r} is not supported")
    wanted = _target(target)
    mode = torch_compile_kwargs.pop("mode", None)
    options = torch_compile_kwargs.pop("options", None)
    _one_of(mode, options)

    def wrap(fn: Callable[..., Any]) -> Any:
        name = naming.model_name(fn)  # "MLP (examples.models)": labels tell models apart
        farm_backend = FarmBackend(
            settings,
            mode=mode,
            options=options,
            dynamic=torch_compile_kwargs.get("dynamic"),
            name=name,
            target=wanted,
            wait=wait or warm_mode.active(),  # `torchfarm warm` reports each compile as it ends
        )
        if precompile.enabled(settings) and wanted is None:
            compiled = precompile.attach(
                precompile.compile_packaged(fn, farm_backend, torch_compile_kwargs), fn, farm_backend
            )
        else:
            compiled = torch.compile(fn, backend=farm_backend, **torch_compile_kwargs)
        if farm_backend.swapper is not None:
            compiled = nonblocking.attach(compiled, farm_backend.swapper)
        return warm_mode.observe(compiled)

    return wrap if model is None else wrap(model)


def _one_of(mode: str | None, options: dict[str, Any] | None) -> None:
    if mode is not None and options is not None:
        raise CompileArgumentError("either mode or options can be specified, not both (as torch.compile)")


def _settings(remote: str | None, fallback: str | None) -> sdk_settings.SDKSettings:
    """TORCHFARM_*, with a call's `remote` and `fallback` over them."""
    settings = sdk_settings.load()
    fallback = settings.fallback if fallback is None else fallback
    if fallback not in ("local", "error"):
        raise ConfigError(f"fallback (the argument, or TORCHFARM_FALLBACK) must be 'local' or 'error', not {fallback!r}")
    return dataclasses.replace(settings, remote=remote or settings.remote, fallback=fallback)


def _target(target: str | None) -> Target | None:
    try:
        return None if target is None else sdk_target.resolve(target)
    except TargetError as e:
        raise ConfigError(str(e)) from e


def farm_backend(
    remote: str | None = None,
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    fallback: str | None = None,
    target: str | None = None,
) -> FarmBackend:
    """The farm as a Dynamo backend, for code that passes one itself:
    `model.compile(backend=sdk.farm_backend(remote=...))` (the in-place `nn.Module.compile`,
    which keeps `state_dict`'s keys free of `_orig_mod.`) or
    `torch.compile(fn, backend=sdk.farm_backend(...))`. Its arguments are `sdk.compile`'s;
    give `mode` and `options` here, not to torch.compile, which passes them only to
    a backend named by a string ("torchfarm" below). No `wait=False`: it needs the
    call boundary `sdk.compile` adds."""
    settings = _settings(remote, fallback)
    _one_of(mode, options)
    return FarmBackend(settings, mode=mode, options=options, name="sdk.farm_backend()", target=_target(target))


_NAMED: dict[tuple[Any, ...], FarmBackend] = {}
"""The backends Dynamo was given by name or as `sdk.compile` itself, by their settings."""
_NAMED_LOCK = threading.Lock()


def _named(key: tuple[Any, ...], make: Callable[[], FarmBackend]) -> FarmBackend:
    """The backend for `key`, made again where reports are collected now that it does not
    report to (`sdk.report.collect`): a backend reports where it was made."""
    sinks = report.active_sinks()
    with _NAMED_LOCK:
        farm_backend = _NAMED.get(key)
        if farm_backend is None or not report.same_sinks(farm_backend.reports, sinks):
            farm_backend = _NAMED[key] = make()
    return farm_backend


def _options_key(options: dict[str, Any] | None) -> str:
    return json.dumps(options, sort_keys=True, default=repr)


def _as_backend(
    gm: Any, dynamo_args: tuple[Any, ...], remote: str | None, target: str | None,
    fallback: str | None, wait: bool, kwargs: dict[str, Any],
) -> Callable[..., Any]:
    """`sdk.compile` called by Dynamo as its backend, with a graph and its example inputs."""
    if len(dynamo_args) != 1 or not isinstance(gm, torch.fx.GraphModule):
        raise CompileArgumentError(
            "sdk.compile takes one positional argument, the model, as torch.compile does"
        )
    unknown = set(kwargs) - {"mode", "options"}
    if unknown or not wait:
        given = sorted(unknown) + ([] if wait else ["wait"])
        raise CompileArgumentError(
            f"sdk.compile as a backend takes remote, target, fallback, mode and options; "
            f"{', '.join(given)} belong to sdk.compile(model, ...) itself"
        )
    mode, options = kwargs.get("mode"), kwargs.get("options")
    _one_of(mode, options)
    settings, wanted = _settings(remote, fallback), _target(target)
    farm_backend = _named(
        ("sdk.compile", settings, wanted, mode, _options_key(options)),
        lambda: FarmBackend(settings, mode=mode, options=options, name="backend=sdk.compile", target=wanted),
    )
    return farm_backend(gm, list(dynamo_args[0]))


def named_backend(
    gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """Dynamo's backend "torchfarm" (an entry point of the package, in
    `torch_dynamo_backends`): `model.compile(backend="torchfarm", mode=...)` or
    `torch.compile(fn, backend="torchfarm")`, configured by TORCHFARM_* alone. One
    FarmBackend per settings, mode and options, made at their first graph."""
    settings = _settings(None, None)
    farm_backend = _named(
        ("torchfarm", settings, mode, _options_key(options)),
        lambda: FarmBackend(settings, mode=mode, options=options, name="backend='torchfarm'"),
    )
    return farm_backend(gm, example_inputs)
