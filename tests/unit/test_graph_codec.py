"""Encode (SDK) -> validate (coordinator) -> decode (worker) on real Dynamo graphs."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples.models import TINY_GPT, make_cnn, make_gpt, make_mlp
from torchfarm.fx.decode import DecodedGraph, decode_graph
from torchfarm.fx.encode import UnsupportedGraph, encode_graph
from torchfarm.graph.graph_errors import DisallowedOp, GraphError, MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _real(values: Sequence[Any]) -> list[Any]:
    """Fresh copies of a backend's example inputs, with SymInts made concrete."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.SymInt):
            out.append(int(v.node.hint))
        elif isinstance(v, torch.Tensor):
            out.append(v.detach().clone())
        else:
            out.append(v)
    return out


class Capture:
    """A Dynamo backend that round-trips each graph and checks it against the original."""

    def __init__(self) -> None:
        self.graphs: list[graph_pb2.Graph] = []
        self.decoded: list[DecodedGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graph = encode_graph(gm, example_inputs)
        validate_graph(graph)
        decoded = decode_graph(graph)
        torch.manual_seed(0)
        expected = gm(*_real(example_inputs))
        torch.manual_seed(0)
        actual = decoded.gm(*_real(example_inputs))
        torch.testing.assert_close(actual, expected, equal_nan=True)
        self.graphs.append(graph)
        self.decoded.append(decoded)
        return gm.forward


def roundtrip(fn: Callable[..., Any], *args: Any) -> Capture:
    capture = Capture()
    compiled = torch.compile(fn, backend=capture)
    torch.manual_seed(0)
    expected = fn(*args)
    torch.manual_seed(0)
    actual = compiled(*args)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert capture.graphs, "Dynamo produced no graph"
    return capture


# ---------------------------------------------------------------------------
# Functions covering the argument kinds and targets real models produce
# ---------------------------------------------------------------------------


def f_slicing(x: torch.Tensor) -> Any:
    return x[1:, ::2] + x[:-1, 1::2], x[..., 0], x[:, None, 1], x[0, ...], x[..., None, :2]


def f_index_tensor(x: torch.Tensor, idx: torch.Tensor) -> Any:
    return x[idx], x[:, idx], x[idx, ..., 1]


def f_views(x: torch.Tensor) -> Any:
    b, t, c = x.shape
    y = x.view(b, t * c).reshape(b, c, t).permute(2, 0, 1).transpose(0, 1)
    return y.contiguous().flatten(1).unsqueeze(0), x.new_zeros(()), x.sum(dim=())


def f_arange(x: torch.Tensor) -> Any:
    n = x.shape[-1]
    return x + torch.arange(n, dtype=x.dtype, device=x.device), torch.arange(
        0, n, 2, dtype=torch.int64
    )


def f_dtype_device(x: torch.Tensor) -> Any:
    a = x.to(torch.float64).sum() + torch.zeros(3, dtype=torch.float64, device="cpu").sum()
    b = x.new_full((2,), 3.0, dtype=torch.float16)
    c = x.to(dtype=torch.bfloat16, memory_format=torch.contiguous_format)
    d = torch.empty(2, 3, layout=torch.strided).fill_(1.0)
    return a, b, c, d


def f_masked(x: torch.Tensor) -> Any:
    t = x.shape[-1]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    return x.masked_fill(~mask, float("-inf")).softmax(-1)


def f_cat_stack(x: torch.Tensor, y: torch.Tensor) -> Any:
    return (
        torch.cat([x, y], dim=0),
        torch.stack((x, y), 1),
        torch.chunk(x, 2, dim=1)[1],
        x.split([1, 3], dim=1)[0],
    )


def f_inline_constants(x: torch.Tensor) -> Any:
    return x * torch.tensor([1.0, 2.0, 3.0, 4.0]) + torch.tensor(0.5), torch.full((4,), 2)


def f_norms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return (
        F.layer_norm(x, (4,), w, b, 1e-5),
        F.rms_norm(x, (4,)),
        F.dropout(x, 0.5, training=False),
        F.normalize(x, dim=-1),
    )


def f_embedding(idx: torch.Tensor, table: torch.Tensor) -> Any:
    return F.embedding(idx, table), table[idx].sum(0)


def f_where(x: torch.Tensor) -> Any:
    return (
        torch.where(x > 0, x, torch.zeros_like(x)),
        torch.where(x < 0, 1.0, x),
        x.clamp(min=-0.5, max=0.5),
    )


def f_reductions(x: torch.Tensor) -> Any:
    return (
        x.sum(dim=1, keepdim=True),
        x.mean((0, 1)),
        x.max(dim=1).values,
        x.topk(2, dim=-1)[1],
        x.argmax(),
        x.std(0, unbiased=False),
    )


def f_activations(x: torch.Tensor) -> Any:
    return (
        F.softmax(x, dim=-1),
        F.log_softmax(x, -1),
        F.gelu(x, approximate="tanh"),
        F.silu(x),
        F.cross_entropy(x, torch.tensor([0, 1, 2])),
        F.max_pool1d(x.unsqueeze(0), 2),
    )


def f_graph_break(x: torch.Tensor) -> Any:
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos() + 1


def f_global_state(x: torch.Tensor) -> Any:
    with torch.no_grad():
        y = x * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = x @ x.t()
    return y + z.float().sum()


def f_setitem(x: torch.Tensor) -> Any:
    x = x.clone()
    x[0, ...] = 0
    x[:, 1] += 1
    return x


def f_python_scalars(x: torch.Tensor) -> Any:
    return x * 0.5 + 3, x**2, -x, abs(x), x // 2, x % 3, 2 - x, x * math.pi


def f_vmap(x: torch.Tensor) -> Any:
    return torch.vmap(lambda r: r.sin() * 2)(x)


def f_matmul(x: torch.Tensor, y: torch.Tensor) -> Any:
    return x @ y, torch.bmm(x.unsqueeze(0), y.unsqueeze(0)), torch.einsum("ij,jk->ik", x, y)


def f_offset_input(x: torch.Tensor) -> Any:
    return x * 2, x.t()


def f_inplace_after_break(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x @ w
    torch._dynamo.graph_break()
    y *= 2  # the second graph's input, an activation, written in place
    y += 1
    return y


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


FUNCTIONS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    "slicing": (f_slicing, lambda: (_randn(4, 6),)),
    "index tensor": (f_index_tensor, lambda: (_randn(4, 5), torch.tensor([0, 2, 3]))),
    "views": (f_views, lambda: (_randn(2, 3, 4),)),
    "arange": (f_arange, lambda: (_randn(3, 5),)),
    "dtype and device kwargs": (f_dtype_device, lambda: (_randn(2, 3),)),
    "masked_fill": (f_masked, lambda: (_randn(2, 4, 4),)),
    "cat and stack": (f_cat_stack, lambda: (_randn(2, 4), _randn(2, 4))),
    "inline constants": (f_inline_constants, lambda: (_randn(3, 4),)),
    "norms and dropout": (f_norms, lambda: (_randn(2, 4), _randn(4), _randn(4))),
    "embedding": (f_embedding, lambda: (torch.tensor([[1, 2], [0, 3]]), _randn(5, 3))),
    "where": (f_where, lambda: (_randn(3, 4),)),
    "reductions": (f_reductions, lambda: (_randn(3, 4),)),
    "activations and loss": (f_activations, lambda: (_randn(3, 4),)),
    "graph break": (f_graph_break, lambda: (_randn(3),)),
    "no_grad and autocast": (f_global_state, lambda: (_randn(3, 3),)),
    "setitem": (f_setitem, lambda: (_randn(3, 4),)),
    "python scalars": (f_python_scalars, lambda: (_randn(3, 4),)),
    "vmap": (f_vmap, lambda: (_randn(3, 4),)),
    "matmul": (f_matmul, lambda: (_randn(3, 4), _randn(4, 2))),
    "input with storage offset": (f_offset_input, lambda: (_randn(5, 4)[1:, 1:],)),
    "activation written in place": (f_inplace_after_break, lambda: (_randn(3, 4), _randn(4, 4).requires_grad_())),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_roundtrip_functions(name: str) -> None:
    fn, make_args = FUNCTIONS[name]
    capture = roundtrip(fn, *make_args())
    if name == "graph break":
        assert len(capture.graphs) == 2
    if name == "activation written in place":
        # A leaf could not be written in place; the activation it stands for is none.
        (activation,) = capture.decoded[1].example_inputs
        assert activation.requires_grad and not activation.is_leaf
    if name == "input with storage offset":
        (meta,) = [n.tensor for n in capture.graphs[0].nodes if n.HasField("tensor")]
        assert meta.storage_offset == 5 and [s.expr for s in meta.stride] == ["4", "1"]


@pytest.mark.parametrize(
    "make, train",
    [(make_mlp, False), (make_cnn, False), (make_cnn, True)],
    ids=["mlp", "cnn-eval", "cnn-train"],
)
def test_roundtrip_models(make: Callable[..., Any], train: bool) -> None:
    model, inputs = make()
    model.train(train)
    capture = roundtrip(model, *inputs)
    kinds = [n.tensor.kind for n in capture.graphs[0].nodes if n.HasField("tensor")]
    assert graph_pb2.TensorMeta.PARAMETER in kinds
    if make is make_cnn:
        assert graph_pb2.TensorMeta.BUFFER in kinds


def test_roundtrip_gpt_training() -> None:
    model, inputs = make_gpt(TINY_GPT, batch=2)
    model.train()
    capture = roundtrip(model, *inputs)
    (graph,) = capture.graphs
    decoded = capture.decoded[0]
    placeholders = [n for n in graph.nodes if n.op == graph_pb2.Node.PLACEHOLDER]
    assert len(placeholders) == len(decoded.example_inputs)
    for node, value in zip(placeholders, decoded.example_inputs, strict=False):
        assert isinstance(value, torch.nn.Parameter) == (
            node.tensor.kind == graph_pb2.TensorMeta.PARAMETER
        )
        assert value.requires_grad == node.tensor.requires_grad
    # Every node that produces a value carries it where AOTAutograd's cache looks.
    for node in decoded.gm.graph.nodes:
        if node.op in ("placeholder", "call_method"):
            assert "example_value" in node.meta
    targets = {n.target for n in graph.nodes}
    assert {"torch.arange", "_operator.getitem", "torch._C._nn.linear", "view"} <= targets


def test_node_meta_is_dropped() -> None:
    model, inputs = make_mlp()
    data = roundtrip(model, *inputs).graphs[0].SerializeToString()
    assert b"stack_trace" not in data and b".py" not in data


# ---------------------------------------------------------------------------
# Dynamic shapes
# ---------------------------------------------------------------------------


def f_dynamic(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x[:, 1:] * 2
    z = torch.arange(x.shape[0], dtype=torch.float32)
    return (y.sum(1) + z) @ w.new_ones(x.shape[0]), y.reshape(-1, 2).shape[0], x.view(x.size(0), -1)


def test_dynamic_batch() -> None:
    x = _randn(6, 5)
    torch._dynamo.mark_dynamic(x, 0)
    capture = roundtrip(f_dynamic, x, _randn(3))
    graph, decoded = capture.graphs[0], capture.decoded[0]
    assert [s.name for s in graph.symbols] and graph.symbols[0].hint == 6
    assert any(n.HasField("symint") for n in graph.nodes)
    assert isinstance(decoded.example_inputs[0], torch.SymInt)
    assert decoded.shape_env.backed_var_to_val


def test_dynamic_inner_dims_give_symbolic_strides() -> None:
    x = _randn(2, 6, 4)
    torch._dynamo.mark_dynamic(x, 1)
    torch._dynamo.mark_dynamic(x, 2)
    capture = roundtrip(lambda t: (t.transpose(1, 2) * 2).sum(-1), x)
    strides = [
        s.expr for n in capture.graphs[0].nodes if n.HasField("tensor") for s in n.tensor.stride
    ]
    assert any("*" in s for s in strides), strides


def f_data_dependent(x: torch.Tensor) -> Any:
    return x.nonzero().shape[0] * x + x.sum().item()


def test_data_dependent_sizes() -> None:
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
    ):
        capture = roundtrip(f_data_dependent, _randn(5))
    targets = {n.target for n in capture.graphs[0].nodes}
    assert {"nonzero", "item", "torch.ops.aten.sym_size.int"} <= targets


def test_dynamic_mlp() -> None:
    model, (x,) = make_mlp()
    torch._dynamo.mark_dynamic(x, 0)
    roundtrip(model, x)


def f_jagged(values: torch.Tensor, offsets: torch.Tensor) -> Any:
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    return (torch.relu(nt) * 2).values().sum(-1)


def f_jagged_across_a_break(values: torch.Tensor, offsets: torch.Tensor) -> Any:
    nt = torch.nested.nested_tensor_from_jagged(values, offsets).relu()
    torch._dynamo.graph_break()
    return (nt * 3).values()


def test_a_jagged_nested_tensor_made_inside_the_graph_roundtrips() -> None:
    """Made from a dense tensor and its offsets, used and taken apart in the same graph:
    the graph's inputs and outputs are strided; the constructor Dynamo records is allowed."""
    capture = roundtrip(f_jagged, _randn(7, 4), torch.tensor([0, 2, 7]))
    targets = {n.target for n in capture.graphs[0].nodes}
    assert "torch.nested._internal.nested_tensor.nested_view_from_values_offsets_lengths" in targets


def test_a_nested_tensor_input_is_unsupported_not_a_crash() -> None:
    """After a graph break the next graph takes the nested tensor and its ragged size, a
    symbol with no integer value: refused, so the SDK compiles the graph locally. It
    raised TypeError from the encoder, which failed the user's call."""
    seen: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, example_inputs))
        return gm.forward

    values, offsets = _randn(7, 4), torch.tensor([0, 2, 7])
    torch._dynamo.reset()
    torch.compile(f_jagged_across_a_break, backend=backend)(values, offsets)
    torch._dynamo.reset()
    assert len(seen) == 2
    encode_graph(*seen[0])  # the first returns the nested tensor
    with pytest.raises(UnsupportedGraph, match="nested|layout"):
        encode_graph(*seen[1])


