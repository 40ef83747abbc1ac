"""`nested_compile_region` in a training graph: inlined before the graph is sent.

Dynamo leaves a region called more than once as one subgraph and an `invoke_subgraph`
node per call (a region called once it inlines itself,
`inline_single_use_invoke_subgraph`). In torch 2.13, Inductor's backward of such a reused
region is wrong: a model whose forward calls a region twice trains with gradients off by
as much as their own size for the region's parameters and inputs, compiled locally or on
the farm alike, while `aot_eager` and the inlined graph match eager
(tests/unit/test_regions.py pins both). Upstream's pytorch#193960 fixes one cause
(donated buffers of a subgraph); turning donation off alone does not make it right.

So where the graph will be differentiated (grad mode on and an input that requires a
gradient), the SDK inlines every region before it keys and sends the graph, and its
local fallback compiles the same graph. This gives up the region's compile-once for the
backward's correctness; an inference graph keeps its regions.

The inlining is the one Dynamo runs for `torch._dynamo.config.inline_invoke_subgraph`
(`torch._higher_order_ops.passes.inline_invoke_subgraph`, since torch 2.12), written
here on public FX calls so that it needs no private module and runs on torch 2.11 too.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch


def has_regions(gm: torch.fx.GraphModule) -> bool:
    invoke = torch.ops.higher_order.invoke_subgraph
    return any(
        mod.graph.find_nodes(op="call_function", target=invoke)
        for mod in gm.modules() if isinstance(mod, torch.fx.GraphModule)
    )


def differentiated(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph called on these inputs now will have a backward."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def inline_for_training(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Inlines `gm`'s regions in place where it will be differentiated; True if it did."""
    if not (differentiated(example_inputs) and has_regions(gm)):
        return False
    _inline(gm)
    gm.delete_all_unused_submodules()  # the regions' bodies: nothing calls them now
    gm.recompile()
    return True


def _inline(gm: torch.fx.GraphModule) -> None:
    """Replaces each `invoke_subgraph(body, identifier, *operands)` in `gm`, and in the
    graphs under it (innermost first), by a copy of the body's nodes."""
    for child in list(gm.children()):  # a list: inlining adds the bodies' own children
        if isinstance(child, torch.fx.GraphModule):
            _inline(child)
    graph = gm.graph
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.higher_order.invoke_subgraph)):
        body_attr, operands = node.args[0], node.args[2:]
        assert isinstance(body_attr, torch.fx.Node)
        body = getattr(gm, str(body_attr.target))
        renamed = _hoist_children(gm, body)
        env: dict[torch.fx.Node, Any] = dict(zip(body.graph.find_nodes(op="placeholder"), operands, strict=True))
        with graph.inserting_before(node):
            for sub in body.graph.nodes:
                if sub.op in ("placeholder", "output"):
                    continue
                copied = graph.node_copy(sub, env.__getitem__)
                if sub.op == "get_attr" and sub.target in renamed:
                    copied.target = renamed[sub.target]
                env[sub] = copied
        results = body.graph.output_node().args[0]
        for user in list(node.users):  # Dynamo reads a region's results by index only
            if user.op != "call_function" or user.target is not operator.getitem:
                raise ValueError(f"invoke_subgraph result used by {user.format_node()}, not by index")
            user.replace_all_uses_with(env[results[user.args[1]]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not body_attr.users:
            graph.erase_node(body_attr)


def _hoist_children(gm: torch.fx.GraphModule, body: torch.fx.GraphModule) -> dict[str, str]:
    """Registers `body`'s child modules (the bodies of its own higher-order calls) on
    `gm`, each under a name free there; {name in body: name in gm}."""
    taken = {name for name, _ in gm.named_children()}
    renamed = {}
    for child, mod in body.named_children():
        new, n = child, 0
        while new in taken:
            new, n = f"{child}_{n}", n + 1
        gm.add_module(new, mod)
        taken.add(new)
        renamed[child] = new
    return renamed
