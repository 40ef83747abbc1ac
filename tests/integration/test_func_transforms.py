"""`torch.func` transforms inside the compiled code, on the farm, with the shared session
stack: per-sample gradients (`vmap` over `grad`, as differential privacy and influence
functions take them), a gradient penalty trained through (`grad` inside the loss, then
the loss's own backward), Jacobians (`jacrev`, and forward mode's `jacfwd`), a
Jacobian-vector product (`jvp`, and `torch.autograd.forward_ad`'s dual tensors), and a
physics-informed loss trained through (`jvp` and `hessian` of the network in its
inputs). Each runs through `sdk.compile(..., fallback="error")`, so a graph the farm
refused would raise, and is compared with eager."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.autograd import forward_ad
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vmap

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


def test_a_jacobian_vector_product(stack, client_cache_dir):
    torch.manual_seed(0)
    w = torch.randn(3, 3)

    def f(x, v):
        return jvp(lambda t: torch.tanh(w @ t).pow(2), (x,), (v,))

    x, v = torch.randn(3), torch.randn(3)
    got, want = _on_the_farm(f, x, v, stack=stack), f(x, v)
    for g, e in zip(got, want, strict=True):
        _close(g, e)


def test_a_dual_tensor(stack, client_cache_dir):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def f(x, v):
        with forward_ad.dual_level():
            out = forward_ad.unpack_dual(model(forward_ad.make_dual(x, v)))
            return out.primal, out.tangent

    x, v = torch.randn(5, 4), torch.randn(5, 4)
    got, want = _on_the_farm(f, x, v, stack=stack), f(x, v)
    for g, e in zip(got, want, strict=True):
        _close(g, e)


def test_a_forward_mode_jacobian(stack, client_cache_dir):
    torch.manual_seed(0)
    w = torch.randn(4, 3)

    def f(x):
        return jacfwd(lambda t: torch.sin(w @ t) * t.sum())(x)

    x = torch.randn(3)
    _close(_on_the_farm(f, x, stack=stack), f(x))


class HeatPINN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, xt):
        """A physics-informed loss for the heat equation u_t = 0.1 u_xx at points (x, t):
        u_t by a jvp along t, u_xx by the Hessian at each point, plus a data term."""
        u = lambda p: self.net(p).squeeze(-1)  # noqa: E731
        u_t = jvp(u, (xt,), (torch.tensor([0.0, 1.0]).expand_as(xt),))[1]
        u_xx = vmap(hessian(u))(xt)[:, 0, 0]
        return (u_t - 0.1 * u_xx).pow(2).mean() + u(xt).pow(2).mean()


def test_a_physics_informed_loss_trains(stack, client_cache_dir):
    # A second hidden layer, or 16 points, crashes torch 2.13's own compiled backward on
    # CPU (a ZeroTensor gradient reaches an Inductor kernel), locally as on the farm.
    torch.manual_seed(0)
    model, xt = HeatPINN(), torch.randn(8, 2)
    eager = copy.deepcopy(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    torch._dynamo.reset()
    try:
        with report.collect() as graphs:
            compiled = sdk.compile(model, remote=stack.address, fallback="error")
            for _ in range(2):  # a training step, then the loss it left
                for optimizer in optimizers:
                    optimizer.zero_grad()
                got, want = compiled(xt), eager(xt)
                got.backward()
                want.backward()
                _close(got.detach(), want.detach())
                for p, q in zip(model.parameters(), eager.parameters(), strict=True):
                    _close(p.grad, q.grad)
                for optimizer in optimizers:
                    optimizer.step()
    finally:
        torch._dynamo.reset()
    assert graphs and all(g.outcome != report.LOCAL for g in graphs), graphs
