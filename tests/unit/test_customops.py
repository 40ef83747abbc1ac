"""Custom-op schemas in a graph (torchfarm/graph/customops.py): what passes, what is refused
and why, hostile schemas included; and the worker's stand-in (torchfarm/fx/torch_library.py)
answering from the client's recorded metadata without the client's Python."""

from __future__ import annotations

import pytest
import torch

from torchfarm.graph.customops import MAX_SCHEMA_CHARS, RefusedCustomOp, declared_ops, parse_schema
from torchfarm.graph.graph_errors import DisallowedOp, GraphError, GraphTooLarge, MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("text", [
    "mylib::foo(Tensor x) -> Tensor",
    "mylib::foo.out2(Tensor x, Tensor? w=None, int[] dims=[0, 1], *, float alpha=0.5) -> (Tensor, Tensor)",
    "transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor",
    "mylib::cat(Tensor[] xs, SymInt n, str mode='a', ScalarType? dtype=None) -> Tensor[]",
    "mylib::f(Tensor x, bool flag=True, float eps=1e-05) -> Tensor",
])
def test_schemas_torch_prints_are_accepted(text):
    schema = parse_schema(text)
    assert schema.namespace in ("mylib", "transformers")


def test_the_target_names_the_overload():
    assert parse_schema("mylib::foo(Tensor x) -> Tensor").target == "torch.ops.mylib.foo.default"
    assert parse_schema("mylib::foo.bar(Tensor x) -> Tensor").target == "torch.ops.mylib.foo.bar"


@pytest.mark.parametrize("text, why", [
    ("mylib::add_(Tensor(a!) x, Tensor y) -> Tensor(a!)", "mutates an argument"),
    ("mylib::sq_(Tensor(a!) x) -> ()", "mutates an argument"),
    ("mylib::view(Tensor(a) x) -> Tensor(a)", "aliases an argument"),
])
def test_mutating_and_aliasing_ops_are_refused_by_name(text, why):
    with pytest.raises(RefusedCustomOp, match=why) as info:
        parse_schema(text)
    assert info.value.target.startswith("mylib::")


@pytest.mark.parametrize("namespace", ["aten", "prims", "prim", "quantized", "_c10d_functional", "torchfarm"])
def test_torchs_own_namespaces_cannot_be_declared(namespace):
    with pytest.raises(RefusedCustomOp, match="reserved namespace"):
        parse_schema(f"{namespace}::add(Tensor x) -> Tensor")


@pytest.mark.parametrize("text, error", [
    ("mylib::f(Tensor x) -> int", RefusedCustomOp),  # a stand-in returns tensors only
    ("mylib::f(Generator g) -> Tensor", RefusedCustomOp),
    ("mylib::f(Tensor x) -> Tensor; import os", MalformedGraph),
    ("mylib::f(Tensor x) -> Tensor\nmylib::g(Tensor y) -> Tensor", MalformedGraph),
    ("__import__('os')::f(Tensor x) -> Tensor", MalformedGraph),
    ("mylib::f(Tensor x=__import__('os').system('id')) -> Tensor", MalformedGraph),
    ("mylib::f(Tensor x", MalformedGraph),
    ("mylib::f(Tensor x) ->", MalformedGraph),
    ("mylib:f(Tensor x) -> Tensor", MalformedGraph),
    ("mylib::f(Tensor \u00e9) -> Tensor", MalformedGraph),
    ("mylib::f(" + ", ".join(f"Tensor x{i}" for i in range(65)) + ") -> Tensor", GraphTooLarge),
    ("mylib::f(Tensor x) -> (" + ", ".join(["Tensor"] * 17) + ")", GraphTooLarge),
    ("mylib::f(Tensor x, int[" + "9" * 40 + "] y) -> Tensor", MalformedGraph),
])
def test_hostile_or_unsupported_schemas_are_refused(text, error):
    with pytest.raises(error):
        parse_schema(text)


def test_a_long_schema_is_refused_before_it_is_parsed():
    text = "mylib::f(Tensor x" + ", Tensor y" * MAX_SCHEMA_CHARS + ") -> Tensor"
    with pytest.raises(GraphTooLarge, match=str(MAX_SCHEMA_CHARS)):
        parse_schema(text)


def _graph(*ops: tuple[str, str], call_target: str = "torch.ops.mylib.foo.default") -> graph_pb2.Graph:
    g = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1)
    for target, schema in ops:
        g.custom_ops.add(target=target, schema=schema)
    x = g.nodes.add(name="x", op=graph_pb2.Node.PLACEHOLDER, target="x")
    x.tensor.shape.add(expr="4", hint=4)
    x.tensor.stride.add(expr="1", hint=1)
    x.tensor.dtype = "float32"
    x.tensor.device.type = "cpu"
    x.tensor.kind = graph_pb2.TensorMeta.INPUT
    call = g.nodes.add(name="y", op=graph_pb2.Node.CALL_FUNCTION, target=call_target)
    call.args.add(node="x")
    call.custom.inputs.add().CopyFrom(x.tensor)
    call.custom.outputs.add().CopyFrom(x.tensor)
    out = g.nodes.add(name="output", op=graph_pb2.Node.OUTPUT, target="output")
    out.args.add().tuple.items.add(node="y")
    return g


