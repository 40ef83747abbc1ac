"""The decomposition stage's torch half (workers/aot_seam.py), without servers: a graph
decomposed in one place and lowered from the stored graphs in another gives the
artifact a compile that decomposed in place gives, and numerics that match eager.

The graphs go through the graph format and the record's bytes, as between two jobs;
each compile runs in its own fresh Inductor cache, so no step can hit AOTAutograd's
cache of an earlier one. Numerics against eager: outputs within rtol=1e-5, atol=1e-6
(tests/unit/test_compiler_loader.py), gradients within 1e-4 absolute or relative
(tests/integration/test_end_to_end.py: batch norm's reductions reassociate).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import pytest
import torch

from examples.models import make_cnn, make_mlp
from torchfarm.fx import internals
from torchfarm.fx.cpp_kernels import kernel_name
from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import encode_graph
from workers.aot_seam import (
    _SAVED_META,
    INFERENCE,
    JOINT,
    Decomposition,
    NotDecomposable,
    decompose_graph,
    using_decomposition,
)
from workers.compiler import lower_graph

pytestmark = pytest.mark.timeout(120)

RTOL, ATOL = 1e-5, 1e-6
GRAD_TOL = 1e-4


# ---- torch internals (torch 2.13.0) -------------------------------------------------


def test_internals_the_seams_stand_in_for():
    from torch._functorch._aot_autograd import graph_compile
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta

    def params(fn):
        return list(inspect.signature(fn).parameters)

    assert params(graph_compile.aot_dispatch_autograd_graph) == [
        "flat_fn", "flat_args", "flat_args_descs", "aot_config", "fw_metadata",
    ]
    assert params(graph_compile.aot_dispatch_base_graph) == [
        "flat_fn", "flat_args", "flat_args_descs", "aot_config", "fw_metadata",
    ]
    # 2.13 passes a partition_fn, 2.12 none (torchfarm/fx/internals.py's SEAM).
    partition = internals.internal("aot_stage2a_partition")
    assert partition is not None
    assert params(graph_compile._aot_stage2a_partition) == list(partition.params)
    # Called by module-global name, so replacing the module attribute reaches them.
    stage1 = inspect.getsource(graph_compile.aot_stage1_graph_capture)
    assert "= aot_dispatch_autograd_graph(" in stage1 and "aot_dispatch_base_graph(" in stage1
    assert "= _aot_stage2a_partition(" in inspect.getsource(graph_compile.aot_stage2_autograd)
    # Inductor propagates fake values through a graph before its passes read them, so
    # a partitioned graph's decoded interior needs none (`propagate=False`).
    from torch._inductor import compile_fx

    codegen = inspect.getsource(compile_fx._InProcessFxCompile.codegen_and_compile)
    assert codegen.index("fake_tensor_prop(gm, example_inputs") < codegen.index("post_grad_passes")
    # Attributes of the runtime metadata, fields or set in __post_init__.
    source = inspect.getsource(ViewAndMutationMeta)
    fields = {f.name for f in dataclasses.fields(ViewAndMutationMeta)}
    for name in _SAVED_META:
        assert name in fields or f"self.{name}" in source, name


# ---- decompose here, lower there ----------------------------------------------------


def _captured(model, inputs, *, dynamic=False):
    """The request graph a client would send for one call of `model`."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(encode_graph(gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, dynamic=dynamic or None)(*inputs)
    return graphs[0]


@pytest.fixture
def fresh(tmp_path):
    """`fresh(name)`: a context with an Inductor cache of its own."""
    from torch._inductor.utils import fresh_cache

    def enter(name: str):
        path = tmp_path / name
        path.mkdir()
        return fresh_cache(dir=str(path))

    return enter


def _lower(graph, dec=None, *, dynamic=False):
    decoded = decode_graph(graph)
    used: list[str] = []
    seam = using_decomposition(dec, decoded, used) if dec is not None else None
    lowered = lower_graph(
        decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode, dynamic=dynamic,
        aot_seam=seam,
    )
    return lowered, used


def _through_bytes(dec: Decomposition) -> Decomposition:
    return Decomposition.from_fields({k.encode(): v for k, v in dec.to_fields().items()})


