"""Every call the farm allows can be serialized: AOTAutograd bypasses its cache for a
graph with a call it does not take for cacheable, and a bypassed compile serializes no
artifact, so the worker failed the job (`'NoneType' object is not callable`) and the
client compiled locally. `workers.compiler.cacheable_calls` marks those the allow-list
holds; this pins torch's check (`check_node_safe`) against the whole list."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.inductor_prims  # noqa: F401  registers the prims the allow-list names
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe

from tests.graphs import captured_graph
from torchfarm.fx import internals
from torchfarm.fx.decode import resolve_function
from torchfarm.graph import dtensor
from torchfarm.graph.allowlist import load_allowlist
from torchfarm.graph.graph_errors import MalformedGraph
from workers.compiler import cacheable_calls, compile_graph
from workers.fakepg import decoded

PINNED = load_allowlist().torch_version == torch.__version__
"""This torch is the one the allow-list was generated from (not the second build's)."""


def _bypassed(names: list[str]) -> list[str]:
    """Those of `names` AOTAutograd bypasses its cache for; on another torch than the
    allow-list's, those this one lacks are left out."""
    graph = torch.fx.Graph()
    refused = []
    for name in names:
        try:
            target = resolve_function(name)
        except MalformedGraph:
            assert not PINNED, f"{name} does not resolve"
            continue
        try:
            check_node_safe(graph.call_function(target, ()))
        except BypassAOTAutogradCache:
            refused.append(name)
    return refused


def test_every_allowed_function_is_cacheable_for_aotautograd():
    names = sorted(load_allowlist().functions)
    assert len(names) > 5000
    # torch 2.11 bypasses for DTensor.from_local, which its Dynamo records as a closure
    # that the SDK refuses (torchfarm/fx/encode.py): no graph it would bypass is sent.
    expected = [dtensor.FROM_LOCAL] if internals.torch_minor() < (2, 12) else []
    with cacheable_calls():
        assert _bypassed(names) == expected


@pytest.mark.skipif(not PINNED, reason="what torch bypasses is the pinned build's")
def test_without_the_marking_torch_bypasses_some():
    """What the test above would catch: torch 2.13 takes these for uncacheable."""
    refused = _bypassed(sorted(load_allowlist().functions))
    assert {"torch.amp.autocast_mode._enter_autocast", "torch._sym_cos", "torch.ops.higher_order.wrap"} <= set(refused)


@pytest.mark.slow  # a real compile, C++ kernels built
def test_autocast_inside_the_compiled_code_compiles_to_an_artifact():
    """`torch.autocast(..., enabled=False)` inside the frame: a float32 island."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            y = x.float() @ x.float().T
        return y.cos() + x

    try:
        graph = decoded(captured_graph(fn, torch.randn(4, 4, requires_grad=True)))
    finally:
        torch._dynamo.reset()
    result = compile_graph(graph.gm, graph.example_inputs, fake_mode=graph.fake_mode)
    assert result.payload
