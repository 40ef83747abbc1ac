"""A graph split at the calls the farm refuses (sdk/split.py), on graphs Dynamo
captures: which calls are refused, which pieces are sent, what each piece's inputs
are, and that the pieces in order compute what the graph did, gradients included."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

from sdk.split import NotSplit, split_refused
from torchfarm.fx.encode import encode_graph, refused_calls
from torchfarm.v1 import graph_pb2


class _Reseeds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.register_buffer("shift", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        torch.seed()
        return self.b(h) + self.shift


class _SeedsInCheckpoint(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        torch.seed()
        return torch.relu(self.a(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint.checkpoint(self.body, x, use_reentrant=False).sum()


def capture(model: nn.Module, x: torch.Tensor, **kwargs) -> tuple[torch.fx.GraphModule, list]:
    seen: list = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True, **kwargs)(x)
    torch._dynamo.reset()
    assert len(seen) == 1
    return seen[0]


def _run_pieces_uncompiled(split) -> None:
    """Each piece's own graph in its place: what a compiled piece returns (a tuple)."""
    for piece in split.pieces:
        split.install(piece, piece.gm.forward)


def _outputs_and_grads(fn, model: nn.Module, inputs: list) -> tuple[list, list]:
    model.zero_grad()
    out = [o for o in fn(*inputs) if isinstance(o, torch.Tensor)]
    sum(o.sum() for o in out).backward()
    return [o.detach() for o in out], [p.grad.clone() for p in model.parameters()]


def test_a_graph_the_farm_takes_whole_is_not_split():
    gm, inputs = capture(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8))
    assert refused_calls(gm) == {}
    assert split_refused(gm, inputs) is None


def test_pieces_around_a_refused_call_compute_what_the_graph_did():
    model = _Reseeds()
    gm, inputs = capture(model, torch.randn(3, 8))
    split = split_refused(gm, inputs)
    assert split is not None
    assert list(split.refused) == ["seed"]
    assert "torch.random.seed" in split.refused["seed"] and "random number generator" in split.refused["seed"]
    assert len(split.pieces) == 2
    for piece in split.pieces:
        encode_graph(piece.gm, piece.example_inputs)  # each piece is a graph the farm takes
        assert refused_calls(piece.gm) == {}
    _run_pieces_uncompiled(split)
    want = _outputs_and_grads(gm, model, inputs)
    got = _outputs_and_grads(split.root, model, inputs)
    torch.testing.assert_close(got, want)


def test_a_piece_takes_the_graphs_own_inputs_and_the_values_made_before_it():
    model = _Reseeds()
    gm, inputs = capture(model, torch.randn(3, 8))
    split = split_refused(gm, inputs)
    assert split is not None
    second = split.pieces[1]
    by_name = {p.name: v for p, v in zip(gm.graph.find_nodes(op="placeholder"), inputs, strict=True)}
    for node, value in zip(second.gm.graph.find_nodes(op="placeholder"), second.example_inputs, strict=True):
        if node.name in by_name:
            assert value is by_name[node.name]  # the real input Dynamo gave, a Parameter stays one
        else:
            assert node.name == "h" and value.shape == (3, 16) and value.requires_grad
    kinds = {n.name: n.tensor.kind for n in encode_graph(second.gm, second.example_inputs).nodes
             if n.op == graph_pb2.Node.PLACEHOLDER}
    assert kinds["l_self_buffers_shift_"] == graph_pb2.TensorMeta.BUFFER, kinds
    assert kinds["h"] == graph_pb2.TensorMeta.INPUT, kinds


def test_a_refused_call_inside_a_body_refuses_the_call_that_takes_the_body():
    model = _SeedsInCheckpoint()
    gm, inputs = capture(model, torch.randn(4, 8, requires_grad=True))
    refused = refused_calls(gm)
    assert [n.name for n in refused] == ["tag_activation_checkpoint"]
    assert "torch.random.seed" in next(iter(refused.values()))
    split = split_refused(gm, inputs)
    assert split is not None
    assert len(split.pieces) == 1  # the sum; the getitem alone is not worth a round trip
    _run_pieces_uncompiled(split)
    torch.testing.assert_close(_outputs_and_grads(split.root, model, inputs),
                               _outputs_and_grads(gm, model, inputs))


def test_dynamic_sizes_reach_the_pieces_that_need_them():
    model = _Reseeds()
    gm, inputs = capture(model, torch.randn(5, 8), dynamic=True)
    split = split_refused(gm, inputs)
    assert split is not None
    for piece in split.pieces:
        graph = encode_graph(piece.gm, piece.example_inputs)
        assert [s.hint for s in graph.symbols] == [5], graph.symbols
    _run_pieces_uncompiled(split)
    torch.testing.assert_close(_outputs_and_grads(split.root, model, inputs),
                               _outputs_and_grads(gm, model, inputs))


class _ReseedsUnderAutocast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(self.a(x))
            torch.seed()
            y = self.b(h)
        return y.float().sum()


