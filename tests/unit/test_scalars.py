"""Float inputs under dynamic=True are specialized before a graph is encoded (sdk/scalars.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sdk.scalars import fold_numpy_constants, specialize_float_inputs, tensorified_floats
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


class _SinusoidalScale(torch.nn.Module):
    """PegasusX's sinusoidal embedding: numpy on constants, which Dynamo traces into the
    graph as numpy calls."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = -(np.log(float(10000)) / (4 - 1))
        return x * torch.exp(torch.arange(4, dtype=x.dtype) * scale)


class _NumpyIndexArithmetic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = np.int64(x.shape[1]) // 2 - 1
        return x[:, : int(n)] * 2 + np.float32(0.5)


@pytest.mark.parametrize("model", [_SinusoidalScale(), _NumpyIndexArithmetic()], ids=type)
def test_numpy_on_constants_is_computed_here_and_the_graph_encodes(model: torch.nn.Module) -> None:
    # The farm's format refuses numpy calls: such graphs were split at them.
    encoded = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fold_numpy_constants(gm)
        encoded.append(encode_graph(gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(2, 4, dtype=torch.float64)
    out = torch.compile(model, backend=backend)(x)
    torch._dynamo.reset()
    assert encoded
    assert out.dtype == model(x).dtype and torch.equal(out, model(x))


def test_a_numpy_random_draw_is_never_folded() -> None:
    # With use_numpy_random_stream off (the default), np.random traces into the graph on
    # constants alone: folded, every call would return the first draw.
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fold_numpy_constants(gm)
        graphs.append(gm)
        return gm.forward

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + torch.as_tensor(np.random.randn(2).sum() * 2.0)

    torch._dynamo.reset()
    fn = torch.compile(noisy, backend=backend)
    x = torch.zeros(3, dtype=torch.float64)
    assert not torch.equal(fn(x), fn(x))
    torch._dynamo.reset()
    assert len(graphs) == 1
