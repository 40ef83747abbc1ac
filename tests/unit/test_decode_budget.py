"""Graphs that exhaust a worker while it decodes them (issue: decoding is compiling).

A body of a higher-order op runs at every call in the worker's fake propagation
(torchfarm/fx/decode.py), so the graph's budget counts it at every call; and an op whose
number of outputs comes from an argument (unbind, split, chunk, tensor_split, ...) is
bounded like any other sequence. Both sides refuse them: `validate_graph` (the
coordinator, torch-free) and `decode_graph` (the worker)."""

from __future__ import annotations

import pytest

from torchfarm.graph.graph_errors import GraphTooLarge
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2

Node, Arg = graph_pb2.Node, graph_pb2.Argument
WRAP = "torch.ops.higher_order.wrap"


def meta(shape: list[int]) -> graph_pb2.TensorMeta:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return graph_pb2.TensorMeta(
        shape=[graph_pb2.SymExpr(expr=str(s), hint=s) for s in shape],
        stride=[graph_pb2.SymExpr(expr=str(s), hint=s) for s in strides],
        dtype="float32", device=graph_pb2.Device(type="cpu", index=-1),
        kind=graph_pb2.TensorMeta.INPUT,
    )


def nested_bodies(levels: int, calls: int) -> graph_pb2.Graph:
    """`levels` bodies, each inside the one above, each calling the one below `calls`
    times through `higher_order.wrap`; the innermost is a relu."""
    g = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V2)
    g.nodes.add(name="a", op=Node.PLACEHOLDER, target="L_a_", tensor=meta([2, 3]))
    if levels == 0:
        g.nodes.add(name="r", op=Node.CALL_FUNCTION, target="torch.relu", args=[Arg(node="a")])
        last = "r"
    else:
        g.subgraphs.add(name="body", graph=nested_bodies(levels - 1, calls))
        g.nodes.add(name="b", op=Node.GET_ATTR, target="body")
        last = "a"
        for i in range(calls):
            g.nodes.add(name=f"w{i}", op=Node.CALL_FUNCTION, target=WRAP, args=[Arg(node="b"), Arg(node=last)])
            g.nodes.add(name=f"o{i}", op=Node.CALL_FUNCTION, target="_operator.getitem",
                        args=[Arg(node=f"w{i}"), Arg(int_value=0)])
            last = f"o{i}"
    out = g.nodes.add(name="output", op=Node.OUTPUT, target="output")
    out.args.add().tuple.items.append(Arg(node=last))
    return g


def test_eight_bodies_each_called_eight_times_are_refused_at_validation():
    g = nested_bodies(8, 8)
    assert len(g.SerializeToString()) < 8 * 1024
    with pytest.raises(GraphTooLarge, match="each body counted at every call"):
        validate_graph(g)


def test_the_worker_refuses_them_before_propagating():
    from torchfarm.fx.decode import decode_graph

    with pytest.raises(GraphTooLarge, match="each body counted at every call"):
        decode_graph(nested_bodies(8, 8))


def test_bodies_called_within_the_budget_decode():
    from torchfarm.fx.decode import decode_graph

    validate_graph(nested_bodies(3, 4))
    decoded = decode_graph(nested_bodies(3, 4))
    assert decoded.gm is not None


def one_op(shape: list[int], op: int, target: str, *args: graph_pb2.Argument,
           before: list[graph_pb2.Node] = ()) -> graph_pb2.Graph:  # type: ignore[assignment]
    """x of `shape`, the nodes `before`, then `target` applied to the last node and `args`."""
    g = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1)
    g.nodes.add(name="x", op=Node.PLACEHOLDER, target="L_x_", tensor=meta(shape))
    g.nodes.extend(before)
    last = g.nodes[-1].name
    g.nodes.add(name="many", op=op, target=target, args=[Arg(node=last), *args])
    g.nodes.add(name="first", op=Node.CALL_FUNCTION, target="_operator.getitem",
                args=[Arg(node="many"), Arg(int_value=0)])
    out = g.nodes.add(name="output", op=Node.OUTPUT, target="output")
    out.args.add().tuple.items.append(Arg(node="first"))
    return g


FN, METHOD = Node.CALL_FUNCTION, Node.CALL_METHOD
HUGE = [1 << 28]


@pytest.mark.parametrize("op,target,args", [
    (FN, "torch.ops.aten.unbind.int", ()),
    (FN, "torch.unbind", ()),
    (METHOD, "unbind", ()),
    (FN, "torch.functional.split", (Arg(int_value=1),)),
    (METHOD, "split", (Arg(int_value=2),)),
    (FN, "torch.ops.aten.unsafe_split.Tensor", (Arg(int_value=1),)),
])
def test_an_op_with_one_output_per_row_of_a_huge_input_is_refused(op, target, args):
    g = one_op(HUGE, op, target, *args)
    assert len(g.SerializeToString()) < 512
    with pytest.raises(GraphTooLarge, match="sequence|outputs"):
        validate_graph(g)


@pytest.mark.parametrize("op,target", [
    (FN, "torch.tensor_split"), (METHOD, "tensor_split"), (FN, "torch.ops.aten.tensor_split.sections"),
    (FN, "torch.hsplit"),
])
def test_a_literal_count_of_sections_is_bounded(op, target):
    with pytest.raises(GraphTooLarge, match="sequence|outputs"):
        validate_graph(one_op([4, 6], op, target, Arg(int_value=10**15)))


def test_a_count_set_by_a_keyword_is_bounded():
    g = one_op([4, 6], FN, "torch.tensor_split")
    g.nodes[1].kwargs.add(name="sections", value=Arg(int_value=10**15))
    with pytest.raises(GraphTooLarge, match="sequence|outputs"):
        validate_graph(g)


def test_the_worker_bounds_what_validation_cannot_see():
    """`x.reshape(-1).unbind()`: the shape is the worker's to know."""
    flat = Node(name="flat", op=METHOD, target="reshape", args=[Arg(node="x"), Arg(int_value=-1)])
    g = one_op([1024, 1024], METHOD, "unbind", before=[flat])
    validate_graph(g)
    from torchfarm.fx.decode import decode_graph

    with pytest.raises(GraphTooLarge, match="outputs"):
        decode_graph(g)


@pytest.mark.parametrize("op,target,args", [
    (FN, "torch.ops.aten.unbind.int", ()),
    (METHOD, "split", (Arg(int_value=64),)),
    (FN, "torch.chunk", (Arg(int_value=10**15),)),
    (METHOD, "tensor_split", (Arg(int_value=8),)),
])
def test_bounded_counts_decode(op, target, args):
    from torchfarm.fx.decode import decode_graph

    g = one_op([1 << 12, 2], op, target, *args)
    validate_graph(g)
    decode_graph(g)