def f_writes_an_aliased_input(a: torch.Tensor, b: torch.Tensor) -> Any:
    a.mul_(2)
    return b + 1


def f_reads_aliased_inputs(a: torch.Tensor, b: torch.Tensor) -> Any:
    return a.sum() + b


def _row_and_its_matrix() -> tuple[torch.Tensor, torch.Tensor]:
    base = torch.arange(12.0).reshape(3, 4)
    return base, base[1]


def test_inputs_sharing_memory_that_the_graph_writes_are_unsupported() -> None:
    """The format describes each input apart: compiled so, `a.mul_(2)` left `b`, a view
    of `a`, as it was, and the farm's result differed from eager by 7.0."""
    seen: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, example_inputs))
        return gm.forward

    for fn in (f_writes_an_aliased_input, f_reads_aliased_inputs):
        torch._dynamo.reset()
        torch.compile(fn, backend=backend)(*_row_and_its_matrix())
    torch._dynamo.reset()
    (writes, write_inputs), (reads, read_inputs) = seen
    with pytest.raises(UnsupportedGraph, match="inputs l_a_ and l_b_ share memory"):
        encode_graph(writes, write_inputs)
    encode_graph(reads, read_inputs)  # read only, their sharing changes no result
    roundtrip(f_writes_an_aliased_input, torch.arange(12.0).reshape(3, 4), torch.arange(4.0))  # apart


