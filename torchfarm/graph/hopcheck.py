"""The constants of a higher-order op's call, checked by position.

A torch op has a schema, and a constant of the wrong type fails in its argument parser;
a higher-order op has none, and Inductor writes some of its constants into the kernel
source it generates: flex attention's `scale` into a C++ template (`accum_t
scaling_factor = {{scale}};`), its kernel options as `NAME : tl.constexpr = VALUE` lines
of a Triton template. Text in such a place is code the worker compiles, and loads where
it loads what it compiled. So a higher-order op's call holds text only where Dynamo puts
it, each of a form torch takes, and flex attention's scale is a number (graphcheck.py
calls `check_hop_constants` for each higher-order op's call).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.textcheck import texts
from torchfarm.v1 import graph_pb2

FLEX_ATTENTION = "torch.ops.higher_order.flex_attention"
INVOKE_SUBGRAPH = "torch.ops.higher_order.invoke_subgraph"
CHECKPOINT = "torch.ops.higher_order.tag_activation_checkpoint"

FLEX_BACKENDS = frozenset({"AUTO", "TRITON", "TRITON_DECODE", "FLASH"})
"""flex attention's `kernel_options["BACKEND"]` values (torch/nn/attention/flex_attention.py)."""

DETERMINISM_CHECKS = frozenset({"default", "none"})
"""`checkpoint(determinism_check=...)`'s values (torch/utils/checkpoint.py)."""

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
"""A kernel option's name, and invoke_subgraph's identifier."""

SCALE_KINDS = frozenset({"none", "float_value", "int_value", "node", "sym"})
"""flex attention's scale: a number, a symbolic one, or None for the default."""

OPTION_KINDS = frozenset({"none", "bool_value", "int_value", "float_value"})
"""A kernel option's value, BACKEND's aside."""

Check = Callable[[graph_pb2.Argument, str], None]


def check_hop_constants(node: graph_pb2.Node, where: str) -> None:
    """Raises MalformedGraph for text anywhere in the call of the higher-order op `node`
    but the places its op takes text, or a constant of a kind its place does not take."""
    places = _PLACES.get(node.target, {})
    given: list[tuple[int | str, graph_pb2.Argument]] = [
        *enumerate(node.args), *((kw.name, kw.value) for kw in node.kwargs)
    ]
    for place, arg in given:
        check = places.get(place)
        if check is not None:
            check(arg, where)
        elif next(texts(arg), None) is not None:
            raise MalformedGraph(f"{where}: {node.target} takes no text as its argument {place!r}")


def _scale(arg: graph_pb2.Argument, where: str) -> None:
    if arg.WhichOneof("kind") not in SCALE_KINDS:
        raise MalformedGraph(f"{where}: flex attention's scale is a number or None")


def _kernel_options(arg: graph_pb2.Argument, where: str) -> None:
    if arg.WhichOneof("kind") != "immutable_dict":
        raise MalformedGraph(f"{where}: flex attention's kernel options are a dict")
    items = arg.immutable_dict.items
    for name, value in zip(items[::2], items[1::2], strict=True):
        if name.WhichOneof("kind") != "str_value" or not IDENTIFIER.match(name.str_value):
            raise MalformedGraph(f"{where}: a flex attention kernel option is named by an identifier")
        if name.str_value == "BACKEND":
            if value.WhichOneof("kind") != "str_value" or value.str_value not in FLEX_BACKENDS:
                raise MalformedGraph(
                    f"{where}: flex attention's BACKEND is one of {', '.join(sorted(FLEX_BACKENDS))}"
                )
        elif value.WhichOneof("kind") not in OPTION_KINDS:
            raise MalformedGraph(
                f"{where}: flex attention kernel option {name.str_value!r} is a number, a bool or None"
            )


def _identifier(arg: graph_pb2.Argument, where: str) -> None:
    if arg.WhichOneof("kind") != "str_value" or not IDENTIFIER.match(arg.str_value):
        raise MalformedGraph(f"{where}: invoke_subgraph's identifier is an identifier")


def _determinism_check(arg: graph_pb2.Argument, where: str) -> None:
    if arg.WhichOneof("kind") != "str_value" or arg.str_value not in DETERMINISM_CHECKS:
        raise MalformedGraph(
            f"{where}: checkpoint's determinism_check is one of {', '.join(sorted(DETERMINISM_CHECKS))}"
        )


_PLACES: dict[str, dict[int | str, Check]] = {
    # flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, ...)
    FLEX_ATTENTION: {5: _scale, "scale": _scale, 6: _kernel_options, "kernel_options": _kernel_options},
    # invoke_subgraph(subgraph, identifier, *operands)
    INVOKE_SUBGRAPH: {1: _identifier, "identifier": _identifier},
    CHECKPOINT: {"determinism_check": _determinism_check},
}
"""Each higher-order op's places that take text or a constant of one kind, by position
or keyword, and their checks; text anywhere else in its call is refused."""
