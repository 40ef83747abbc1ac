"""Every target Dynamo can put in a graph on the running torch, named as the format names it.

The farm's coverage is derived from this walk, not collected one model at a time:
`scripts/gen_allowlist.py` allows what it yields unless `torchfarm.graph.denylist` refuses it
by name, and tests/unit/test_surface.py fails on any target that is neither. The walk
covers:

- every function and Tensor method torch declares overridable
  (`torch.overrides.get_overridable_functions`, `get_testing_overrides`): functions by
  their qualified name; Tensor methods as `call_method` names, which is also how the
  format carries the function form (`torch._tensor.Tensor.split`) Dynamo records under
  a torch-function mode (`encode.tensor_method_name`); Tensor properties as the
  attribute names `builtins.getattr` reads;
- the builtins Dynamo puts in graphs (`operator`, `math`, `getattr`);
- numpy calls Dynamo traces through `torch._numpy` (`np.lcm`, `np.sqrt`, ndarray methods
  and operators), each as `encode.numpy_name` writes its wrapper;
- every registered higher-order op, and the ATen and prims ops a decomposed graph holds.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from torchfarm.fx.encode import UnsupportedGraph, numpy_name, qualified_name, tensor_method_name
from torchfarm.fx.internals import resolve

FUNCTION, METHOD, ATTRIBUTE = "function", "method", "attribute"

DISPATCHER_NAMESPACES = ("aten", "prims")
"""Dispatcher namespaces of the ops a decomposed graph (workers/aot_seam.py) holds."""


@dataclass(frozen=True)
class Target:
    kind: str
    """FUNCTION (a call_function target), METHOD (a call_method name) or ATTRIBUTE."""
    name: str
    """As the format writes it; for a target the format cannot name, its repr."""
    encodable: bool = True


def name_of(obj: object) -> Target:
    """How the format carries `obj` as a call target (encode's own naming)."""
    method = tensor_method_name(obj)
    if method is not None:
        return Target(METHOD, method)
    try:
        return Target(FUNCTION, numpy_name(obj) or qualified_name(obj))
    except UnsupportedGraph:
        return Target(FUNCTION, repr(obj), encodable=False)


def _tensor_attribute(getter: object) -> str | None:
    """The Tensor attribute whose descriptor's `__get__` is `getter`."""
    owner = getattr(getter, "__self__", None)
    if getattr(getter, "__name__", None) != "__get__" or owner is None:
        return None
    for cls in torch.Tensor.__mro__:
        for name, value in vars(cls).items():
            if value is owner:
                return name
    return None


def overridable() -> Iterator[Target]:
    found: list[object] = [f for fs in torch.overrides.get_overridable_functions().values() for f in fs]
    found.extend(torch.overrides.get_testing_overrides())
    for obj in found:
        attribute = _tensor_attribute(obj)
        yield Target(ATTRIBUTE, attribute) if attribute is not None else name_of(obj)


def builtin_calls() -> Iterator[Target]:
    fns: set[object] = set(resolve("fx_graph_functions")())
    fns.update(v for k, v in vars(operator).items() if not k.startswith("_") and callable(v))
    fns.update(v for k, v in vars(math).items() if not k.startswith("_") and callable(v))
    fns.add(builtins.getattr)
    for fn in fns:
        yield name_of(fn)


def numpy_calls() -> Iterator[Target]:
    to_tensor = resolve("numpy_to_tensor_wrapper")
    for fn in resolve("np_to_tnp_map")().values():
        yield name_of(to_tensor(fn))
    ndarray = resolve("torch_numpy").ndarray
    method = resolve("numpy_method_wrapper")
    for name in dir(ndarray):
        if not name.startswith("_") and callable(getattr(ndarray, name)):
            yield name_of(method(name))
    on_ndarrays = resolve("numpy_operator_wrapper")
    for op in resolve("fx_graph_functions")():
        yield name_of(on_ndarrays(op))


def higher_order_ops() -> Iterator[Target]:
    for op in resolve("higher_order_ops").values():
        yield name_of(op)


def dispatcher_ops() -> Iterator[Target]:
    for full in sorted(resolve("dispatcher_op_names")()):
        ns, _, rest = full.partition("::")
        if ns not in DISPATCHER_NAMESPACES:
            continue
        op, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, ns), op, None)
        if packet is not None:
            yield name_of(packet)
            yield name_of(getattr(packet, overload or "default"))


@functools.cache
def surface() -> tuple[Target, ...]:
    """The whole walk, each target once, sorted."""
    resolve("inductor_prims")  # imported: registers the prims Inductor's decompositions emit
    resolve("inductor_passes")  # and the higher-order ops its passes make
    found = {*overridable(), *builtin_calls(), *numpy_calls(), *higher_order_ops(), *dispatcher_ops()}
    return tuple(sorted(found, key=lambda t: (t.kind, t.name)))