FOO = ("torch.ops.mylib.foo.default", "mylib::foo(Tensor x) -> Tensor")


def test_a_graph_calling_a_declared_op_is_valid():
    g = _graph(FOO)
    validate_graph(g)
    assert list(declared_ops(g)) == [FOO[0]]


def test_an_undeclared_custom_op_is_not_on_the_allow_list():
    g = _graph()
    g.nodes[1].ClearField("custom")
    with pytest.raises(DisallowedOp):
        validate_graph(g)


def test_a_declared_target_must_match_its_schema():
    # Declaring an innocent schema under aten's name must not let aten.* through.
    with pytest.raises(MalformedGraph, match="does not match"):
        validate_graph(_graph(("torch.ops.aten.add.Tensor", "mylib::foo(Tensor x) -> Tensor")))


def test_a_reserved_namespace_is_refused_by_the_graph_check():
    with pytest.raises(RefusedCustomOp):
        validate_graph(_graph(("torch.ops.aten.foo.default", "aten::foo(Tensor x) -> Tensor"),
                              call_target="torch.ops.aten.foo.default"))


def test_duplicate_declarations_are_refused():
    with pytest.raises(MalformedGraph, match="twice"):
        validate_graph(_graph(FOO, FOO))


def test_custom_metadata_only_on_custom_calls():
    g = _graph(FOO)
    g.nodes[0].custom.outputs.add()
    with pytest.raises(MalformedGraph, match="custom metadata"):
        validate_graph(g)


def test_recorded_metadata_is_checked_like_a_placeholders():
    g = _graph(FOO)
    g.nodes[1].custom.outputs[0].dtype = "object"
    with pytest.raises(GraphError, match="dtype"):
        validate_graph(g)


def test_a_stand_in_answers_from_recorded_metadata_without_the_clients_code():
    """The worker side, in process: an op this process never registered decodes,
    propagates and gets its output metadata from the graph alone."""
    from torchfarm.fx.decode import decode_graph

    g = _graph(("torch.ops.tfstandin.foo.default", "tfstandin::foo(Tensor x) -> Tensor"),
               call_target="torch.ops.tfstandin.foo.default")
    out = g.nodes[1].custom.outputs[0]
    out.shape[0].expr, out.shape[0].hint = "2", 2
    out.shape.add(expr="2", hint=2)
    out.stride[0].expr, out.stride[0].hint = "2", 2
    out.stride.add(expr="1", hint=1)
    out.dtype = "float64"
    decoded = decode_graph(g)
    (node,) = [n for n in decoded.gm.graph.nodes if n.name == "y"]
    assert node.target is torch.ops.tfstandin.foo.default
    assert tuple(node.meta["val"].shape) == (2, 2) and node.meta["val"].dtype == torch.float64
    # The stand-in has no kernel: it cannot run, only be compiled around.
    with pytest.raises(NotImplementedError):
        torch.ops.tfstandin.foo.default(torch.ones(4))


def test_calls_told_apart_only_by_non_tensor_arguments_are_refused():
    """The stand-in answers by tensor arguments: two calls with the same ones and
    different outputs (an op whose output size is an int argument) cannot be told apart."""
    from torchfarm.fx.decode import decode_graph

    g = _graph(("torch.ops.tfambig.rows.default", "tfambig::rows(Tensor x, int n) -> Tensor"),
               call_target="torch.ops.tfambig.rows.default")
    g.nodes[1].args.add(int_value=4)
    second = graph_pb2.Node()
    second.CopyFrom(g.nodes[1])
    second.name, second.args[1].int_value = "z", 2
    second.custom.outputs[0].shape[0].expr, second.custom.outputs[0].shape[0].hint = "2", 2
    g.nodes.insert(2, second)
    g.nodes[-1].args[0].tuple.items.add(node="z")
    with pytest.raises(RefusedCustomOp, match="same tensor arguments"):
        decode_graph(g)


def test_an_existing_op_not_configured_as_installed_is_refused():
    from torchfarm.fx.decode import decode_graph

    torch.library.define("tfexisting::foo", "(Tensor x) -> Tensor")
    g = _graph(("torch.ops.tfexisting.foo.default", "tfexisting::foo(Tensor x) -> Tensor"),
               call_target="torch.ops.tfexisting.foo.default")
    with pytest.raises(RefusedCustomOp, match="not configured as installed"):
        decode_graph(g)


def _capture(fn, *args, dynamic=None):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    return graphs[0]


