"""`torch.func` transforms inside the compiled code, on the farm, with the shared session
stack: per-sample gradients (`vmap` over `grad`, as differential privacy and influence
functions take them), a gradient penalty trained through (`grad` inside the loss, then
the loss's own backward), and a Jacobian (`jacrev`). Each runs through
`sdk.compile(..., fallback="error")`, so a graph the farm refused would raise, and is
compared with eager."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap

import sdk
from sdk import report

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

TOLERANCE = 1e-5


def _on_the_farm(fn, *args, stack):
    torch._dynamo.reset()
    try:
        with report.collect() as graphs:
            out = sdk.compile(fn, remote=stack.address, fallback="error")(*args)
    finally:
        torch._dynamo.reset()
    assert graphs and all(g.outcome != report.LOCAL for g in graphs), graphs
    return out


def _close(got, want) -> None:
    assert (got - want).abs().max().item() <= TOLERANCE * max(1.0, want.abs().max().item())


def test_per_sample_gradients(stack, client_cache_dir):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))

    def loss(p, xi, yi):
        logits = functional_call(model, p, (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, yi.unsqueeze(0))

    def per_sample(p, x, y):
        return vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y)

    want = per_sample(params, x, y)
    got = _on_the_farm(per_sample, params, x, y, stack=stack)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == (5, *params[name].shape)
        _close(got[name], want[name])


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Softplus(), nn.Linear(16, 1))

    def forward(self, x):
        """A WGAN-GP critic's loss: the score, plus the penalty on its input gradient."""
        score = lambda t: self.net(t).sum()  # noqa: E731
        penalty = (grad(score)(x).norm(dim=1) - 1).pow(2).mean()
        return -self.net(x).mean() + 10 * penalty


def test_a_gradient_penalty_trains(stack, client_cache_dir):
    torch.manual_seed(0)
    model, x = Critic(), torch.randn(8, 4)
    eager = copy.deepcopy(model)
    want = eager(x)
    want.backward()
    got = _on_the_farm(model, x, stack=stack)
    got.backward()
    _close(got.detach(), want.detach())
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        _close(p.grad, q.grad)


def test_a_jacobian(stack, client_cache_dir):
    torch.manual_seed(0)
    w = torch.randn(3, 3)

    def f(x):
        return jacrev(lambda t: torch.tanh(w @ t).pow(2))(x)

    x = torch.randn(3)
    _close(_on_the_farm(f, x, stack=stack), f(x))
