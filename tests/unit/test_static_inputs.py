"""A graph's parameters and buffers reach AOTAutograd on the worker as static inputs, as
Dynamo passes them in a local `torch.compile` (workers/compiler.py `static_inputs`).

The case that showed it: a buffer read through `.clone()` and changed in place after a
graph break, before the backward (a MoCo queue). The worker's partition, not knowing the
buffer was one, saved a view of it that Inductor makes with `reinterpret_tensor`, which
autograd does not version: the farm's backward read the changed buffer and gave
gradients 26 off, silently, where a local compile raises autograd's in-place error (its
partition saves the buffer itself, versioned). In process (localfarm/fakes.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from localfarm.fakes import InProcessFarm
from sdk.backend import FarmBackend

pytestmark = pytest.mark.slow


class Queue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)
        self.register_buffer("queue", torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (self.lin(x) @ self.queue.clone()).pow(2).mean()
        torch._dynamo.graph_break()
        with torch.no_grad():
            self.queue.mul_(-3.0)  # in place, after the graph that saved it
        return out


def _backward_error(model: nn.Module, x: torch.Tensor) -> str:
    try:
        model(x).backward()
    except RuntimeError as e:
        return str(e)
    return ""


def test_a_buffer_changed_before_the_backward_fails_as_a_local_compile_does(compiling_farm: InProcessFarm) -> None:
    torch.manual_seed(0)
    model, x = Queue(), torch.randn(4, 8)
    backend = FarmBackend(compiling_farm.sdk_settings(fallback="error"), client=compiling_farm.client())
    on_farm = _backward_error(torch.compile(copy.deepcopy(model), backend=backend), x)
    torch._dynamo.reset()
    local = _backward_error(torch.compile(copy.deepcopy(model)), x)
    assert "modified by an inplace operation" in local
    assert "modified by an inplace operation" in on_farm
    assert compiling_farm.store.recent_jobs()  # the graph was compiled by the farm, not here


def test_parameters_and_buffers_train_as_in_eager(compiling_farm: InProcessFarm) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    backend = FarmBackend(compiling_farm.sdk_settings(fallback="error"), client=compiling_farm.client())
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(6, 8)
        compiled(x).pow(2).mean().backward()
        twin(x).pow(2).mean().backward()
    both = zip([*model.parameters(), *model.buffers()], [*twin.parameters(), *twin.buffers()], strict=True)
    for mine, theirs in both:
        torch.testing.assert_close(mine, theirs)
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


def test_the_change_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """An artifact compiled before it (its buffers saved unversioned) is never served."""
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire import keys

    request = farm_pb2.CompileRequest()
    request.target.device = "cpu"
    with_it = keys.compute_key(request)
    monkeypatch.setattr(keys, "WORKER_CHANGES", ())
    assert keys.compute_key(request) != with_it
