"""Tensors a graph reads by `get_attr`, made its inputs before it goes to the farm.

Dynamo reads some tensors as attributes of the graph rather than as inputs: a compiled
optimizer step's parameters and state (momentum buffers, Adam's `step` and moments),
which it holds at static addresses. A `get_attr` is a read at run time, by reference:
the step writes the parameters in place and reads this step's `step`. The format
carries a `get_attr` tensor as an inline constant, by value, so sent as it stands the
compiled step would write the worker's copies and read the first step's values for
ever; AOTAutograd also lifts a parameter among them into an input of the compiled code,
which the caller would not pass. Made inputs, each tensor travels as its metadata (its
values stay out of the request and its key, so every step shares one artifact), and
the compiled graph is called with the tensors themselves, read and written in place.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


@dataclass(frozen=True)
class Lifted:
    gm: torch.fx.GraphModule
    """A copy of the graph with a placeholder, after its own, for each tensor it read by
    get_attr."""
    example_inputs: list[Any]
    """The graph's example inputs, then the tensors."""
    tensors: tuple[torch.Tensor, ...]

    def bind(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """`compiled`, called as the original graph is: the tensors follow its inputs."""
        tensors = self.tensors

        def call(*args: Any) -> Any:
            return compiled(*args, *tensors)

        return call


def lift_attribute_tensors(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Lifted | None:
    """A copy of `gm` with each tensor it reads by `get_attr` as an input; None when it
    reads none. One tensor read under two names is one input. A higher-order op's bodies
    (`get_attr` of a GraphModule) stay as they are. `gm` is Dynamo's and is left as it
    is: Dynamo reads its placeholders once the backend returns."""
    reads: dict[int, list[torch.fx.Node]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = operator.attrgetter(str(node.target))(gm)
        if isinstance(value, torch.Tensor):
            reads.setdefault(id(value), []).append(node)
            tensors[id(value)] = value
    if not reads:
        return None
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    placeholders = gm.graph.find_nodes(op="placeholder")
    for node in placeholders:
        if hasattr(node, "_dynamo_source"):  # AOTAutograd and the encoder read it
            copies[node]._dynamo_source = node._dynamo_source
    sources = getattr(gm, "_param_name_to_source", None) or {}
    at = copies[placeholders[-1]] if placeholders else None
    for nodes in reads.values():
        with graph.inserting_after(at) if at is not None else graph.inserting_before(next(iter(graph.nodes))):
            placeholder = graph.placeholder(f"attr_{nodes[0].name}")
        placeholder.meta.update(nodes[0].meta)
        placeholder._dynamo_source = sources.get(str(nodes[0].target))
        for node in nodes:
            copies[node].replace_all_uses_with(placeholder)
            graph.erase_node(copies[node])
        at = placeholder
    lifted_gm = torch.fx.GraphModule(gm, graph)
    lifted_gm.meta.update(gm.meta)
    if sources:  # AOTAutograd looks up only the parameters the copy still holds
        lifted_gm._param_name_to_source = dict(sources)  # type: ignore[assignment]
    lifted = tuple(tensors[ident] for ident in reads)
    return Lifted(lifted_gm, [*example_inputs, *lifted], lifted)

