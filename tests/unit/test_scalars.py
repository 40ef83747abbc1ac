"""Float inputs under dynamic=True are specialized before a graph is encoded (sdk/scalars.py)."""

from __future__ import annotations

from typing import Any

import torch

from sdk.scalars import specialize_float_inputs, tensorified_floats
from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import encode_graph


def _layer_norm_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def test_eps_is_specialized_and_the_graph_decodes() -> None:
    seen: list[list[str]] = []
    decoded = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append(tensorified_floats(gm))
        specialize_float_inputs(gm)
        decoded.append(decode_graph(encode_graph(gm, example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    model = _layer_norm_model()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch in (4, 7, 16, 33):
        torch.testing.assert_close(compiled(torch.ones(batch, 8)), model(torch.ones(batch, 8)))
    torch._dynamo.reset()
    # First trace: eps as a tensorified float; the restart traces it as a constant.
    assert len(seen) == 2 and len(seen[0]) == 1 and seen[1] == []
    assert len(decoded) == 1
    norms = [n for n in decoded[0].gm.graph.nodes if "layer_norm" in str(n.target)]
    assert len(norms) == 1 and norms[0].args[-1] == 1e-5


def test_graph_without_float_inputs_is_left_alone() -> None:
    calls = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        specialize_float_inputs(gm)
        calls.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.ones(3))
    torch._dynamo.reset()
    assert len(calls) == 1
