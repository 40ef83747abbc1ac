"""`torch.set_default_device` and device contexts in the user's code change neither the
farm's key nor the result: Dynamo bakes the default device into the graph's factory
calls, so the same model gives the same graph (one compile, then hits) and the farm's
outputs and gradients match eager PyTorch under each."""

from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch
from torch import nn

import sdk
from sdk import report
from sdk.report import COMPILED, HIT

pytestmark = [pytest.mark.integration]

WIDTH = 24 + os.getpid() % 16 * 2
"""A key the shared farm has not seen in this run."""


class Positional(nn.Module):
    """Makes tensors in forward (arange, ones, randn-free), where the default device applies."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(-1) / x.shape[0]
        scale = torch.ones(WIDTH, dtype=x.dtype) * 0.5
        q = self.proj(x + pos).view(1, 1, x.shape[0], WIDTH)
        attn = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return attn.flatten(0, 2) * scale


@contextlib.contextmanager
def default_device(how: str):
    if how == "none":
        yield
    elif how == "set_default_device":
        torch.set_default_device("cpu")
        try:
            yield
        finally:
            torch.set_default_device(None)
    else:
        with torch.device("cpu"):
            yield


def test_default_device_gives_the_same_key_and_results(stack, client_cache_dir):
    keys, outcomes = [], []
    x = torch.randn(6, WIDTH, generator=torch.Generator().manual_seed(1))
    for how in ("none", "set_default_device", "device_context"):
        torch._dynamo.reset()
        model = Positional()
        eager = copy.deepcopy(model)
        with default_device(how), report.collect() as graphs:
            out = sdk.compile(model, remote=stack.address, fallback="error")(x)
            out.square().mean().backward()
            ref = eager(x)
            ref.square().mean().backward()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
        (graph,) = graphs
        keys.append(graph.key)
        outcomes.append(graph.outcome)
    assert len(set(keys)) == 1, keys
    assert outcomes == [COMPILED, HIT, HIT], outcomes