def test_the_client_sends_the_schema_and_recorded_sizes_and_a_worker_without_the_op_decodes_it():
    from torchfarm.fx.decode import decode_graph
    from torchfarm.fx.encode import encode_graph

    @torch.library.custom_op("tfclient::halve_rows", mutates_args=())
    def halve_rows(x: torch.Tensor) -> torch.Tensor:
        return x[: x.shape[0] // 2].clone()

    @halve_rows.register_fake
    def _(x):
        return x.new_empty((x.shape[0] // 2, x.shape[1]))

    graph = encode_graph(*_capture(lambda x: halve_rows(x.sin()), torch.randn(6, 3), dynamic=True))
    (op,) = graph.custom_ops
    assert op.target == "torch.ops.tfclient.halve_rows.default"
    assert op.schema == "tfclient::halve_rows(Tensor x) -> Tensor"
    (call,) = [n.custom for n in graph.nodes if n.HasField("custom")]
    assert [s.expr for s in call.outputs[0].shape][1:] == [call.inputs[0].shape[1].expr]
    assert "//" in call.outputs[0].shape[0].expr  # symbolic, over the graph's symbols
    # A worker that never saw this op: the same bytes under a namespace of the same length.
    data = graph.SerializeToString().replace(b"tfclient", b"tfworker")
    decoded = decode_graph(graph_pb2.Graph.FromString(data))
    (node,) = [n for n in decoded.gm.graph.nodes if "halve_rows" in str(n.target)]
    assert node.target is torch.ops.tfworker.halve_rows.default
    rows, cols = node.meta["val"].shape
    assert isinstance(rows, torch.SymInt) and isinstance(cols, torch.SymInt)


def test_a_mutating_custom_op_is_refused_by_name_on_the_client():
    from torchfarm.fx.encode import UnsupportedGraph, encode_graph

    @torch.library.custom_op("tfclient::scale_", mutates_args=("x",))
    def scale_(x: torch.Tensor) -> None:
        x.mul_(2)

    @scale_.register_fake
    def _(x):
        return None

    def fn(x):
        y = x.clone()
        scale_(y)
        return y

    with pytest.raises(UnsupportedGraph, match="tfclient::scale_"):
        encode_graph(*_capture(fn, torch.randn(3)))


def test_a_call_through_the_packet_names_its_only_overload():
    """Mixtral calls `torch.ops.transformers.grouped_mm_fallback(...)`, the packet."""
    from torchfarm.fx.encode import encode_graph

    torch.library.define("tfpacket::twice", "(Tensor x) -> Tensor")
    torch.library.impl("tfpacket::twice", "CompositeExplicitAutograd", lambda x: x * 2)
    torch.library.register_fake("tfpacket::twice", lambda x: torch.empty_like(x))
    graph = encode_graph(*_capture(lambda x: torch.ops.tfpacket.twice(x), torch.randn(3)))
    assert [op.target for op in graph.custom_ops] == ["torch.ops.tfpacket.twice.default"]
    assert "torch.ops.tfpacket.twice.default" in [n.target for n in graph.nodes]


@pytest.mark.parametrize("schema, code", [
    ("aten::add(Tensor x) -> Tensor", "DISALLOWED_OP"),
    ("mylib::add_(Tensor(a!) x) -> Tensor(a!)", "DISALLOWED_OP"),
    ("mylib::f(Tensor x) -> Tensor; import os", "INVALID_GRAPH"),
    ("mylib::f(Tensor x" + ", Tensor y" * 300 + ") -> Tensor", "GRAPH_TOO_LARGE"),
])
def test_the_coordinator_refuses_hostile_schemas_at_submit(schema, code):
    from localfarm.fakes import InProcessFarm
    from sdk.errors import GraphRejected
    from tests.requests import relu_request

    request = relu_request()
    request.graph.custom_ops.add(target="torch.ops.mylib.f.default", schema=schema)
    with pytest.raises(GraphRejected) as refused:
        InProcessFarm().client(run_jobs=False).submit(request)
    assert refused.value.code == code


@torch.library.custom_op("tfgrad::scale2", mutates_args=())
def _scale2(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * 2 + w


_scale2.register_fake(lambda x, w: torch.empty_like(x))
_scale2.register_autograd(
    lambda ctx, g: (g * 2, g), setup_context=lambda ctx, inputs, output: None
)


@pytest.mark.slow
def test_an_installed_namespace_trains_through_the_real_op(tmp_path, monkeypatch):
    """A worker configured with the op's package installed (in process: this module)
    uses the real op and its autograd: forward and backward match eager."""
    import copy

    from localfarm.fakes import InProcessFarm
    from sdk.backend import FarmBackend

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    farm = InProcessFarm(worker_settings={"installed_op_modules": ("tfgrad=",)})
    farm.register_worker()
    backend = FarmBackend(farm.sdk_settings(fallback="error"), client=farm.client())
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    eager = copy.deepcopy(lin)

    def fn(m, x, w):
        return _scale2(m(x).sin(), w).cos()

    x, w = torch.randn(4, 3), torch.randn(4, 3, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_(True)
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend=backend)(lin, x, w)
        out.sum().backward()
    finally:
        torch._dynamo.reset()
    ref = fn(eager, x, w_ref)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w.grad, w_ref.grad)
    torch.testing.assert_close(lin.weight.grad, eager.weight.grad)
    (job,) = farm.store.recent_jobs()
    assert job.state == "SUCCEEDED"
