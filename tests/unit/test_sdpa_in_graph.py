"""`sdpa_kernel(...)` inside the compiled code: Dynamo puts the backend switch in the
graph (`graphcheck.SDPA_BACKEND` and `SET_SDPA_KERNEL` calls). The format carries it,
the validator checks its arguments, and a worker's SDPA backends are the same after a
job as before, whatever the graph switched them to."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.exc import BackendCompilerFailed
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.graphs import captured_graph
from torchfarm.fx import global_state
from torchfarm.fx.encode import UnsupportedGraph
from torchfarm.graph.allowlist import load_allowlist
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.graphcheck import SDPA_BACKEND, SET_SDPA_KERNEL, validate_graph
from torchfarm.v1 import farm_pb2, graph_pb2
from workers.fakepg import decoded


def _attention(q: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, q, q) * 2


@pytest.fixture(scope="module")
def sdpa_graph() -> graph_pb2.Graph:
    try:
        return captured_graph(_attention, torch.randn(2, 4, 8, 16))
    except BackendCompilerFailed as e:
        if load_allowlist().torch_version == torch.__version__ or not isinstance(e.inner_exception, UnsupportedGraph):
            raise
        pytest.skip(f"this torch's Dynamo records sdpa_kernel otherwise: {e.inner_exception}")
    finally:
        torch._dynamo.reset()


def _copy(graph: graph_pb2.Graph) -> graph_pb2.Graph:
    copy = graph_pb2.Graph()
    copy.CopyFrom(graph)
    return copy


def _calls(graph: graph_pb2.Graph, target: str) -> list[graph_pb2.Node]:
    return [n for n in graph.nodes if n.op == graph_pb2.Node.CALL_FUNCTION and n.target == target]


def test_the_switch_and_its_restore_travel_and_decode(sdpa_graph):
    validate_graph(sdpa_graph)
    switch, restore = _calls(sdpa_graph, SET_SDPA_KERNEL)
    assert len(switch.args[0].list.items) == 1 and len(restore.args[0].list.items) == 5
    assert [n.args[0].str_value for n in _calls(sdpa_graph, SDPA_BACKEND)][0] == "MATH"
    q = torch.randn(2, 4, 8, 16)
    gm = decoded(sdpa_graph).gm
    torch.testing.assert_close(gm(q)[0], _attention(q))
    assert global_state.sdpa_backends_now() == []


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda g: _calls(g, SDPA_BACKEND)[0].args[0].__setattr__("str_value", "ERROR"),
         "'ERROR' is not one torch has"),
        (lambda g: _calls(g, SDPA_BACKEND)[0].args[0].__setattr__("str_value", "__class__"),
         "is not one torch has"),
        (lambda g: _calls(g, SDPA_BACKEND)[0].args.add(bool_value=True), "one constant backend name"),
        (lambda g: _calls(g, SET_SDPA_KERNEL)[0].args[0].list.items[0].__setattr__("node", "l_q_"),
         "distinct .* nodes"),
        (lambda g: _calls(g, SET_SDPA_KERNEL)[1].args[0].list.items.append(
            _calls(g, SET_SDPA_KERNEL)[1].args[0].list.items[0]), "distinct .* nodes"),
        (lambda g: _calls(g, SET_SDPA_KERNEL)[0].args[1].__setattr__("int_value", 1), "a constant flag"),
        (lambda g: _calls(g, SET_SDPA_KERNEL)[0].kwargs.add(name="set_priority").value.__setattr__(
            "bool_value", True), "a constant flag"),
    ],
)
def test_a_malformed_switch_is_refused(sdpa_graph, mutate, match):
    graph = _copy(sdpa_graph)
    mutate(graph)
    with pytest.raises(MalformedGraph, match=match):
        validate_graph(graph)


def test_a_graph_that_never_switches_back_leaves_the_worker_as_it_was(sdpa_graph):
    """A hostile graph turns every backend but MATH off and never restores them: the
    worker decodes it (fake propagation runs the switch), and the next tenant's job on
    that thread must not compile under what it left."""
    graph = _copy(sdpa_graph)
    restore = _calls(graph, SET_SDPA_KERNEL)[1]
    dropped = {restore.name, *(item.node for item in restore.args[0].list.items)}
    kept = [n for n in graph.nodes if n.name not in dropped]
    del graph.nodes[:]
    graph.nodes.extend(kept)
    validate_graph(graph)
    with global_state.applied(farm_pb2.CompileOptions()):
        decoded(graph)
    assert global_state.sdpa_backends_now() == []
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
