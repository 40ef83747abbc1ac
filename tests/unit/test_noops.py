"""Calls that do not change a graph's result are left out of what the SDK sends (torchfarm/fx/noops.py)."""

from __future__ import annotations

import torch
import torch.fx

from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import encode_graph
from torchfarm.fx.noops import droppable_nodes


def _graph(build) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A graph as Dynamo makes it: `build(graph, x)` adds the body and returns the output."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((build(graph, x),))
    example = torch.randn(2, 3)
    x.meta["example_value"] = example
    return torch.fx.GraphModule(torch.nn.Module(), graph), [example]


def _api_logging(graph, x):
    graph.call_function(torch._C._log_api_usage_once, ("python.nn_module",))
    return graph.call_method("sin", (x,))


def _profiled(graph, x):
    handle = graph.call_function(
        torch.ops.profiler._record_function_enter_new.default, ("block", None)
    )
    y = graph.call_method("cos", (x,))
    graph.call_function(torch.ops.profiler._record_function_exit._RecordFunction, (handle,))
    return y


def test_api_usage_logging_is_dropped() -> None:
    gm, inputs = _graph(_api_logging)
    assert len(droppable_nodes(gm)) == 1
    wire = encode_graph(gm, inputs)
    assert not any("log_api_usage" in n.target for n in wire.nodes)
    decoded = decode_graph(wire)
    torch.testing.assert_close(decoded.gm(*inputs)[0], inputs[0].sin())


def test_a_profiler_range_is_dropped_with_its_exit() -> None:
    gm, inputs = _graph(_profiled)
    assert len(droppable_nodes(gm)) == 2
    wire = encode_graph(gm, inputs)
    assert not any("profiler" in n.target for n in wire.nodes)
    assert [n.target for n in wire.nodes if n.op == n.CALL_METHOD] == ["cos"]


def test_a_used_result_is_kept() -> None:
    def logged_and_returned(graph, x):
        return graph.call_function(torch._C._log_api_usage_once, ("python.nn_module",))

    gm, _ = _graph(logged_and_returned)
    assert droppable_nodes(gm) == set()
