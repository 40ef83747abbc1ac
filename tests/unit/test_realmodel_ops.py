"""Every op the real-model suite's graphs call is on the allow-list (issue 18, item 3).

Captures each model of tests/realmodels/zoo.py with Dynamo, training step included, and
encodes and decodes every graph, without compiling: a target off the allow-list fails
here in seconds rather than as a local fallback in the slow suite.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from sdk.scalars import specialize_float_inputs  # noqa: E402
from tests.realmodels.zoo import ARCHITECTURES, KNOWN_GAPS  # noqa: E402
from torchfarm.fx.decode import decode_graph  # noqa: E402
from torchfarm.fx.encode import UnsupportedGraph, encode_graph  # noqa: E402
from torchfarm.fx.torch_library import use_installed  # noqa: E402
from torchfarm.graph.customops import DEFAULT_INSTALLED_OP_MODULES  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[a.name for a in ARCHITECTURES])
def test_every_graph_of_the_model_encodes_and_decodes(arch) -> None:
    problems: list[str] = []
    graphs = 0

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        nonlocal graphs
        specialize_float_inputs(gm)
        graphs += 1
        try:
            decode_graph(encode_graph(gm, example_inputs))
        except UnsupportedGraph as e:
            problems.append(str(e))
        return gm.forward

    # As a worker with no setting loads them: this process's transformers ops are the
    # installed package's, not a client's.
    use_installed(DEFAULT_INSTALLED_OP_MODULES)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs = arch.build()
    model.train()
    try:
        torch.compile(model, backend=backend)(**inputs).loss.backward()
    finally:
        torch._dynamo.reset()
    assert graphs > 0
    gap = KNOWN_GAPS.get(arch.name)
    if gap is None:
        assert problems == []
    else:
        assert problems and all(gap in p for p in problems), problems