def test_an_autocast_region_is_entered_again_in_each_piece():
    """split_module enters the region again at a later piece's start, before its
    placeholders: the piece takes its inputs first, so the format (and FX) take it."""
    model = _ReseedsUnderAutocast()
    gm, inputs = capture(model, torch.randn(4, 8))
    split = split_refused(gm, inputs)
    assert split is not None and len(split.pieces) == 2
    for piece in split.pieces:
        ops = [n.op for n in piece.gm.graph.nodes]
        assert ops[: ops.count("placeholder")] == ["placeholder"] * ops.count("placeholder")
        encoded = encode_graph(piece.gm, piece.example_inputs)
        assert any(n.target.endswith("_enter_autocast") for n in encoded.nodes)
    _run_pieces_uncompiled(split)
    torch.testing.assert_close(_outputs_and_grads(split.root, model, inputs),
                               _outputs_and_grads(gm, model, inputs))


def test_pieces_compiled_by_inductor_in_the_backend_match_eager():
    """What a piece's local fallback does: Inductor compiles it inside Dynamo's backend
    call, from the real inputs and the fake values of what ran before it."""
    from torchfarm.fx.internals import resolve

    def backend(gm, example_inputs):
        split = split_refused(gm, example_inputs)
        assert split is not None
        for piece in split.pieces:
            split.install(piece, resolve("TorchCompileInductorWrapper")(None, None, None)(piece.gm, piece.example_inputs))
        return split.root

    model = _Reseeds()
    x = torch.randn(3, 8)
    torch._dynamo.reset()
    got = _outputs_and_grads(lambda x: (torch.compile(model, backend=backend)(x),), model, [x])
    torch._dynamo.reset()
    want = _outputs_and_grads(lambda x: (model(x),), model, [x])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_size_arithmetic_alone_is_no_piece_and_its_result_reaches_the_next():
    """`n = x.shape[0] * 2` before the refused call: that piece computes no tensor, so
    it runs eagerly; the piece after it takes `n` as a size and serves every size."""
    from torchfarm.fx.internals import resolve

    def fn(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] * 2
        torch.seed()
        return x.new_zeros(n) + x.sum()

    sent = []

    def backend(gm, example_inputs):
        split = split_refused(gm, example_inputs)
        assert split is not None
        for piece in split.pieces:
            sent.append(encode_graph(piece.gm, piece.example_inputs))
            split.install(piece, resolve("TorchCompileInductorWrapper")(None, None, None)(piece.gm, piece.example_inputs))
        return split.root

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for rows in (3, 5):
        x = torch.randn(rows)
        torch.testing.assert_close(compiled(x), fn(x))
    torch._dynamo.reset()
    (piece,) = sent  # compiled once, dynamic: one size symbol
    assert len(piece.symbols) == 1, piece.symbols


@torch.library.custom_op("tf_split_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


_scaled.register_fake(lambda x: torch.empty_like(x))
_scaled.register_autograd(lambda ctx, grad: grad * 3)


class _CallsOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.ops.tf_split_test.scaled(self.a(x))).sum()


def test_an_op_the_farm_refused_by_name_is_split_at():
    """The farm's refusal of a custom op (its backward is the client's Python) names it;
    the graph is split at its calls alone, the format's refusals not asked again."""
    from torchfarm.graph.customops import RefusedCustomOp, refused_op

    model = _CallsOp()
    gm, inputs = capture(model, torch.randn(4, 8))
    assert refused_calls(gm) == {}  # the format takes it
    message = "RuntimeError: " + str(RefusedCustomOp("torch.ops.tf_split_test.scaled.default", "needs its backward"))
    named = refused_op(message + "\n\nSet TORCHDYNAMO_VERBOSE=1")
    assert named == ("torch.ops.tf_split_test.scaled.default",
                     "custom op torch.ops.tf_split_test.scaled.default needs its backward")
    assert refused_op("custom ops are fine") is None
    split = split_refused(gm, inputs, dict([named]))
    assert split is not None
    assert list(split.refused.values()) == [named[1]]
    assert len(split.pieces) == 2
    _run_pieces_uncompiled(split)
    torch.testing.assert_close(_outputs_and_grads(split.root, model, inputs),
                               _outputs_and_grads(gm, model, inputs))
    assert split_refused(gm, inputs, {"torch.ops.tf_split_test.other.default": "no"}) is None


@torch.library.custom_op("tf_split_test::halves", mutates_args=())
def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 0.5, x * 2


_halves.register_fake(lambda x: (torch.empty_like(x), torch.empty_like(x)))
_halves.register_autograd(lambda ctx, low, high: low * 0.5 + high * 2)