def test_inputs_that_share_memory_but_are_no_views_are_read_apart():
    """Two halves of one buffer that are not views of each other (`split` outputs of an
    Inductor graph, detached): Dynamo's fake of the second starts at version 1, which
    read as an in-place write, and the graph (torchvision's RPN loss) was refused."""
    seen: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, example_inputs))
        return gm.forward

    def reads(a, b):
        return torch.cat([a, b]).sum()

    def writes(a, b):
        a.add_(1)
        return torch.cat([a, b]).sum()

    for fn in (reads, writes):
        torch._dynamo.reset()
        a, b = (t.detach() for t in torch.randn(4, 3).split(2))
        torch.compile(fn, backend=backend)(a, b)
    torch._dynamo.reset()
    (read, read_inputs), (written, written_inputs) = seen
    encode_graph(read, read_inputs)
    with pytest.raises(UnsupportedGraph, match="share memory"):
        encode_graph(written, written_inputs)


# ---------------------------------------------------------------------------
# Inline constants and what the format cannot hold
# ---------------------------------------------------------------------------


class WithConstant(nn.Module):
    def __init__(self, numel: int = 4) -> None:
        super().__init__()
        self.scale = torch.arange(numel, dtype=torch.float32)
        self.flags = torch.tensor([True, False, True, True])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(-1)[:1] * self.scale).sum() + x.masked_fill(self.flags, 0.0)


