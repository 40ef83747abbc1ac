"""`torch.set_default_device` and device contexts in the user's code, on the farm.

Measured on torch 2.13: under a default device (a `DeviceContext` torch-function mode)
Dynamo records `x + y` as the method `add` instead of `_operator.add` (and so on for
the other operators), so its graph, and the key, differ from the same model's without a
default device; a local `torch.compile` sees the same other graph. What must hold, and
is checked here: the farm's outputs and gradients match eager PyTorch in each case, and
`torch.set_default_device("cpu")` and a `with torch.device("cpu")` block give the same
graph and key (the second is a hit).
"""

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
    plain, set_default, context = keys
    assert set_default == context, keys
    assert outcomes[1:] == [COMPILED, HIT], outcomes
    assert outcomes[0] == (HIT if plain == set_default else COMPILED), outcomes
