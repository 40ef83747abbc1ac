"""A decoded graph is what the worker's compile path needs: the end-to-end proof.

encode (client) -> decode (worker) -> standalone_compile(aot=True) -> serialize ->
deserialize (client) -> one training step, against eager.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.standalone_compile import AOTCompiledArtifact

from examples.models import TINY_GPT, make_gpt
from torchfarm.fx.decode import decode_graph
from torchfarm.fx.encode import encode_graph
from torchfarm.v1 import graph_pb2


@pytest.mark.slow
def test_tiny_gpt_training_through_standalone_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    model, inputs = make_gpt(TINY_GPT, batch=2)
    model.train()
    captured: list[tuple[graph_pb2.Graph, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        captured.append((encode_graph(gm, example_inputs), list(example_inputs)))
        return gm.forward

    torch.compile(model, backend=backend)(*inputs)
    ((wire, client_inputs),) = captured

    # The worker sees only bytes.
    decoded = decode_graph(graph_pb2.Graph.FromString(wire.SerializeToString(deterministic=True)))
    artifact = torch._inductor.standalone_compile(
        decoded.gm,
        decoded.example_inputs,
        dynamic_shapes="from_example_inputs",
        aot=True,
        fake_mode=decoded.fake_mode,
    )
    aot = dict(counters["aot_autograd"])
    assert aot.get("autograd_cache_bypass", 0) == 0 and aot.get("autograd_cache_saved", 0) == 1, aot
    loaded = AOTCompiledArtifact.deserialize(artifact.serialize())

    # Run on the client's real inputs: its Parameters, so gradients land on them.
    model.zero_grad()
    (loss,) = loaded(*client_inputs)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    expected = model(*inputs)
    expected.backward()

    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=False):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()