def test_get_attr_constants_roundtrip() -> None:
    gm = torch.fx.symbolic_trace(WithConstant())
    x = _randn(3, 4)
    graph = encode_graph(gm, [x])
    assert {c.name for c in graph.constants} == {"scale", "flags"}
    decoded = decode_graph(graph)
    torch.testing.assert_close(decoded.gm(x), gm(x))


def test_big_constant_is_unsupported() -> None:
    gm = torch.fx.symbolic_trace(WithConstant(numel=300_000))
    with pytest.raises(UnsupportedGraph, match="constants exceed"):
        encode_graph(gm, [_randn(3, 4)])


def test_higher_order_ops_off_the_list_are_unsupported_by_name() -> None:
    # Checkpoint, cond and the rest travel as subgraphs (tests/unit/test_subgraphs.py);
    # a higher-order op the farm does not allow is refused, named.
    gm = _manual_graph(torch.ops.higher_order.run_and_save_rng_state)
    with pytest.raises(UnsupportedGraph, match="torch.ops.higher_order.run_and_save_rng_state"):
        encode_graph(gm, [_randn(1, 2)])


def test_call_module_is_unsupported() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(UnsupportedGraph, match="call_module"):
        encode_graph(gm, [_randn(1, 2)])


def _manual_graph(target: Callable[..., Any], *extra: Any) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(target, (x, *extra)),))
    return torch.fx.GraphModule(nn.Module(), g)


