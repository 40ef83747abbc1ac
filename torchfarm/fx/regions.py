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
gradient), the SDK inlines every region with Dynamo's own pass
(`torch._dynamo.config.inline_invoke_subgraph` runs the same one) before it keys and
sends the graph, and its local fallback compiles the same graph. This gives up the
region's compile-once for the backward's correctness; an inference graph keeps its
regions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchfarm.fx.internals import resolve


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
    resolve("inline_invoke_subgraph")(gm)
    gm.delete_all_unused_submodules()  # the regions' bodies: nothing calls them now
    gm.recompile()
    return True
