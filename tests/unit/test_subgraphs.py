"""Subgraphs in the graph format (graph.proto V2): higher-order ops' bodies.

Round trips of the graphs Dynamo captures for activation checkpointing,
autograd.Function, nested_compile_region, torch.cond, while_loop and flex_attention
(encode, validate, decode, run the decoded module on the real inputs against the
captured one), and the validator's refusals of hostile subgraphs: a denied op inside a
body, nesting past the bound, a dangling or unreferenced subgraph name, a subgraph given
to an op that is no higher-order op, a higher-order op the farm does not allow, and the
node and constant budgets counted over every subgraph together.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import UnsupportedGraph, encode_graph
from torchfarm.graph.graph_errors import DisallowedOp, GraphTooLarge, MalformedGraph
from torchfarm.graph.graphcheck import GraphLimits, validate_graph
from torchfarm.v1 import graph_pb2
from torchfarm.wire.keys import graph_digest

Node = graph_pb2.Node
V1, V2 = graph_pb2.GRAPH_FORMAT_V1, graph_pb2.GRAPH_FORMAT_V2


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x


_lin = nn.Linear(4, 4)


@torch.compiler.nested_compile_region
def _region(y):
    return torch.relu(_lin(y))


def _flex(x):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 128, 128, device="cpu")
    q = x.view(1, 1, 128, 4)
    return flex_attention(q, q, q, score_mod=lambda s, b, h, qi, kv: s + (qi - kv) * 0.1, block_mask=mask)


_SLOPES = torch.tensor([0.5])
_DOCUMENT = torch.arange(128) // 32


def _flex_indexing_captured_tensors(x):
    """ALiBi's `slopes[h]` in a score_mod and a document mask's `doc[q] == doc[kv]`: a
    body indexing a tensor it captured with its index arguments, which Dynamo traces
    under flex attention's getitem-to-index mode."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q, kv: _DOCUMENT[q] == _DOCUMENT[kv], 1, 1, 128, 128, device="cpu")
    q = x.view(1, 1, 128, 4)
    return flex_attention(q, q, q, score_mod=lambda s, b, h, qi, kv: s - _SLOPES[h] * (qi - kv), block_mask=mask)


CASES = {
    # name: (function, rows of the input, whether it requires grad, subgraph names)
    "checkpoint": (lambda x: checkpoint.checkpoint(lambda y: _lin(y).relu(), x, use_reentrant=False),
                   4, True, ["wrap_body_0"]),
    "checkpoint_default": (lambda x: checkpoint.checkpoint(lambda y: _lin(y).relu(), x), 4, True, ["wrap_body_0"]),
    "autograd_function": (lambda x: Twice.apply(_lin(x)), 4, True, ["bwd_body_0", "fwd_body_0"]),
    "nested_compile_region": (lambda x: _region(x) + _region(x), 4, True, ["subgraph_0"]),
    "cond": (lambda x: torch.cond(x.sum() > 0, lambda y: _lin(y).sin(), lambda y: y.cos(), (x,)),
             4, True, ["cond_false_0", "cond_true_0"]),
    "while_loop": (lambda x: torch._higher_order_ops.while_loop(
        lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))[1], 4, True,
        ["body_fn_0", "cond_fn_0"]),
    # FlexAttention has no backward on CPU.
    "flex_attention": (_flex, 128, False, ["mask_fn_0", "score_mod_0"]),
    "flex_attention_indexing": (_flex_indexing_captured_tensors, 128, False, ["mask_fn_0", "score_mod_0"]),
}


def capture(fn, rows: int, grad: bool) -> tuple[torch.fx.GraphModule, list]:
    seen: list = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(rows, 4, requires_grad=grad)
    torch.compile(fn, backend=backend, fullgraph=True)(x)
    torch._dynamo.reset()
    assert len(seen) == 1
    return seen[0]