def test_disallowed_target_is_unsupported_on_the_client() -> None:
    with pytest.raises(
        UnsupportedGraph, match="'torch.serialization.save' is not on the farm's allow-list"
    ):
        encode_graph(_manual_graph(torch.save, "/tmp/x"), [_randn(2)])


def test_unknown_argument_type_is_unsupported() -> None:
    with pytest.raises(UnsupportedGraph, match="bytes"):
        encode_graph(_manual_graph(torch.add, b"raw"), [_randn(2)])
    with pytest.raises(UnsupportedGraph, match="qualified name"):
        encode_graph(_manual_graph(lambda t: t), [_randn(2)])


def _valid_graph() -> graph_pb2.Graph:
    return encode_graph(_manual_graph(torch.relu), [_randn(2, 3)])


def test_decoder_rejects_disallowed_op() -> None:
    graph = _valid_graph()
    graph.nodes[1].target = "torch.save"
    with pytest.raises(DisallowedOp, match="torch.save") as info:
        decode_graph(graph)
    assert info.value.target == "torch.save"


def test_decoder_rejects_a_graph_that_does_not_type_check() -> None:
    graph = _valid_graph()
    graph.nodes[1].target = "torch._C._nn.linear"  # linear(x) without a weight
    with pytest.raises(MalformedGraph, match="type-check"):
        decode_graph(graph)


def _with_nodes_before_output(graph: graph_pb2.Graph, *nodes: graph_pb2.Node) -> graph_pb2.Graph:
    output = graph_pb2.Node()
    output.CopyFrom(graph.nodes[-1])
    del graph.nodes[-1]
    graph.nodes.extend([*nodes, output])
    return graph


def _python_op(target: str, operand: int) -> graph_pb2.Graph:
    """x.size() or x.size(0), then `target(that, operand)`."""
    Arg, N = graph_pb2.Argument, graph_pb2.Node
    size_args = [Arg(node="x")] + ([Arg(int_value=0)] if target == "_operator.pow" else [])
    return _with_nodes_before_output(
        _valid_graph(),
        N(name="size", op=N.CALL_METHOD, target="size", args=size_args),
        N(
            name="op",
            op=N.CALL_FUNCTION,
            target=target,
            args=[Arg(node="size"), Arg(int_value=operand)],
        ),
    )


def test_decoder_bounds_python_arithmetic() -> None:
    decode_graph(_python_op("_operator.mul", 2))
    decode_graph(_python_op("_operator.pow", 3))
    with pytest.raises(MalformedGraph, match="repeated"):
        decode_graph(_python_op("_operator.mul", 10**12))
    with pytest.raises(MalformedGraph, match="pow"):
        decode_graph(_python_op("_operator.pow", 10**9))


# ---------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------


def _encode_digests() -> str:
    """sha256 of the encodings of the tiny GPT and a dynamic-shape function."""
    out: list[bytes] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        out.append(encode_graph(gm, example_inputs).SerializeToString(deterministic=True))
        return gm.forward

    model, inputs = make_gpt(TINY_GPT, batch=2)
    torch.compile(model, backend=backend)(*inputs)
    x = torch.randn(6, 5)
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(lambda t: t.reshape(-1, 1) * t.shape[0], backend=backend)(x)
    return " ".join(hashlib.sha256(b).hexdigest() for b in out)


