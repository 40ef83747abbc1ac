"""Custom ops (`torch.library`) on both sides: what the client records, what the worker
registers in their place. The wire format and its checks: torchfarm/graph/customops.py.

The client (`describe`, `record_call`) sends each op's schema and, per call, the
FakeTensor metadata Dynamo recorded for its tensor arguments and outputs.

The worker (`install`) never runs the client's Python. For an op whose namespace the
operator did not configure as installed (`use_installed`), it defines a stand-in of the
same qualified name and schema in a `torch.library.Library` fragment, with:

- a fake implementation that answers a call from the recorded metadata of the call
  whose tensor arguments have the same dtypes and (symbolic) sizes, so Inductor
  compiles around the op as an opaque fallback kernel; the generated code calls
  `torch.ops.<ns>.<name>`, which on the client is the real op;
- an autograd kernel that refuses a call needing gradients: the backward formula is the
  client's Python. Training through such an op compiles on the farm only where the op's
  package is installed on the workers, and then the real op (with its autograd) is used.

Stand-ins last one job (`job_scope`): its fragments are destroyed after it, so one
tenant's declaration never reaches another's compile, nor tells it which names others
use; within a job, a second schema for an op is refused. The sandbox's children define
them in a forked copy that ends with the run; a job in the worker's own process
(sandbox off, a GPU faked) runs in the scope. Behaviour pinned against torch 2.13.0: `Library(ns, "FRAGMENT").define`,
`torch.library.register_fake(qualname, fn, lib=...)`, `Library.impl(name, fn, "Autograd")`,
and `str(OpOverload._schema)` printing `ns::name[.overload](...) -> ...`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from torchfarm.fx.internals import resolve as internal
from torchfarm.graph import allowlist
from torchfarm.graph.customops import (
    DEFAULT_INSTALLED_OP_MODULES,
    INSTALLED_OP_SETTING,
    RefusedCustomOp,
    Schema,
    parse_schema,
    reviewed_module,
)
from torchfarm.v1 import graph_pb2

log = logging.getLogger(__name__)

TensorMeta = graph_pb2.TensorMeta

# ---------------------------------------------------------------------------
# The client: what a call recorded
# ---------------------------------------------------------------------------


_OP_OVERLOAD, _OP_PACKET = internal("OpOverload"), internal("OpOverloadPacket")
_BELOW_AUTOGRAD = internal("AutoDispatchBelowAutograd")


def describe(target: object) -> str | None:
    """The schema string of a custom op's overload (or of a packet's only overload);
    None for anything else (torch's own ops, which the allow-list covers, included)."""
    if isinstance(target, _OP_PACKET) and target.overloads() == ["default"]:
        target = target.default  # `torch.ops.ns.name(...)`: its only overload is called
    if not isinstance(target, _OP_OVERLOAD):
        return None
    if allowlist.is_allowed_function(f"torch.ops.{target}"):
        return None
    return str(target._schema)


def tensor_args(schema: Schema, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The tensor-typed arguments of one call, in schema order, lists flattened, None
    left out: what `CustomCall.inputs` records."""
    values: list[Any] = list(args)
    for _, name in schema.args[len(args):]:
        values.append(kwargs.get(name))
    out: list[Any] = []
    for (kind, _), value in zip(schema.args, values, strict=False):
        if not kind.startswith("Tensor") or value is None:
            continue
        out.extend(value if isinstance(value, (list, tuple)) else [value])
    return out


def tensor_meta(value: object, size: Callable[[object], graph_pb2.SymExpr]) -> TensorMeta:
    """A recorded tensor's metadata, its sizes written by `size` (the encoder's)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"a custom op call recorded a {type(value).__name__}, not a tensor")
    meta = TensorMeta(dtype=str(value.dtype).removeprefix("torch."))
    meta.shape.extend(size(s) for s in value.shape)
    meta.stride.extend(size(s) for s in value.stride())
    meta.device.type = value.device.type
    meta.device.index = -1 if value.device.index is None else value.device.index
    meta.requires_grad = value.requires_grad
    return meta


def resolve(schema: Schema) -> Any:
    """The op a decoded node calls (after `install`)."""
    return _existing(schema)


def record_call(
    node: torch.fx.Node, schema: Schema, meta: Callable[[object], TensorMeta]
) -> graph_pb2.CustomCall:
    """The CustomCall of one node: `meta` writes a FakeTensor as TensorMeta (the
    encoder's, so sizes are over the graph's symbols)."""

    def value(v: object) -> object:
        if isinstance(v, torch.fx.Node):
            return v.meta.get("example_value", v.meta.get("val"))
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        return v

    args = [value(a) for a in node.args]
    kwargs = {k: value(v) for k, v in node.kwargs.items()}
    result = value(node)
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    call = graph_pb2.CustomCall()
    call.inputs.extend(meta(t) for t in tensor_args(schema, args, kwargs))
    call.outputs.extend(meta(t) for t in outputs)
    return call


