"""A graph split at the calls the farm refuses, so that the rest still compiles there.

One refused call (Reformer's `torch.seed()`, a user's `@triton.jit` kernel, a custom op
that mutates its argument) used to send its whole graph to the local Inductor: a
machine meant to compile nothing compiled an entire forward. With `fallback="local"`
the backend now splits such a graph at those calls, as Dynamo splits a frame at a graph
break (torch.fx's `split_module`, which DDPOptimizer uses too): each refused call runs
eagerly, where it stood, and each run of calls between them is a graph of its own,
sent to the farm like any other (its own key, line and fallback). The pieces lose the
fusions across a refused call; `TORCHFARM_SPLIT_REFUSED=0` compiles such a graph whole,
locally, instead.

A piece's inputs are the graph's own (the example inputs Dynamo gave) and values
computed before it, described by Dynamo's fake `example_value` of the node that made
them: their sizes, strides and `requires_grad` as eager computes them. Inductor's code
for a piece asserts its inputs' sizes and strides (`size_asserts`, on by default), so a
value that differs at run time raises rather than computes wrongly.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from torchfarm.fx.encode import UnsupportedGraph, qualified_name, refused_calls, written_aliases
from torchfarm.graph import graphcheck


class NotSplit(Exception):
    """The graph cannot be split here; it is compiled whole, as before splitting existed."""


@dataclass(frozen=True)
class Piece:
    """A run of calls the farm takes: a graph of its own, with its example inputs."""

    name: str
    """Its submodule in the split graph, which the compiled piece replaces."""
    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    single: bool
    """Whether it returns one value: a compiled graph returns a tuple, unwrapped here."""


@dataclass(frozen=True)
class Split:
    root: torch.fx.GraphModule
    """The graph as pieces: it calls each piece and each refused call in order."""
    pieces: list[Piece]
    refused: dict[str, str]
    """Each refused call's node name and why the farm refuses it."""

    def install(self, piece: Piece, compiled: Callable[..., Any]) -> None:
        """Runs `compiled` where `piece`'s calls ran."""
        setattr(self.root, piece.name, _Compiled(compiled, piece.single))


class _Compiled(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any], single: bool) -> None:
        super().__init__()
        self.fn = fn
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.fn(*args)
        return out[0] if self.single else out


def split_refused(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], ops: Mapping[str, str] | None = None
) -> Split | None:
    """`gm` as pieces around the calls the farm refuses; None when it refuses none.
    Raises NotSplit when such a graph cannot be split.

    The format's refusals are found here; `ops` adds ops the farm refused once it had the
    graph (a custom op whose backward is the client's Python), by qualified name, with why."""
    refused = refused_calls(gm) if ops is None else _calls_of(gm, ops)
    if not refused:
        return None
    transform = _functorch_call(gm)
    if transform is not None:
        raise NotSplit(
            f"a functorch transform (torch.func.grad, vmap, ...) runs in the graph ({transform}): "
            "a piece would run inside its level, as no compiled graph can"
        )
    unpacking = _unpack_beside(gm, refused)
    partition: dict[torch.fx.Node, int] = {}
    eager: set[int] = set()
    current, was_refused = 0, None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        is_refused = node in refused or node in unpacking
        if is_refused != was_refused:
            current += 1
            was_refused = is_refused
            if is_refused:
                eager.add(current)
        partition[node] = current
    try:
        root = split_module(gm, gm, partition.__getitem__, keep_original_order=True)
    except Exception as e:  # split_module raises what its passes meet, untyped
        raise NotSplit(f"{type(e).__name__}: {e}") from e
    inputs = _graph_inputs(gm, example_inputs)
    eager_names = {f"submod_{p}" for p in eager}  # split_module's names for partitions
    pieces = [
        _piece(root, node, inputs)
        for node in root.graph.find_nodes(op="call_module")
        if node.target not in eager_names and _worth_sending(root, node)
    ]
    for piece in pieces:
        written = written_aliases(piece.gm)
        if written:
            # `x.data.clamp_()` with `x` beside it: compiled apart, the piece read `x`
            # as it was before its own write (locally too: its inputs mix real and fake).
            raise NotSplit(f"{piece.name} writes its inputs {' and '.join(written)}, which share memory")
    return Split(root, pieces, {n.name: why for n, why in refused.items()})


_FUNCTORCH = ("torch._C._functorch.", "torch._functorch.")
_FORWARD_MODE = frozenset(graphcheck.FUNCTORCH_JVP)
"""Forward mode's calls, functorch's or not: torch 2.11 and 2.12 record a dual level
entered as `torch._C._enter_dual_level`, and a dual tensor has no tangent to compile."""


