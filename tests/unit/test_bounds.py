"""Small requests that would exhaust a worker: each is a graph a few hundred bytes long that
passes for a Dynamo graph. `validate_graph` (the coordinator, and the worker before it
decodes) and the worker's propagation must both refuse them (torchfarm/graph/graphbounds.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from torchfarm.graph import graphbounds
from torchfarm.graph.graph_errors import GraphError, GraphTooLarge
from torchfarm.graph.graphcheck import GraphLimits, parse_sym_expr, validate_graph
from torchfarm.v1 import graph_pb2

Node, Arg = graph_pb2.Node, graph_pb2.Argument


def meta(shape: list[tuple[str, int]]) -> graph_pb2.TensorMeta:
    return graph_pb2.TensorMeta(
        shape=[graph_pb2.SymExpr(expr=e, hint=h) for e, h in shape],
        stride=[graph_pb2.SymExpr(expr="1", hint=1) for _ in shape],
        dtype="float32", device=graph_pb2.Device(type="cpu", index=-1),
        kind=graph_pb2.TensorMeta.INPUT,
    )


def graph(*nodes: graph_pb2.Node, symbols: tuple[graph_pb2.Symbol, ...] = (),
          shape: list[tuple[str, int]] | None = None) -> graph_pb2.Graph:
    """x (a [2, 3] tensor unless `shape`), then `nodes`, then output((last,))."""
    g = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1, symbols=list(symbols))
    g.nodes.add(name="x", op=Node.PLACEHOLDER, target="L_x_", tensor=meta(shape or [("2", 2), ("3", 3)]))
    g.nodes.extend(nodes)
    out = g.nodes.add(name="output", op=Node.OUTPUT, target="output")
    out.args.add().tuple.items.append(Arg(node=g.nodes[-2].name))
    return g


def size_node(name: str = "size") -> graph_pb2.Node:
    return Node(name=name, op=Node.CALL_METHOD, target="size", args=[Arg(node="x")])


def doubling(count: int) -> graph_pb2.Graph:
    """t0 = x.size(); t(i+1) = t(i) + t(i): 2 * 2**count items."""
    nodes = [size_node("t0")]
    for i in range(count):
        nodes.append(Node(name=f"t{i + 1}", op=Node.CALL_FUNCTION, target="_operator.add",
                          args=[Arg(node=f"t{i}"), Arg(node=f"t{i}")]))
    return graph(*nodes)


def test_nested_exponents_in_size_expressions_are_refused():
    s0 = graph_pb2.Symbol(name="s0", hint=2, min=2)
    text = "s0"
    for _ in range(6):
        text = f"({text})**64"
    g = graph(symbols=(s0,), shape=[(text, 2)])
    with pytest.raises(GraphError, match="size expression"):
        validate_graph(g)
    with pytest.raises(GraphError, match="size expression"):
        parse_sym_expr("(9223372036854775807**64)**64", {"s0"}, GraphLimits())


def test_size_expressions_are_bounded_in_nodes():
    text = "+".join(["a"] * 1500)  # under the character limit
    with pytest.raises(GraphTooLarge, match="nodes"):
        parse_sym_expr(text, {"a"}, GraphLimits())
    parse_sym_expr("2*s0*s1 + s0**2 + (s1//2)", {"s0", "s1"}, GraphLimits())


@pytest.mark.parametrize("method", ["__pow__", "__ipow__", "__lshift__", "__ilshift__"])
def test_dunder_exponent_methods_are_bounded_like_operators(method):
    g = graph(
        Node(name="n", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=0)]),
        Node(name="p", op=Node.CALL_METHOD, target=method, args=[Arg(node="n"), Arg(int_value=10**9)]),
    )
    with pytest.raises(GraphError, match="exponent|shift"):
        validate_graph(g)


@pytest.mark.parametrize("method", ["__mul__", "__rmul__", "__imul__"])
def test_dunder_repetition_methods_are_bounded_like_operators(method):
    g = graph(size_node(), Node(name="r", op=Node.CALL_METHOD, target=method,
                                args=[Arg(node="size"), Arg(int_value=10**12)]))
    with pytest.raises(GraphError, match="sequence"):
        validate_graph(g)


def test_tuple_doubling_is_refused_before_it_grows():
    validate_graph(doubling(3))  # 16 items: a graph may well do that
    with pytest.raises(GraphTooLarge, match="sequence of up to"):
        validate_graph(doubling(34))


def test_a_huge_placeholder_is_refused():
    g = graph(Node(name="r", op=Node.CALL_FUNCTION, target="torch.relu", args=[Arg(node="x")]),
              shape=[(str(1 << 40), 1 << 40), (str(1 << 20), 1 << 20)])
    with pytest.raises(GraphTooLarge, match="elements"):
        validate_graph(g)


def test_a_symbolic_placeholder_is_bounded_at_its_hints():
    s0 = graph_pb2.Symbol(name="s0", hint=1 << 36, min=2)
    g = graph(Node(name="r", op=Node.CALL_FUNCTION, target="torch.relu", args=[Arg(node="x")]),
              symbols=(s0,), shape=[("s0", 1 << 36), ("2*s0", 1 << 37)])
    with pytest.raises(GraphTooLarge, match="elements"):
        validate_graph(g)


def test_the_whole_graph_is_bounded_in_elements():
    limits = GraphLimits(max_placeholder_elements=100, max_graph_elements=150)
    g = graph(shape=[("10", 10), ("10", 10)])  # 100: fits alone
    g.nodes.insert(1, Node(name="y", op=Node.PLACEHOLDER, target="L_y_", tensor=meta([("10", 10), ("10", 10)])))
    with pytest.raises(GraphTooLarge, match="placeholders and constants .* 150"):
        validate_graph(g, limits)
    validate_graph(g, GraphLimits(max_placeholder_elements=100, max_graph_elements=200))


def test_constant_dimensions_are_bounded():
    g = graph(Node(name="c", op=Node.GET_ATTR, target="k"))
    g.constants.add(name="k", dtype="float32", shape=[0, 1 << 62, 1 << 62], data=b"")
    with pytest.raises(GraphError, match="size"):
        validate_graph(g)


def test_limits_are_named_and_documented():
    assert graphbounds.MAX_EXPR_BITS and graphbounds.MAX_EXPR_NODES
    limits = GraphLimits()
    for name in ("max_placeholder_elements", "max_graph_elements", "max_sequence_length"):
        assert getattr(limits, name) > 0


# The worker re-checks on the actual values while it propagates (torchfarm/fx/decode.py).


def test_the_worker_bounds_dunder_exponents_before_computing():
    from torchfarm.fx.decode import decode_graph

    g = graph(
        Node(name="a", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=0)]),
        Node(name="b", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=1)]),
        Node(name="p", op=Node.CALL_METHOD, target="__pow__", args=[Arg(node="a"), Arg(node="b")]),
        shape=[("2", 2), ("100", 100)],
    )
    validate_graph(g)  # an exponent from a node: only the worker knows it
    with pytest.raises(GraphError, match="integer pow by 100"):  # refused before 2**100 is made
        decode_graph(g)
    g.nodes[3].target, g.nodes[3].args[0].node, g.nodes[3].args[1].node = "__rpow__", "b", "a"
    with pytest.raises(GraphError, match="integer pow by 100"):
        decode_graph(g)


def test_the_worker_bounds_sequence_growth_it_could_not_see_statically():
    from torchfarm.fx.decode import decode_graph

    limits = GraphLimits(max_rank=2, max_sequence_length=3)
    g = graph(
        size_node(),
        Node(name="n", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=0)]),
        Node(name="r", op=Node.CALL_METHOD, target="__mul__", args=[Arg(node="size"), Arg(node="n")]),
    )
    validate_graph(g, limits)
    with pytest.raises(GraphError, match="repeated"):
        decode_graph(g, limits)


# Bounds refuse only what is hostile (issue 43): the base of `**` is not an exponent.


def _pow(base: graph_pb2.Argument, exponent: graph_pb2.Argument, target: str = "_operator.pow") -> graph_pb2.Graph:
    return graph(
        Node(name="n", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=0)]),
        Node(name="p", op=Node.CALL_FUNCTION, target=target, args=[base, exponent]),
    )


def test_a_large_literal_base_with_a_node_exponent_is_no_bomb():
    # Funnel: `1 / (10000 ** (freq_seq / d))`, refused as "exponent 10000; the limit is 64".
    validate_graph(_pow(Arg(int_value=10000), Arg(node="n")))
    validate_graph(_pow(Arg(int_value=1 << 40), Arg(node="n"), "_operator.lshift"))


@pytest.mark.parametrize("target", ["_operator.pow", "_operator.ipow", "_operator.lshift"])
def test_a_large_literal_exponent_on_a_node_is_refused(target):
    with pytest.raises(GraphError, match="exponent|shift"):
        validate_graph(_pow(Arg(node="n"), Arg(int_value=10000), target))


def test_a_reflected_power_bounds_its_exponent_not_its_base():
    rpow = Node(name="p", op=Node.CALL_METHOD, target="__rpow__", args=[Arg(node="n"), Arg(int_value=10000)])
    g = graph(Node(name="n", op=Node.CALL_METHOD, target="size", args=[Arg(node="x"), Arg(int_value=0)]), rpow)
    validate_graph(g)  # 10000 ** n: the exponent is the node, the worker checks it


# Python's own operators on values the graph builds: `%` formats a string, and
# math.prod/lcm multiply a whole sequence, each for real on the worker.


def _dim() -> graph_pb2.Node:
    return Node(name="n", op=Node.CALL_METHOD, target="dim", args=[Arg(node="x")])


@pytest.mark.parametrize("target", ["_operator.mod", "_operator.imod"])
def test_a_literal_format_string_is_refused_by_the_coordinator(target):
    # "%0400000000d" % x.dim(): 20 bytes on the wire, 400 MB on the worker.
    g = graph(_dim(), Node(name="s", op=Node.CALL_FUNCTION, target=target,
                           args=[Arg(str_value="%0400000000d"), Arg(node="n")]))
    with pytest.raises(GraphError, match="string formatting"):
        validate_graph(g)


@pytest.mark.parametrize(("target", "reflected"), [("_operator.mod", False), ("__mod__", False), ("__rmod__", True)])
def test_the_worker_refuses_string_formatting_before_it_runs(target, reflected, monkeypatch):
    from torchfarm.fx.decode import decode_graph
    from torchfarm.graph import textcheck

    # The format string comes out of a node, so only the worker sees that it is a string.
    held = Node(name="held", op=Node.CALL_FUNCTION, target="_operator.mul", args=[
        Arg(tuple=graph_pb2.ArgumentList(items=[Arg(str_value="%010000000d")])), Arg(node="n")])
    pick = Node(name="f", op=Node.CALL_FUNCTION, target="_operator.getitem", args=[Arg(node="held"), Arg(int_value=0)])
    operands = [Arg(node="n"), Arg(node="f")] if reflected else [Arg(node="f"), Arg(node="n")]
    op = Node.CALL_METHOD if target.startswith("__") else Node.CALL_FUNCTION
    g = graph(_dim(), held, pick, Node(name="s", op=op, target=target, args=operands))
    with pytest.raises(GraphError, match="text argument"):  # a format string is no plain text
        validate_graph(g)
    # Behind the text check, the decoder's own: as a graph checked without it would meet.
    monkeypatch.setattr(textcheck, "check_node_texts", lambda *args, **kwargs: None)
    validate_graph(g)
    with pytest.raises(GraphError, match="string formatting"):
        decode_graph(g)


@pytest.mark.parametrize("target", ["math.prod", "math.lcm"])
def test_the_worker_bounds_integer_products_before_computing(target):
    from torchfarm.fx.decode import decode_graph

    # (n << 61,) * 2000, then their product: a 124,000-bit integer, built one
    # multiplication at a time (a 65,536-long one takes 19 s) before any result check.
    nodes = [
        _dim(),
        Node(name="big", op=Node.CALL_FUNCTION, target="_operator.lshift", args=[Arg(node="n"), Arg(int_value=61)]),
        Node(name="k", op=Node.CALL_FUNCTION, target="_operator.mul", args=[Arg(node="n"), Arg(int_value=1000)]),
        Node(name="one", op=Node.CALL_FUNCTION, target="_operator.mul", args=[
            Arg(tuple=graph_pb2.ArgumentList(items=[Arg(node="big")])), Arg(node="k")]),
    ]
    if target == "math.prod":
        nodes.append(Node(name="p", op=Node.CALL_FUNCTION, target=target, args=[Arg(node="one")]))
    else:  # lcm takes its integers as arguments: coprime ones grow as a product does
        nodes += [Node(name=f"c{i}", op=Node.CALL_FUNCTION, target="_operator.add", args=[Arg(node="big"), Arg(int_value=i)])
                  for i in range(1, 6)]
        nodes.append(Node(name="p", op=Node.CALL_FUNCTION, target=target, args=[Arg(node=f"c{i}") for i in range(1, 6)]))
    g = graph(*nodes)
    validate_graph(g)
    with pytest.raises(GraphError, match=f"{target} of .* integers needs more than 64 bits"):
        decode_graph(g)


def test_small_integer_products_still_decode():
    from torchfarm.fx.decode import decode_graph

    g = graph(size_node(), Node(name="p", op=Node.CALL_FUNCTION, target="math.prod", args=[Arg(node="size")]))
    decode_graph(g)


# Parsing size expressions is pure Python: each one is bounded, and so is the graph's sum.


def _strided(count: int, stride: Callable[[int], str]) -> graph_pb2.Graph:
    """`count` rank-16 placeholders of size 1, their strides `stride(0)`, `stride(1)`, ..."""
    g = graph(symbols=(graph_pb2.Symbol(name="s0", hint=2, min=2),))
    for p in range(count):
        tensor = meta([("1", 1)] * 16)
        for d in range(16):
            tensor.stride[d].expr = stride(p * 16 + d)
        g.nodes.insert(1 + p, Node(name=f"p{p}", op=Node.PLACEHOLDER, target=f"L_p{p}_", tensor=tensor))
    return g


def _deep(i: int) -> str:
    return "(" * 30 + f"s0 + {i}" + ")" * 30


def test_the_distinct_size_expressions_of_a_graph_are_bounded_together():
    """Each expression within its own bounds, 4,000 distinct ones over 256 KiB: seconds of
    parsing, refused before it is spent."""
    g = _strided(250, _deep)
    with pytest.raises(GraphTooLarge, match="max_expr_text"):
        validate_graph(g)


def _parses(monkeypatch, module) -> list[str]:
    """The texts `module` hands to parse_sym_expr from now on, one entry per parse."""
    parsed: list[str] = []
    original = module.parse_sym_expr

    def counting(text, symbols, limits):
        parsed.append(text)
        return original(text, symbols, limits)

    monkeypatch.setattr(module, "parse_sym_expr", counting)
    return parsed


def test_a_repeated_size_expression_is_parsed_once(monkeypatch):
    """Real graphs repeat the same few expressions: the same 4,000 strides all alike cost
    one parse, and fit the bound however often they recur."""
    from torchfarm.graph import graphcheck

    parsed = _parses(monkeypatch, graphcheck)
    validate_graph(_strided(250, lambda i: _deep(7)))
    assert sorted(set(parsed)) == sorted(parsed)
    assert _deep(7) in parsed


def test_the_worker_parses_a_repeated_size_expression_once(monkeypatch):
    """The worker decodes what the coordinator admitted: 64 strides alike cost one parse
    (and one sympy expression), not one each."""
    from torchfarm.fx import decode

    parsed = _parses(monkeypatch, decode)
    g = _strided(4, lambda i: "(((s0 + 7)))")
    g.nodes.pop(0)  # the [2, 3] placeholder: only the strided ones, and relu of the first
    g.nodes[-1].args[0].tuple.items[0].node = "p0"
    decoded = decode.decode_graph(g)
    assert decoded is not None
    assert sorted(set(parsed)) == sorted(parsed)
    assert "(((s0 + 7)))" in parsed
