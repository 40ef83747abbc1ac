"""Graphs as Dynamo captures them and the SDK encodes them, for tests that need real ones
(tests/requests.py builds requests by hand, without torch)."""

from __future__ import annotations

import torch

from torchfarm.fx.encode import encode_graph
from torchfarm.v1 import graph_pb2


def captured_graph(fn, *inputs) -> graph_pb2.Graph:
    """The one graph `fn(*inputs)` compiles to (fullgraph), encoded; Dynamo reset around it."""
    graphs: list[graph_pb2.Graph] = []

    def backend(gm, example_inputs):
        graphs.append(encode_graph(gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    (graph,) = graphs
    return graph