def _functorch_call(gm: torch.fx.GraphModule) -> str | None:
    """The first call that enters, leaves or works in a functorch transform's level
    (`_grad_increment_nesting`, `_wrap_for_grad`, `_add_batch_dim`), by name; None if
    the graph makes none. Split there, the transform's calls run eagerly and the pieces
    between them, compiled for plain tensors, inside its level: AOTAutograd's compiled
    function refuses to run under `grad`, and a batched tensor has no storage to compile."""
    return next(
        (name for _, name in _named_calls(gm) if name.startswith(_FUNCTORCH) or name in _FORWARD_MODE), None
    )


def _unpack_beside(gm: torch.fx.GraphModule, refused: Mapping[torch.fx.Node, str]) -> set[torch.fx.Node]:
    """The getitems that unpack a refused call's tuple (a higher-order op's outputs, a
    custom op's pair), each moved to just after what it unpacks: they run eagerly with
    the call, so a piece takes the tensors. Left in a piece, the piece would take the
    tuple itself as an input, which the format refuses, and compile locally. Moving them
    is sound: a getitem reads only the tuple and a constant index."""
    unpacking: set[torch.fx.Node] = set()
    moved = False
    for call in refused:
        last, sources = call, [call]
        while sources:
            source = sources.pop(0)
            for user in list(source.users):
                if user.op == "call_function" and user.target is operator.getitem and user.args[0] is source:
                    moved |= last.next is not user
                    last.append(user)
                    last = user
                    unpacking.add(user)
                    sources.append(user)
    if moved:
        gm.recompile()
    return unpacking


def _calls_of(gm: torch.fx.GraphModule, ops: Mapping[str, str]) -> dict[torch.fx.Node, str]:
    """The calls of `ops` in `gm`, each with why it is refused."""
    calls = {}
    for node, name in _named_calls(gm):
        why = ops.get(name) or ops.get(f"{name}.default")  # a packet calls its default overload
        if why is not None:
            calls[node] = why
    return calls


def _named_calls(gm: torch.fx.GraphModule) -> Iterator[tuple[torch.fx.Node, str]]:
    """Each call_function node of `gm` with its target's qualified name; those the
    format cannot name are left out."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        try:
            yield node, qualified_name(node.target)
        except UnsupportedGraph:
            continue


def _graph_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, tuple[Any, Any]]:
    """Each placeholder's name → its example input and Dynamo's source for it."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(example_inputs):
        raise NotSplit(f"{len(example_inputs)} example inputs for {len(placeholders)} placeholders")
    return {
        node.name: (value, getattr(node, "_dynamo_source", None))
        for node, value in zip(placeholders, example_inputs, strict=True)
    }


def _worth_sending(root: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether the piece computes a tensor: one that only unpacks a tuple or does size
    arithmetic runs eagerly, cheaper than a farm round trip."""
    sub = root.get_submodule(str(node.target))
    assert isinstance(sub, torch.fx.GraphModule)
    return any(
        n.op in ("call_function", "call_method") and n.target is not operator.getitem
        and _holds_tensors(n.meta.get("example_value"))
        for n in sub.graph.nodes
    )


def _holds_tensors(value: object) -> bool:
    """A tensor, or a higher-order op's tuple of them."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(_holds_tensors(v) for v in value)


def _piece(root: torch.fx.GraphModule, node: torch.fx.Node, inputs: dict[str, tuple[Any, Any]]) -> Piece:
    name = str(node.target)
    sub = root.get_submodule(name)
    assert isinstance(sub, torch.fx.GraphModule)
    placeholders = list(sub.graph.find_nodes(op="placeholder"))
    first = next(iter(sub.graph.nodes))
    if first.op != "placeholder":
        # split_module re-enters an autocast region at a piece's very start, before its
        # placeholders; a graph takes its inputs first.
        for placeholder in placeholders:
            first.prepend(placeholder)
    example_inputs = []
    for placeholder in placeholders:
        if placeholder.name in inputs:
            value, source = inputs[placeholder.name]
            if source is not None:
                placeholder._dynamo_source = source  # a buffer stays a buffer
        elif "example_value" in placeholder.meta:
            value = placeholder.meta["example_value"]
        else:
            raise NotSplit(f"{name}'s input {placeholder.name} has no example value")
        example_inputs.append(value)
    (output,) = sub.graph.find_nodes(op="output")
    single = not isinstance(output.args[0], tuple)
    if single:
        output.args = ((output.args[0],),)
    sub.recompile()
    return Piece(name, sub, example_inputs, single)