class _UnpacksAPair(nn.Module):
    """Uses a refused call's two outputs apart, a call between: Dynamo's getitems of its
    tuple stand among the nodes that use them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pair = torch.ops.tf_split_test.halves(self.a(x))
        h = torch.relu(self.b(pair[1]))
        return (h * pair[0]).sum()


def test_a_refused_calls_tuple_is_unpacked_beside_it_so_each_piece_takes_tensors():
    """Found on torch.scan (a refused higher-order op returning a carry and its outputs):
    the piece after it took the tuple as an input, which the format refuses, and the
    piece compiled locally."""
    model = _UnpacksAPair()
    gm, inputs = capture(model, torch.randn(4, 8))
    split = split_refused(gm, inputs, {"torch.ops.tf_split_test.halves.default": "refused here"})
    assert split is not None
    assert len(split.pieces) == 2
    for piece in split.pieces:
        assert all(isinstance(v, torch.Tensor) for v in piece.example_inputs), piece.example_inputs
        encode_graph(piece.gm, piece.example_inputs)  # the farm takes each piece
    _run_pieces_uncompiled(split)
    torch.testing.assert_close(_outputs_and_grads(split.root, model, inputs),
                               _outputs_and_grads(gm, model, inputs))


def test_a_graph_inside_a_functorch_transform_is_not_split():
    """`torch.func.grad` in the graph is on the farm; an op the farm refuses inside it
    (here the linear, as a custom op's backward would be) is not split off: split there,
    the pieces ran inside the transform's level, where AOTAutograd's compiled function
    raised (vmap's batched tensors failed to compile). Whole, it compiles locally, as
    torch.compile would."""
    model = nn.Linear(8, 2)
    params = dict(model.named_parameters())

    def loss(p: dict, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x,)).pow(2).mean()

    seen: list = []
    torch._dynamo.reset()
    torch.compile(torch.func.grad(loss), backend=lambda gm, ex: (seen.append((gm, ex)), gm.forward)[1])(
        params, torch.randn(4, 8))
    torch._dynamo.reset()
    ((gm, inputs),) = seen
    assert not refused_calls(gm)
    with pytest.raises(NotSplit, match="functorch transform.*_grad_increment_nesting"):
        split_refused(gm, inputs, {"torch._C._nn.linear": "refused by the farm"})


def test_a_graph_inside_a_dual_level_is_not_split():
    """`torch.autograd.forward_ad` in the graph is on the farm; split around a refused op,
    the pieces would take dual tensors, whose tangents no compiled piece carries. Torch
    2.11 and 2.12 name the dual level's calls outside functorch (`torch._C._enter_dual_level`)."""
    from torch.autograd import forward_ad

    linear = nn.Linear(4, 2)

    def f(x: torch.Tensor) -> torch.Tensor:
        with forward_ad.dual_level():
            y = linear(forward_ad.make_dual(x, torch.ones_like(x)))
            return forward_ad.unpack_dual(y).tangent

    seen: list = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: (seen.append((gm, ex)), gm.forward)[1])(torch.randn(3, 4))
    torch._dynamo.reset()
    ((gm, inputs),) = seen
    assert not refused_calls(gm)
    with pytest.raises(NotSplit, match="functorch transform.*_enter_dual_level"):
        split_refused(gm, inputs, {"torch._C._nn.linear": "refused by the farm"})


class _ClampsThroughData(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a.weight.data.clamp_(-0.2, 0.2)
        return self.a(x)


def test_a_piece_writing_inputs_that_share_memory_is_not_split():
    """`w.data.clamp_()` then `linear(x, w)`, with `.data` refused (the farm takes it
    now; here it is refused as the farm refuses an op once it has the graph): `.data`
    runs eagerly, so the piece after takes the data tensor and the weight, one memory,
    and writes the first. Compiled as apart, locally too, its linear read the weight
    unclamped: the first step's output was off by 0.46. Whole, the graph is right."""
    model = _ClampsThroughData()
    gm, inputs = capture(model, torch.randn(3, 8))
    assert not refused_calls(gm)
    with pytest.raises(NotSplit, match="share memory"):
        split_refused(gm, inputs, ops={"torch._C._autograd._get_data_attr": "refused by this test"})


def test_a_bare_triton_kernel_call_runs_between_the_pieces():
    """The graph Dynamo captures on a GPU for a @triton.jit call: the call is refused
    (a user's kernel source), the empty_like before it is the one piece sent."""
    from tests.integration.test_gpu_features import _bare_triton_call_graph

    gm, inputs = _bare_triton_call_graph()
    split = split_refused(gm, inputs)
    assert split is not None
    (why,) = split.refused.values()
    assert "runs a user's Triton kernel source" in why
    (piece,) = split.pieces
    calls = [n.target for n in piece.gm.graph.nodes if n.op == "call_function"]
    assert calls == [torch.empty_like]


def test_a_split_that_fails_leaves_the_graph_to_compile_whole(monkeypatch, caplog, tmp_path):
    """A split is an optimization: a bug in it costs the split, never the compile."""
    import logging

    from localfarm.fakes import InProcessFarm
    from sdk import split as split_module
    from sdk.backend import FarmBackend

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the split")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(split_module, "split_refused", broken)
    caplog.set_level(logging.INFO, logger="sdk")
    farm = InProcessFarm()
    model, x = _Reseeds(), torch.randn(3, 8)
    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend=FarmBackend(farm.sdk_settings(), client=farm.client()))(x)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, model(x))
    lines = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    assert any("splitting it at its refused calls failed" in line for line in lines), lines
    assert any("compiled locally in" in line and "torch.random.seed" in line for line in lines), lines