# ---------------------------------------------------------------------------
# The worker: stand-ins
# ---------------------------------------------------------------------------

_installed: set[str] = set()
"""Namespaces whose packages the operator installed on this worker (`use_installed`)."""
_listed: dict[str, str] = {}
"""Namespace → module of each entry `use_installed` was given, loaded or not."""
_applied: tuple[str, ...] | None = None
"""The list `use_installed` last applied in full; None before, or after one that raised."""
_libraries: dict[str, torch.library.Library] = {}
_standins: dict[str, str] = {}
"""Stand-in op target → the schema it was defined with, in this process."""
_calls: dict[str, list[_Call]] = {}
"""Stand-in op target → the recorded calls of the graph being decoded."""


@dataclass(frozen=True)
class _Call:
    inputs: list[tuple[torch.dtype, tuple[sympy.Expr, ...]]]
    outputs: list[tuple[list[Any], list[Any], torch.dtype, torch.device]]
    """(shape, stride, dtype, device), sizes as ints or SymInts of the decoding ShapeEnv."""
    returns: tuple[str, ...]


@contextlib.contextmanager
def job_scope() -> Iterator[None]:
    """Every stand-in defined inside is gone after it: the fragments destroyed (which
    clears `torch.ops.<ns>.<name>`), the records forgotten."""
    try:
        yield
    finally:
        for lib in _libraries.values():
            lib._destroy()
        _libraries.clear()
        _standins.clear()
        _calls.clear()


def use_installed(modules: Iterable[str]) -> None:
    """Imports each `namespace=module` (an operator's setting, or the reviewed defaults;
    never a client's), whose import registers that namespace's ops; their calls then use
    the real ops. An entry of DEFAULT_INSTALLED_OP_MODULES whose package is not installed
    is skipped: its ops get stand-ins, and a refusal says what to install.

    The list replaces the one an earlier call gave: this process serves the namespaces of
    the last list only (a module imported before stays imported; its namespace's ops are
    then refused as not configured, never served as installed)."""
    global _applied
    modules = tuple(modules)
    if modules == _applied:  # each job's context applies the worker's list again
        return
    _applied = None
    _installed.clear()
    _listed.clear()
    for entry in modules:
        namespace, _, module = entry.partition("=")
        if namespace in _installed:
            continue
        _listed[namespace] = module
        if entry in DEFAULT_INSTALLED_OP_MODULES and importlib.util.find_spec(module.partition(".")[0]) is None:
            log.info("custom ops of namespace %s: %s is not installed on this worker", namespace, module)
            continue
        if module:
            importlib.import_module(module)
        _installed.add(namespace)
        log.info("custom ops of namespace %s are installed on this worker (%s)", namespace, module)
    _applied = modules


def to_serve(namespace: str) -> str:
    """What the workers' operator does so that `namespace`'s ops run on the farm: the
    exact setting, or the package to install where the setting already lists it."""
    module = _listed.get(namespace) or reviewed_module(namespace)
    if namespace in _listed and module:
        return f"install the package of {module} on the workers ({INSTALLED_OP_SETTING} lists {namespace}={module})"
    entry = f"{namespace}={module or '<the module whose import registers it>'}"
    return f"the workers' operator sets {INSTALLED_OP_SETTING}={entry} (added to any entries it lists)"


def _existing(schema: Schema) -> Any:
    packet = getattr(getattr(torch.ops, schema.namespace), schema.name, None) if hasattr(
        torch.ops, schema.namespace) else None
    return getattr(packet, schema.overload or "default", None) if packet is not None else None


def _loaded_elsewhere(schema: Schema) -> bool:
    """Whether another overload of the op is loaded, and not as this job's stand-in: a new
    overload would then answer under a name torch (or an installed package) owns."""
    if not hasattr(torch.ops, schema.namespace):
        return False
    packet = getattr(getattr(torch.ops, schema.namespace), schema.name, None)
    if packet is None:
        return False
    prefix = f"torch.ops.{schema.namespace}.{schema.name}."
    return not any(target.startswith(prefix) for target in _standins)


def _expr(size: object) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))  # type: ignore[call-overload]