@pytest.fixture(scope="module")
def checkpointed() -> graph_pb2.Graph:
    gm, inputs = capture(*CASES["checkpoint"][:3])
    return encode_graph(gm, inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip(name):
    fn, rows, grad, subgraphs = CASES[name]
    gm, inputs = capture(fn, rows, grad)
    graph = encode_graph(gm, inputs)
    assert graph.format == V2
    assert [s.name for s in graph.subgraphs] == subgraphs
    assert all(s.graph.format == V2 and not s.graph.symbols for s in graph.subgraphs)
    decoded = decode_graph(graph)
    assert len(list(decoded.gm.named_children())) == len(subgraphs)
    for child in decoded.gm.children():
        # Fake values on the bodies' nodes, as Dynamo leaves them.
        assert all("example_value" in n.meta for n in child.graph.nodes if n.op != "output")
    # The decoded module is runnable: on the real inputs it computes what Dynamo's did.
    with torch.no_grad():
        want = gm(*inputs)
        got = decoded.gm(*[i.detach() for i in inputs])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_selective_activation_checkpointing_is_unsupported_by_name():
    """Its policy (`context_fn`) is the client's Python, in the body's meta: encoded, the
    body lost it, and the worker saved what plain checkpointing saves."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def save_matmuls(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    policy = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    gm, inputs = capture(
        lambda x: checkpoint.checkpoint(lambda y: _lin(y).relu(), x, use_reentrant=False, context_fn=policy),
        4, True,
    )
    with pytest.raises(UnsupportedGraph, match="selective activation checkpointing: its policy "
                       r"\(create_selective_checkpoint_contexts\(.*save_matmuls\)\)"):
        encode_graph(gm, inputs)


def test_a_graph_without_subgraphs_stays_v1():
    gm, inputs = capture(lambda x: _lin(x).relu(), 4, True)
    graph = encode_graph(gm, inputs)
    assert graph.format == V1 and not graph.subgraphs


def test_the_key_covers_subgraphs(checkpointed):
    changed = copy.deepcopy(checkpointed)
    body = changed.subgraphs[0].graph
    relu = next(n for n in body.nodes if n.target == "relu")
    relu.target = "sigmoid"
    validate_graph(changed)
    assert graph_digest(changed) != graph_digest(checkpointed)
    assert graph_digest(changed, hints=False) != graph_digest(checkpointed, hints=False)


# ---------------------------------------------------------------------------
# Hostile subgraphs
# ---------------------------------------------------------------------------


def test_a_denied_op_inside_a_subgraph_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    body = hostile.subgraphs[0].graph
    linear = next(n for n in body.nodes if n.op == Node.CALL_FUNCTION)
    linear.target = "torch.save"
    with pytest.raises(DisallowedOp, match="torch.save"):
        validate_graph(hostile)
    with pytest.raises(DisallowedOp):
        decode_graph(hostile)


def test_a_denied_method_inside_a_subgraph_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    relu = next(n for n in hostile.subgraphs[0].graph.nodes if n.target == "relu")
    relu.target = "untyped_storage"
    with pytest.raises(DisallowedOp, match="untyped_storage"):
        validate_graph(hostile)


def _nested(graph: graph_pb2.Graph, depth: int) -> graph_pb2.Graph:
    """`graph` whose body is `graph` whose body is ... `depth` subgraphs deep."""
    nested = copy.deepcopy(graph)
    for _ in range(depth - 1):
        outer = copy.deepcopy(graph)
        outer.subgraphs[0].graph.CopyFrom(nested)
        nested = outer
    return nested


def test_subgraphs_nested_past_the_bound_are_refused(checkpointed):
    limits = GraphLimits(max_subgraph_depth=4)
    validate_graph(_nested(checkpointed, 4), limits)
    with pytest.raises(GraphTooLarge, match="nested deeper than 4"):
        validate_graph(_nested(checkpointed, 5), limits)
    with pytest.raises(GraphTooLarge, match="nested deeper"):
        validate_graph(_nested(checkpointed, GraphLimits().max_subgraph_depth + 1))


def test_a_dangling_subgraph_name_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hostile.subgraphs[0].name = "other_body"
    with pytest.raises(MalformedGraph, match="undeclared constant or subgraph 'wrap_body_0'"):
        validate_graph(hostile)


def test_an_unreferenced_subgraph_is_refused(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    extra = hostile.subgraphs.add(name="zz_unused")
    extra.graph.CopyFrom(checkpointed.subgraphs[0].graph)
    with pytest.raises(MalformedGraph, match="'zz_unused' is named by no get_attr"):
        validate_graph(hostile)


def test_subgraphs_must_be_sorted_and_unique(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hostile.subgraphs.add(name="wrap_body_0").graph.CopyFrom(checkpointed.subgraphs[0].graph)
    with pytest.raises(MalformedGraph, match="unique and sorted"):
        validate_graph(hostile)


def test_a_v1_graph_has_no_subgraphs(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hostile.format = V1
    with pytest.raises(MalformedGraph, match="V1 graph has no subgraphs"):
        validate_graph(hostile)


def test_a_subgraph_declares_no_symbols(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hostile.subgraphs[0].graph.symbols.add(name="s9", hint=4, min=2)
    with pytest.raises(MalformedGraph, match="declares symbols"):
        validate_graph(hostile)


def test_a_subgraph_goes_only_to_a_higher_order_op(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    # `body.to("cuda")` (a Module method by a Tensor method's name) instead of the
    # checkpoint call.
    hop = next(n for n in hostile.nodes if n.target.startswith("torch.ops.higher_order."))
    hop.op = Node.CALL_METHOD
    hop.target = "to"
    del hop.args[1:]
    hop.args.add(str_value="cuda")
    del hop.kwargs[:]
    with pytest.raises(MalformedGraph, match="no higher-order op"):
        validate_graph(hostile)


def test_a_higher_order_op_off_the_list_is_refused_by_name(checkpointed):
    hostile = copy.deepcopy(checkpointed)
    hop = next(n for n in hostile.nodes if n.target.startswith("torch.ops.higher_order."))
    hop.target = "torch.ops.higher_order.triton_kernel_wrapper_mutation"
    with pytest.raises(DisallowedOp, match="higher-order op 'torch.ops.higher_order.triton_kernel_wrapper_mutation'"):
        validate_graph(hostile)


def test_nodes_are_counted_over_all_subgraphs(checkpointed):
    outer = len(checkpointed.nodes)
    total = outer + len(checkpointed.subgraphs[0].graph.nodes)
    validate_graph(checkpointed, GraphLimits(max_nodes=total))
    with pytest.raises(GraphTooLarge, match="subgraphs included"):
        validate_graph(checkpointed, GraphLimits(max_nodes=total - 1))


def test_constant_bytes_are_counted_over_all_subgraphs(checkpointed):
    graph = copy.deepcopy(checkpointed)
    data = bytes(4 * 100)
    graph.constants.add(name="c_outer", shape=[100], dtype="float32", data=data)
    graph.subgraphs[0].graph.constants.add(name="c_inner", shape=[100], dtype="float32", data=data)
    validate_graph(graph, GraphLimits(max_constant_bytes=800))
    with pytest.raises(GraphTooLarge, match="inline constants exceed 799"):
        validate_graph(graph, GraphLimits(max_constant_bytes=799))