def test_encoding_is_deterministic_in_process() -> None:
    first = _encode_digests()
    torch._dynamo.reset()
    assert _encode_digests() == first


@pytest.mark.slow  # a second interpreter imports torch and runs Dynamo
def test_encoding_is_deterministic_across_processes() -> None:
    here = _encode_digests()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from tests.unit.test_graph_codec import _encode_digests; print(_encode_digests())"
    there = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()
    assert there == here


# ---------------------------------------------------------------------------
# Fuzzing: validate + decode only ever raise GraphError
# ---------------------------------------------------------------------------


def _seed_graphs() -> list[bytes]:
    """Encoded graphs covering symbols, symint placeholders, state helpers, slices, constants."""
    torch._dynamo.reset()
    seeds: list[bytes] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seeds.append(encode_graph(gm, example_inputs).SerializeToString(deterministic=True))
        return gm.forward

    x = _randn(6, 5)
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(f_dynamic, backend=backend)(x, _randn(3))
    torch.compile(f_global_state, backend=backend)(_randn(3, 3))
    torch.compile(f_slicing, backend=backend)(_randn(4, 6))
    seeds.append(
        encode_graph(torch.fx.symbolic_trace(WithConstant()), [_randn(3, 4)]).SerializeToString()
    )
    torch._dynamo.reset()
    return seeds


@pytest.fixture(scope="module")
def seed_graphs() -> list[bytes]:
    return _seed_graphs()


def _only_graph_errors(graph: graph_pb2.Graph) -> None:
    try:
        validate_graph(graph)
        decode_graph(graph)
    except GraphError:
        pass
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    assert torch._C._functorch.maybe_current_level() is None


FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_bytes(seed_graphs: list[bytes], data: st.DataObject) -> None:
    raw = bytearray(data.draw(st.sampled_from(seed_graphs)))
    for _ in range(data.draw(st.integers(1, 2))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        # Mostly single-byte changes: they keep the protobuf framing intact more often.
        action = data.draw(
            st.sampled_from(["flip", "flip", "flip", "insert", "delete", "truncate"])
        )
        if action == "flip":
            raw[pos] = data.draw(st.integers(0, 127))  # high bytes mostly break UTF-8 strings
        elif action == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del raw[pos : pos + data.draw(st.integers(1, 8))]
        else:
            del raw[pos:]
        if not raw:
            return
    graph = graph_pb2.Graph()
    try:
        graph.ParseFromString(bytes(raw))
    except Exception:  # noqa: BLE001 - not a protobuf message at all; gRPC would refuse it
        return
    _only_graph_errors(graph)


TARGETS = [
    "torch.relu",
    "_operator.add",
    "_operator.mul",
    "_operator.pow",
    "_operator.getitem",
    "torch.cat",
    "torch.arange",
    "torch.zeros",
    "torch.nn.functional.layer_norm",
    "torch._C._nn.linear",
    "torch.sym_min",
    "torch.ops.aten.add.Tensor",
    "torch._C._set_grad_enabled",
    "torch.amp.autocast_mode._enter_autocast",
    "torch._functorch.predispatch._vmap_increment_nesting",
    "math.sqrt",
    "view",
    "size",
    "sum",
    "to",
    "torch.save",
    "os.system",
    "",
    "torch.no_such_op",
    "__class__",
]
SCALARS = st.one_of(
    st.builds(graph_pb2.Argument, none=st.just(graph_pb2.NoneValue())),
    st.builds(graph_pb2.Argument, bool_value=st.booleans()),
    st.builds(graph_pb2.Argument, int_value=st.integers(-(2**63), 2**63 - 1)),
    st.builds(graph_pb2.Argument, float_value=st.floats()),
    st.builds(graph_pb2.Argument, str_value=st.text(max_size=8)),
    st.builds(graph_pb2.Argument, dtype=st.sampled_from(["float32", "int64", "bool", "float33"])),
    st.builds(
        graph_pb2.Argument,
        sym=st.builds(
            graph_pb2.SymExpr,
            expr=st.sampled_from(["s0", "s2", "2*s2", "(s2//0)", "Mod(s2, 0)", "s2**64"]),
            hint=st.integers(0, 99),
        ),
    ),
    st.builds(
        graph_pb2.Argument, node=st.sampled_from(["x", "l_x_", "s2", "getitem", "output", "nope"])
    ),
)
ARGUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.builds(
            graph_pb2.Argument,
            tuple=st.builds(graph_pb2.ArgumentList, items=st.lists(inner, max_size=3)),
        ),
        st.builds(
            graph_pb2.Argument,
            list=st.builds(graph_pb2.ArgumentList, items=st.lists(inner, max_size=3)),
        ),
    ),
    max_leaves=6,
)


