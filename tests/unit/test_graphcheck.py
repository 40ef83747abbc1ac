"""The coordinator's torch-free graph validator, on hand-built messages."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from torchfarm.graph.graph_errors import DisallowedOp, GraphError, GraphTooLarge, MalformedGraph
from torchfarm.graph.graphcheck import GraphLimits, parse_sym_expr, validate_graph
from torchfarm.v1 import graph_pb2

Node = graph_pb2.Node
LIMITS = GraphLimits()


def ref(name: str) -> graph_pb2.Argument:
    return graph_pb2.Argument(node=name)


def tensor_meta(shape: list[str], dtype: str = "float32") -> graph_pb2.TensorMeta:
    sizes = [graph_pb2.SymExpr(expr=s, hint=int(s) if s.isdigit() else 4) for s in shape]
    strides = [graph_pb2.SymExpr(expr="1", hint=1) for _ in shape]
    return graph_pb2.TensorMeta(
        shape=sizes,
        stride=strides,
        dtype=dtype,
        device=graph_pb2.Device(type="cpu", index=-1),
        kind=graph_pb2.TensorMeta.INPUT,
    )


def make_graph() -> graph_pb2.Graph:
    """x -> relu(x) -> add(relu, 1.0) -> output((add,))"""
    g = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1)
    g.nodes.add(name="x", op=Node.PLACEHOLDER, target="L_x_", tensor=tensor_meta(["2", "3"]))
    g.nodes.add(name="relu", op=Node.CALL_FUNCTION, target="torch.relu", args=[ref("x")])
    g.nodes.add(
        name="add",
        op=Node.CALL_FUNCTION,
        target="_operator.add",
        args=[ref("relu"), graph_pb2.Argument(float_value=1.0)],
    )
    out = g.nodes.add(name="output", op=Node.OUTPUT, target="output")
    out.args.add().tuple.items.append(ref("add"))
    return g


def test_valid_graph_passes() -> None:
    validate_graph(make_graph(), LIMITS)


def test_error_tree() -> None:
    for cls in (DisallowedOp, MalformedGraph, GraphTooLarge):
        assert issubclass(cls, GraphError)
    assert issubclass(GraphError, ValueError)


def _insert_before_output(g: graph_pb2.Graph, node: graph_pb2.Node) -> None:
    out = graph_pb2.Node()
    out.CopyFrom(g.nodes[-1])
    del g.nodes[-1]
    g.nodes.append(node)
    g.nodes.append(out)


def _dangling(g: graph_pb2.Graph) -> None:
    g.nodes[1].args[0].node = "nope"


def _forward_ref(g: graph_pb2.Graph) -> None:
    g.nodes[1].args[0].node = "add"


def _duplicate(g: graph_pb2.Graph) -> None:
    g.nodes[2].name = "relu"


def _missing_output(g: graph_pb2.Graph) -> None:
    del g.nodes[-1]


def _output_not_last(g: graph_pb2.Graph) -> None:
    g.nodes.add(name="late", op=Node.CALL_FUNCTION, target="torch.relu", args=[ref("x")])


def _two_outputs(g: graph_pb2.Graph) -> None:
    second = g.nodes.add()
    second.CopyFrom(g.nodes[-2])
    second.name = "output2"


def _bad_dtype(g: graph_pb2.Graph) -> None:
    g.nodes[0].tensor.dtype = "float33"


def _bad_dtype_arg(g: graph_pb2.Graph) -> None:
    g.nodes[2].kwargs.add(name="dtype", value=graph_pb2.Argument(dtype="object"))


def _bad_device(g: graph_pb2.Graph) -> None:
    g.nodes[0].tensor.device.type = "tpu"


def _bad_layout(g: graph_pb2.Graph) -> None:
    g.nodes[2].kwargs.add(name="layout", value=graph_pb2.Argument(layout="diagonal"))


def _bad_memory_format(g: graph_pb2.Graph) -> None:
    g.nodes[2].kwargs.add(name="memory_format", value=graph_pb2.Argument(memory_format="zigzag"))


def _unknown_format(g: graph_pb2.Graph) -> None:
    g.format = graph_pb2.GRAPH_FORMAT_UNSPECIFIED


def _both_metas(g: graph_pb2.Graph) -> None:
    g.nodes[0].symint.expr = "3"


def _no_meta(g: graph_pb2.Graph) -> None:
    g.nodes[0].ClearField("tensor")


def _meta_on_call(g: graph_pb2.Graph) -> None:
    g.nodes[1].tensor.CopyFrom(tensor_meta(["2"]))


def _bad_name(g: graph_pb2.Graph) -> None:
    g.nodes[1].name = "relu; import os"


def _keyword_name(g: graph_pb2.Graph) -> None:
    g.nodes[1].name = "lambda"


def _star_placeholder(g: graph_pb2.Graph) -> None:
    g.nodes[0].target = "*args"


def _negative_size(g: graph_pb2.Graph) -> None:
    g.nodes[0].tensor.shape[0].expr = "-2"


def _rank_mismatch(g: graph_pb2.Graph) -> None:
    del g.nodes[0].tensor.stride[0]


def _unsorted_kwargs(g: graph_pb2.Graph) -> None:
    g.nodes[2].kwargs.add(name="b", value=graph_pb2.Argument(int_value=1))
    g.nodes[2].kwargs.add(name="a", value=graph_pb2.Argument(int_value=1))


def _empty_argument(g: graph_pb2.Graph) -> None:
    g.nodes[2].args.add()


def _get_attr_undeclared(g: graph_pb2.Graph) -> None:
    _insert_before_output(g, Node(name="c", op=Node.GET_ATTR, target="missing"))


def _method_without_self(g: graph_pb2.Graph) -> None:
    _insert_before_output(g, Node(name="v", op=Node.CALL_METHOD, target="view"))


def _pure_python_without_node(g: graph_pb2.Graph) -> None:
    args = [graph_pb2.Argument(int_value=10), graph_pb2.Argument(int_value=10**9)]
    _insert_before_output(
        g, Node(name="p", op=Node.CALL_FUNCTION, target="_operator.pow", args=args)
    )


def _placeholder_after_compute(g: graph_pb2.Graph) -> None:
    _insert_before_output(
        g, Node(name="y", op=Node.PLACEHOLDER, target="y", tensor=tensor_meta(["2"]))
    )


def _kind_unspecified(g: graph_pb2.Graph) -> None:
    g.nodes[0].tensor.kind = graph_pb2.TensorMeta.KIND_UNSPECIFIED


def _constant_length(g: graph_pb2.Graph) -> None:
    g.constants.add(name="c", shape=[2, 2], dtype="float32", data=b"\0" * 15)


def _undeclared_symbol(g: graph_pb2.Graph) -> None:
    g.nodes[0].tensor.shape[0].expr = "s0"


def _code_in_expr(g: graph_pb2.Graph) -> None:
    g.symbols.add(name="s0", hint=4, min=2)
    g.nodes[0].tensor.shape[0].expr = "__import__('os').system('true')"


def _symbol_out_of_range(g: graph_pb2.Graph) -> None:
    g.symbols.add(name="s0", hint=1, min=2)


def _reserved_symbol(g: graph_pb2.Graph) -> None:
    g.symbols.add(name="Max", hint=4, min=2)


def _dict_key(g: graph_pb2.Graph) -> None:
    d = g.nodes[2].kwargs.add(name="d").value.immutable_dict
    d.items.extend([ref("x"), graph_pb2.Argument(int_value=1)])


MALFORMED: dict[str, Callable[[graph_pb2.Graph], None]] = {
    "dangling reference": _dangling,
    "forward reference": _forward_ref,
    "duplicate name": _duplicate,
    "missing output": _missing_output,
    "output not last": _output_not_last,
    "two outputs": _two_outputs,
    "bad dtype": _bad_dtype,
    "bad dtype argument": _bad_dtype_arg,
    "bad device": _bad_device,
    "bad layout": _bad_layout,
    "bad memory format": _bad_memory_format,
    "unknown format": _unknown_format,
    "tensor and symint": _both_metas,
    "no placeholder meta": _no_meta,
    "meta on a call": _meta_on_call,
    "name not an identifier": _bad_name,
    "keyword as name": _keyword_name,
    "varargs placeholder": _star_placeholder,
    "negative size": _negative_size,
    "shape and stride differ": _rank_mismatch,
    "unsorted kwargs": _unsorted_kwargs,
    "empty argument": _empty_argument,
    "get_attr of undeclared constant": _get_attr_undeclared,
    "method without receiver": _method_without_self,
    "python op on constants only": _pure_python_without_node,
    "placeholder after compute": _placeholder_after_compute,
    "kind unspecified": _kind_unspecified,
    "constant length mismatch": _constant_length,
    "undeclared symbol": _undeclared_symbol,
    "code in a size expression": _code_in_expr,
    "symbol hint out of range": _symbol_out_of_range,
    "reserved symbol name": _reserved_symbol,
    "node as dict key": _dict_key,
}


@pytest.mark.parametrize("mutate", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed(mutate: Callable[[graph_pb2.Graph], None]) -> None:
    g = make_graph()
    mutate(g)
    with pytest.raises(MalformedGraph):
        validate_graph(g, LIMITS)


def _deep(depth: int) -> graph_pb2.Argument:
    arg = graph_pb2.Argument(int_value=1)
    for _ in range(depth):
        wrapper = graph_pb2.Argument()
        wrapper.list.items.append(arg)
        arg = wrapper
    return arg


def test_too_deep_nesting() -> None:
    g = make_graph()
    g.nodes[2].kwargs.add(name="deep", value=_deep(LIMITS.max_nesting_depth + 1))
    with pytest.raises(GraphTooLarge, match="nested deeper"):
        validate_graph(g, LIMITS)
    g = make_graph()
    g.nodes[2].kwargs.add(name="deep", value=_deep(LIMITS.max_nesting_depth - 1))
    validate_graph(g, LIMITS)


def test_huge_rank() -> None:
    g = make_graph()
    g.nodes[0].tensor.CopyFrom(tensor_meta(["1"] * (LIMITS.max_rank + 1)))
    with pytest.raises(GraphTooLarge, match="rank"):
        validate_graph(g, LIMITS)


def test_oversized_constant() -> None:
    g = make_graph()
    n = LIMITS.max_constant_bytes // 4 + 1
    g.constants.add(name="big", shape=[n], dtype="float32", data=b"\0" * (4 * n))
    with pytest.raises(GraphTooLarge, match="constants"):
        validate_graph(g, LIMITS)


def test_constants_within_budget() -> None:
    g = make_graph()
    g.constants.add(name="c", shape=[2, 2], dtype="int64", data=b"\1" * 32)
    g.constants.add(name="e", shape=[0, 5], dtype="float32", data=b"")
    _insert_before_output(g, Node(name="c_1", op=Node.GET_ATTR, target="c"))
    validate_graph(g, LIMITS)


def test_too_many_nodes() -> None:
    with pytest.raises(GraphTooLarge, match="nodes"):
        validate_graph(make_graph(), GraphLimits(max_nodes=3))


def test_too_many_arguments() -> None:
    g = make_graph()
    g.nodes[2].kwargs.add(name="many").value.list.items.extend(
        [graph_pb2.Argument(int_value=0)] * 50
    )
    with pytest.raises(GraphTooLarge, match="argument values"):
        validate_graph(g, GraphLimits(max_arguments=40))


def test_disallowed_function_names_the_op() -> None:
    g = make_graph()
    g.nodes[1].target = "torch.save"
    with pytest.raises(
        DisallowedOp, match="op 'torch.save' is not on the farm's allow-list"
    ) as info:
        validate_graph(g, LIMITS)
    assert info.value.target == "torch.save"


def test_disallowed_method_names_the_method() -> None:
    g = make_graph()
    _insert_before_output(
        g, Node(name="h", op=Node.CALL_METHOD, target="register_hook", args=[ref("x")])
    )
    with pytest.raises(DisallowedOp, match="'register_hook'") as info:
        validate_graph(g, LIMITS)
    assert info.value.target == "register_hook"


def test_symbolic_placeholders() -> None:
    g = make_graph()
    g.symbols.add(name="s0", hint=4, min=2)
    g.nodes[0].tensor.shape[0].CopyFrom(graph_pb2.SymExpr(expr="s0", hint=4))
    g.nodes[0].tensor.stride[0].CopyFrom(graph_pb2.SymExpr(expr="3", hint=3))
    size = Node(
        name="s0_1", op=Node.PLACEHOLDER, target="s0", symint=graph_pb2.SymExpr(expr="s0", hint=4)
    )
    g.nodes.insert(0, size)
    validate_graph(g, LIMITS)


SYMBOLS = {"s0", "s1", "s77"}


@pytest.mark.parametrize(
    "text",
    [
        "s0",
        "7",
        "2*s0 + 1",
        "3 - s0",
        "-s0 + 3",
        "s0*s1",
        "(s0//2)",
        "Max(2, s0)",
        "Min(s0, s1, 4)",
        "Mod(s0, 3)",
        "PythonMod(s77, 2)",
        "FloorDiv(s0, 4)",
        "s0**2",
        "2*(s0 + 1) - (s1//3)*s0",
    ],
)
def test_sym_expr_parses(text: str) -> None:
    parse_sym_expr(text, SYMBOLS, LIMITS)


def test_sym_expr_tree() -> None:
    assert parse_sym_expr("2*s0 + 1", SYMBOLS, LIMITS) == (
        "chain",
        ("chain", ("int", 2), (("*", ("sym", "s0")),)),
        (("+", ("int", 1)),),
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "s0 +",
        "s2",
        "eval(s0)",
        "s0.real",
        "1e5",
        "s0/2",
        "s0 ** 100",
        "Max(s0)",
        "Mod(s0)",
        "s0 s1",
        "(s0",
        "s0)",
        "'s0'",
        "s0; 1",
        "99999999999999999999",
    ],
)
def test_sym_expr_rejects(text: str) -> None:
    with pytest.raises(MalformedGraph):
        parse_sym_expr(text, SYMBOLS, LIMITS)


def test_sym_expr_bounds() -> None:
    with pytest.raises(GraphTooLarge):
        parse_sym_expr("s0+" * 2000 + "1", SYMBOLS, LIMITS)
    with pytest.raises(MalformedGraph, match="deeply"):
        parse_sym_expr("(" * 40 + "s0" + ")" * 40, SYMBOLS, LIMITS)
    with pytest.raises(MalformedGraph, match="deeply"):
        parse_sym_expr("-" * 40 + "s0", SYMBOLS, LIMITS)
    # A long flat sum stays flat: no recursion per term.
    parse_sym_expr("+".join(["s0"] * 1000), SYMBOLS, LIMITS)


def test_coordinator_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import torchfarm.graph.graphcheck, torchfarm.graph.allowlist, torchfarm.graph.graph_errors\n"
        "torchfarm.graph.allowlist.load_allowlist()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _getattr_graph(*args: graph_pb2.Argument, **kwargs: graph_pb2.Argument) -> graph_pb2.Graph:
    g = make_graph()
    node = graph_pb2.Node(name="attr", op=Node.CALL_FUNCTION, target="builtins.getattr", args=args)
    for key in sorted(kwargs):
        node.kwargs.add(name=key, value=kwargs[key])
    _insert_before_output(g, node)
    return g


def test_getattr_of_an_allowed_tensor_attribute_passes() -> None:
    validate_graph(_getattr_graph(ref("relu"), graph_pb2.Argument(str_value="T")), LIMITS)


@pytest.mark.parametrize("name", ["__class__", "__dict__", "grad_fn", "data", "view", "_base"])
def test_getattr_refuses_other_attributes(name: str) -> None:
    with pytest.raises(DisallowedOp, match=name):
        validate_graph(_getattr_graph(ref("relu"), graph_pb2.Argument(str_value=name)), LIMITS)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((ref("relu"), ref("add")), {}),  # a computed name
        ((graph_pb2.Argument(str_value="x"), graph_pb2.Argument(str_value="T")), {}),
        ((ref("relu"),), {}),
        ((ref("relu"), graph_pb2.Argument(str_value="T"), graph_pb2.Argument(none={})), {}),
        ((ref("relu"), graph_pb2.Argument(str_value="T")), {"default": graph_pb2.Argument(none={})}),
    ],
)
def test_getattr_needs_a_node_and_a_constant_name(args, kwargs) -> None:
    with pytest.raises(MalformedGraph, match="builtins.getattr"):
        validate_graph(_getattr_graph(*args, **kwargs), LIMITS)