def _fake(target: str, schema: Schema) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        tensors = tensor_args(schema, args, kwargs)
        got = [(t.dtype, tuple(_expr(s) for s in t.shape)) for t in tensors]
        for call in _calls.get(target, ()):
            if call.inputs == got:
                outs = [
                    torch.empty_strided(shape, stride, dtype=dtype, device=device)
                    for shape, stride, dtype, device in call.outputs
                ]
                if call.returns == ("Tensor",):
                    return outs[0]
                return outs if call.returns == ("Tensor[]",) else tuple(outs)
        raise RuntimeError(
            f"custom op {target}: no call the client recorded has tensor arguments {got}"
        )

    return fake


def _refuse_grad(target: str, op: Callable[[], Any], schema: Schema) -> Callable[..., Any]:
    def autograd(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(
            t.requires_grad for t in tensor_args(schema, args, kwargs)
        ):
            raise RefusedCustomOp(
                schema.target,
                "needs its backward, the client's Python, which the farm runs only from the "
                f"package installed on the workers; to serve it, {to_serve(schema.namespace)}",
            )
        with _BELOW_AUTOGRAD():
            return op()(*args, **kwargs)

    return autograd


def _define(schema: Schema, text: str) -> None:
    lib = _libraries.get(schema.namespace)
    if lib is None:
        lib = _libraries[schema.namespace] = torch.library.Library(schema.namespace, "FRAGMENT")
    lib.define(text.partition("::")[2])
    name = f"{schema.name}.{schema.overload}" if schema.overload else schema.name
    torch.library.register_fake(f"{schema.namespace}::{name}", _fake(schema.target, schema), lib=lib)
    lib.impl(name, _refuse_grad(schema.target, lambda: _existing(schema), schema), "Autograd")
    _standins[schema.target] = text
    log.info("defined a stand-in for custom op %s", text)


def ensure_op(text: str) -> Schema:
    """Makes `torch.ops.<ns>.<name>.<overload>` resolvable on this worker: the installed
    op, or a stand-in (defined once). Raises `RefusedCustomOp` when neither fits."""
    schema = parse_schema(text)
    existing = _existing(schema)
    if schema.namespace in _installed:
        if existing is None or str(existing._schema) != text:
            raise RefusedCustomOp(
                schema.target, "differs from, or is missing in, the package installed on the workers "
                "(the client and the workers need the same version of it)",
            )
        return schema
    if schema.target in _standins:
        if _standins[schema.target] != text:
            raise RefusedCustomOp(schema.target, "has another schema than this worker's stand-in")
        return schema
    if existing is not None or _loaded_elsewhere(schema):
        raise RefusedCustomOp(
            schema.target, "exists on this worker, but its namespace is not configured as installed; "
            f"to serve it, {to_serve(schema.namespace)}",
        )
    _define(schema, text)
    return schema


def install(
    ops: Iterable[graph_pb2.CustomOp],
    calls: Iterable[graph_pb2.CustomCall | None],
    targets: Sequence[str],
    size: Callable[[graph_pb2.SymExpr], Any],
) -> None:
    """Readies a decoded graph's custom ops: each op resolvable (`ensure_op`), and each
    stand-in answering this graph's recorded calls (`targets[i]` is the op of
    `calls[i]`; `size` decodes a size over this graph's ShapeEnv)."""
    schemas = {op.target: ensure_op(op.schema) for op in ops}
    fresh: dict[str, list[_Call]] = {t: [] for t in schemas if t in _standins}
    for target, call in zip(targets, calls, strict=True):
        if call is None or target not in fresh:
            continue
        inputs = [(_dtype(m), tuple(_expr(size(s)) for s in m.shape)) for m in call.inputs]
        outputs = [
            ([size(s) for s in m.shape], [size(s) for s in m.stride], _dtype(m), _device(m))
            for m in call.outputs
        ]
        made = _Call(inputs, outputs, schemas[target].returns)
        if any(c.inputs == inputs and _layout(c) != _layout(made) for c in fresh[target]):
            # The fake implementation tells calls apart by their tensor arguments only.
            raise RefusedCustomOp(
                target, "has calls with the same tensor arguments and different outputs "
                "(outputs that depend on non-tensor arguments are not supported)",
            )
        fresh[target].append(made)
    _calls.update(fresh)


def _layout(call: _Call) -> list[tuple[Any, ...]]:
    return [
        (tuple(map(_expr, shape)), tuple(map(_expr, stride)), dtype, device)
        for shape, stride, dtype, device in call.outputs
    ]


def _dtype(meta: TensorMeta) -> torch.dtype:
    dtype = getattr(torch, meta.dtype)
    assert isinstance(dtype, torch.dtype)
    return dtype


def _device(meta: TensorMeta) -> torch.device:
    d = meta.device
    return torch.device(d.type, d.index) if d.index >= 0 else torch.device(d.type)