def _run_artifact(payload: bytes, model, inputs, *, dynamic=False):
    """One call (and backward) of `model` through the artifact, against eager."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    compiled = copy.deepcopy(model)

    def backend(gm, example_inputs):
        return AOTCompiledArtifact.deserialize(payload)

    torch._dynamo.reset()
    got = torch.compile(compiled, backend=backend, dynamic=dynamic or None)(*inputs)
    want = model(*inputs)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    if want.requires_grad:
        got.sum().backward()
        want.sum().backward()
        for (name, a), b in zip(compiled.named_parameters(), model.parameters(), strict=False):
            torch.testing.assert_close(
                a.grad, b.grad, rtol=GRAD_TOL, atol=GRAD_TOL, msg=lambda m, n=name: f"{n}: {m}"
            )


@pytest.mark.slow
@pytest.mark.parametrize("make", [make_mlp, make_cnn], ids=["mlp", "cnn"])
def test_a_graph_lowered_from_its_stored_decomposition_is_the_same_compile(make, fresh):
    model, inputs = make()
    graph = _captured(model, inputs)
    with fresh("inline"):
        inline, _ = _lower(graph)
    with fresh("decompose"):
        dec = decompose_graph(decode_graph(graph))
    assert dec.kind == JOINT and dec.backward is not None
    assert dec.partition["num_fw_outs_saved_for_bw"] > 0
    with fresh("lower"):
        split, used = _lower(graph, _through_bytes(dec))
    assert used == ["capture", "partition"], "the lowering traced its own graphs"
    # Byte-identical kernel sources (a kernel's name is its source's digest).
    assert [kernel_name(s) for s in split.specs] == [kernel_name(s) for s in inline.specs]
    with fresh("run"):
        _run_artifact(split.payload, model, inputs)


@pytest.mark.slow
def test_an_inference_graph_is_decomposed_apart_too(fresh):
    model, (x,) = make_mlp(batch=4)
    model.requires_grad_(False)
    graph = _captured(model, (x,))
    with fresh("decompose"):
        dec = decompose_graph(decode_graph(graph))
    assert dec.kind == INFERENCE and dec.backward is None
    with fresh("lower"):
        lowered, used = _lower(graph, _through_bytes(dec))
    assert used == ["base"]
    with fresh("run"):
        _run_artifact(lowered.payload, model, (x,))


@pytest.mark.slow
def test_a_dynamic_graph_decomposes_over_the_clients_symbols(fresh):
    model, (x,) = make_mlp(batch=6)
    graph = _captured(model, (x,), dynamic=True)
    client_symbols = {s.name for s in graph.symbols}
    assert client_symbols
    with fresh("decompose"):
        dec = decompose_graph(decode_graph(graph), dynamic=True)
    assert dec.symbols and set(dec.symbols.values()) <= client_symbols
    with fresh("lower"):
        lowered, used = _lower(graph, _through_bytes(dec), dynamic=True)
    assert used == ["capture", "partition"]
    with fresh("run"):
        _run_artifact(lowered.payload, model, (x,), dynamic=True)


@pytest.mark.slow
def test_a_decomposition_that_does_not_fit_says_so(fresh):
    model, (x,) = make_mlp(batch=4)
    graph = _captured(model, (x,))
    with fresh("decompose"):
        dec = decompose_graph(decode_graph(graph))
    # Decomposed for training, lowered for inference: the seam refuses, and the
    # refusal comes out of lower_graph as itself, not as a compile failure.
    frozen = copy.deepcopy(model).requires_grad_(False)
    inference = _captured(frozen, (x,))
    with fresh("lower"), pytest.raises(NotDecomposable, match="decomposed for training"):
        _lower(inference, dec)
    # A decomposition over a symbol the request does not have.
    stray = copy.deepcopy(dec)
    stray.symbols = {"s0": "not_a_client_symbol"}
    with pytest.raises(NotDecomposable, match="no symbols"):
        _lower(graph, stray)


def test_a_record_that_does_not_parse_is_not_decomposable():
    with pytest.raises(NotDecomposable, match="does not parse"):
        Decomposition.from_fields({b"head": b"{not json"})
    with pytest.raises(NotDecomposable, match="does not parse"):
        Decomposition.from_fields({b"forward": b""})
    identity = encode_graph(torch.fx.symbolic_trace(torch.nn.Identity()), [torch.ones(1)])
    no_backward = Decomposition(JOINT, identity)
    with pytest.raises(NotDecomposable, match="inconsistent"):
        _through_bytes(no_backward)
    assert _through_bytes(Decomposition(INFERENCE, identity)).forward == identity