@FUZZ
@given(data=st.data())
def test_fuzz_structured_mutations(seed_graphs: list[bytes], data: st.DataObject) -> None:
    graph = graph_pb2.Graph.FromString(data.draw(st.sampled_from(seed_graphs)))
    for _ in range(data.draw(st.integers(1, 3))):
        node = graph.nodes[data.draw(st.integers(0, len(graph.nodes) - 1))]
        action = data.draw(
            st.sampled_from(["target", "arg", "op", "dtype", "shape", "drop", "swap", "symbol"])
        )
        if action == "target":
            node.target = data.draw(st.sampled_from(TARGETS))
        elif action == "arg":
            new = data.draw(ARGUMENTS)
            if node.args and data.draw(st.booleans()):
                node.args[data.draw(st.integers(0, len(node.args) - 1))].CopyFrom(new)
            else:
                node.args.append(new)
        elif action == "op":
            node.op = data.draw(st.integers(0, 6))  # type: ignore[assignment]
        elif action == "dtype" and node.HasField("tensor"):
            node.tensor.dtype = data.draw(
                st.sampled_from(["float16", "int64", "bool", "complex64", "qint8"])
            )
        elif action == "shape" and node.HasField("tensor") and node.tensor.shape:
            node.tensor.shape[0].expr = data.draw(
                st.sampled_from(["0", "1", "s2", "2*s2", "Max(2, s2)", "9" * 18])
            )
        elif action == "drop" and len(graph.nodes) > 1:
            del graph.nodes[data.draw(st.integers(0, len(graph.nodes) - 1))]
        elif action == "swap" and len(graph.nodes) > 2:
            i = data.draw(st.integers(0, len(graph.nodes) - 2))
            a, b = graph_pb2.Node(), graph_pb2.Node()
            a.CopyFrom(graph.nodes[i])
            b.CopyFrom(graph.nodes[i + 1])
            graph.nodes[i].CopyFrom(b)
            graph.nodes[i + 1].CopyFrom(a)
        elif action == "symbol" and graph.symbols:
            graph.symbols[0].hint = data.draw(st.integers(0, 2**62))
    _only_graph_errors(graph)


def test_a_constant_decodes_inside_a_fake_mode():
    """A decomposition decodes inside its request's fake mode (workers/aot_seam.py): the
    constant's bytes were viewed as its dtype there, a real tensor in a fake mode, and
    every graph with a tensor constant (torchvision's box coder weights) was decomposed
    a second time."""
    from torchfarm.fx.decode import decode_graph_into
    from torchfarm.fx.internals import resolve

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.tensor([10.0, 10.0, 5.0])  # neither a parameter nor a buffer: a constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weights

    weights = torch.tensor([10.0, 10.0, 5.0])
    gm = torch.fx.symbolic_trace(Scaled())
    graph = encode_graph(gm, [torch.randn(2, 3)])
    assert graph.constants
    mode = resolve("FakeTensorMode")(shape_env=resolve("ShapeEnv")())
    with mode:
        decoded = decode_graph_into(graph, mode, {})
    constant = next(b for name, b in decoded.named_buffers())
    assert not isinstance(constant, resolve("FakeTensor"))
    torch.testing.assert_close(constant, weights)


def test_python_complex_scalars_round_trip():
    """`torch.exp(1j * theta) * 2j` (rotary embeddings written with complex numbers): the
    format had no complex scalar, so the graph was split around every such call."""
    def rotate(theta: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.exp(1j * theta) * complex(0.5, -2.0)).sum(-1)

    capture = roundtrip(rotate, torch.randn(4, 8))
    kinds = {a.WhichOneof("kind") for n in capture.graphs[0].nodes for a in n.args}
    assert "complex_value" in kinds
