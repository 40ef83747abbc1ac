"""Custom ops (`torch.library`) on the farm, through the shared session stack, against eager.

The worker process never imports this module, so the op it compiles around is the
stand-in it built from the schema and recorded metadata (torchfarm/fx/torch_library.py);
the artifact's generated code calls `torch.ops.tfuser.*`, which here is the real op.

- forward with `fallback="error"` (no input needs gradients), at two batch sizes under
  `dynamic=True`, and inside an activation checkpoint's subgraph;
- an op with `register_autograd`: its backward is this process's Python, which the
  worker cannot run, so the farm refuses it by name and the graph is split at its call
  (sdk/split.py): the op runs here, the rest on the farm, and the step matches eager;
- Mixtral's `torch.ops.transformers.grouped_mm_fallback` trains on the farm in the
  real-model suite (tests/integration/test_real_models.py, `make test-models`): the
  session stack's worker has `transformers` installed (TORCHFARM_INSTALLED_OP_MODULES,
  see tests/conftest.py), so the real op, autograd included, is used there.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import sdk

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@torch.library.custom_op("tfuser::scaled_gate", mutates_args=())
def scaled_gate(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.sigmoid(x) * w * alpha


@scaled_gate.register_fake
def _(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("tfuser::split_halves", mutates_args=())
def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1] // 2
    return x[..., :n].clone() * 3, x[..., n:].clone() - 1


@split_halves.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1] // 2
    return x.new_empty((*x.shape[:-1], n)), x.new_empty((*x.shape[:-1], x.shape[-1] - n))


@torch.library.custom_op("tfuser::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


double.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, inputs, output: None)


class Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = split_halves(self.proj(x))
        return scaled_gate(a, b, 0.5).cos()


def test_custom_ops_forward_on_the_farm_match_eager(stack, client_cache_dir, caplog):
    torch.manual_seed(0)
    # Weights that require gradients, under no_grad: the farm compiles an inference
    # graph, as a local compile would, so the stand-in needs no backward.
    model = Gated().eval()
    compiled = sdk.compile(model, remote=stack.address, fallback="error", dynamic=True)
    with caplog.at_level(logging.INFO, logger="sdk"), torch.no_grad():
        for batch in (3, 5):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    farm = [r.getMessage() for r in caplog.records if r.name == "sdk.backend" and "key=" in r.getMessage()]
    assert len(farm) == 1, farm  # one dynamic graph, compiled on the farm


def test_a_custom_backward_runs_here_naming_the_op(stack, client_cache_dir, caplog):
    """The farm refuses an op whose backward is the client's Python, naming it: the
    graph is split at the op (sdk/split.py), which runs here with its autograd."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    eager = copy.deepcopy(lin)

    def fn(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return double(m(x)).sum()

    x = torch.randn(3, 4)
    with caplog.at_level(logging.WARNING, logger="sdk"):
        loss = sdk.compile(fn, remote=stack.address, fallback="local")(lin, x)
        loss.backward()
    torch._dynamo.reset()
    ref = fn(eager, x)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(lin.weight.grad, eager.weight.grad)
    warnings = [r.getMessage() for r in caplog.records if "is split at calls the farm refuses" in r.getMessage()]
    assert warnings and "tfuser.double" in warnings[0] and "backward" in warnings[0], warnings
    assert not [r for r in caplog.records if "compiles locally" in r.getMessage()]



def test_custom_ops_inside_a_checkpointed_subgraph_run_on_the_farm(stack, client_cache_dir, caplog):
    """The ops are called in a higher-order op's body: the subgraph carries the calls'
    recorded metadata, and the worker's stand-ins serve them there too."""
    import torch.utils.checkpoint as checkpoint

    torch.manual_seed(0)
    model = Gated().eval()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return checkpoint.checkpoint(model, x, use_reentrant=False) + 1

    compiled = sdk.compile(fn, remote=stack.address, fallback="error")
    with caplog.at_level(logging.INFO, logger="sdk"), torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    farm = [r.getMessage() for r in caplog.records if r.name == "sdk.backend" and "key=" in r.getMessage()]
    assert len(farm) == 1, farm
