"""Tensors a graph reads by get_attr (a compiled optimizer step's parameters and state)
become inputs before the graph goes to the farm (sdk/lifting.py): read and written in
place through the compiled graph, never carried by value."""

from __future__ import annotations

import copy

import torch
from torch import nn

from sdk.lifting import lift_attribute_tensors
from torchfarm.fx.encode import encode_graph
from torchfarm.v1 import graph_pb2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _captured_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> list:
    """Each graph Dynamo hands the backend for `optimizer.step`, run as it stands."""
    seen: list = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(optimizer.step, backend=backend)
    x = torch.randn(4, 8)
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        step()
    torch._dynamo.reset()
    return seen


def test_an_optimizer_steps_parameters_and_state_become_inputs_and_travel_without_values():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    (first, first_inputs), (gm, example_inputs) = _captured_steps(model, optimizer, 2)
    attributes = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(attributes) == 8  # four parameters and their momentum buffers
    before = gm.code

    lifted = lift_attribute_tensors(gm, example_inputs)
    assert lifted is not None
    assert gm.code == before  # Dynamo's graph is left as it was
    assert not [n for n in lifted.gm.graph.nodes if n.op == "get_attr"]
    params = set(map(id, model.parameters()))
    assert sum(id(t) in params for t in lifted.tensors) == 4 and len(lifted.tensors) == 8
    graph = encode_graph(lifted.gm, lifted.example_inputs)
    assert not graph.constants  # no values in the request, nor in its key
    kinds = [n.tensor.kind for n in graph.nodes if n.op == graph_pb2.Node.PLACEHOLDER]
    assert kinds.count(graph_pb2.TensorMeta.PARAMETER) == 4, kinds


def test_the_bound_graph_writes_the_callers_tensors_in_place_as_the_graph_did():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _, (gm, example_inputs) = _captured_steps(model, optimizer, 2)
    lifted = lift_attribute_tensors(gm, example_inputs)
    assert lifted is not None
    grads = example_inputs  # the second step's graph takes the gradients

    want_model, want_state = copy.deepcopy(list(model.parameters())), copy.deepcopy(list(optimizer.state.values()))
    with torch.no_grad():
        gm(*grads)
    want = [p.detach().clone() for p in model.parameters()]
    want_buffers = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    with torch.no_grad():  # back to the state before, then the lifted graph, bound
        for p, saved in zip(model.parameters(), want_model, strict=True):
            p.copy_(saved)
        for state, saved in zip(optimizer.state.values(), want_state, strict=True):
            state["momentum_buffer"].copy_(saved["momentum_buffer"])
        lifted.bind(lifted.gm.forward)(*grads)
    torch.testing.assert_close([p.detach() for p in model.parameters()], want, rtol=0, atol=0)
    torch.testing.assert_close([s["momentum_buffer"] for s in optimizer.state.values()], want_buffers, rtol=0, atol=0)


def test_a_graph_reading_no_attribute_tensor_is_left_alone():
    seen: list = []
    torch._dynamo.reset()
    torch.compile(_model(), backend=lambda gm, ex: (seen.append((gm, ex)), gm.forward)[1])(torch.randn(2, 8))
    torch._dynamo.reset()
    ((gm, example_inputs),) = seen
    assert lift_attribute_tensors(gm, example_inputs) is None


def test_one_tensor_under_two_names_is_one_input():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a, b = g.get_attr("w"), g.get_attr("alias.w")
    g.output((g.call_function(torch.add, (x, g.call_function(torch.mul, (a, b)))),))
    root = nn.Module()
    root.w = nn.Parameter(torch.ones(3))
    root.alias = nn.Module()
    root.alias.w = root.w
    gm = torch.fx.GraphModule(root, g)
    lifted = lift_attribute_tensors(gm, [torch.zeros(3)])
    assert lifted is not None and lifted.tensors == (root.w,)
    assert len(lifted.gm.graph.find_nodes(op="placeholder")) == 2
    torch.testing.assert_close(lifted.bind(lifted.gm.forward)(torch.zeros(3)), gm(torch.zeros(3)))
