"""Symbolic scalars on the farm, in process (localfarm/fakes.py), `fallback="error"`.

- `.item()` under `capture_scalar_outputs`: the unbacked symbol is made again on the
  worker by the decoded `.item()`, so data-dependent scalars and sizes compile there;
- a 0-d integer input read with `.item()` stays a SymInt (sdk/scalars.py specializes
  only floats), so `torch._check`s on it stay in the graph;
- `dynamic=True` with a LayerNorm's `eps`: one farm graph for every batch size.

Each compares outputs (and gradients where there are parameters) with eager.
"""

from __future__ import annotations

import copy

import pytest
import torch

from localfarm.fakes import InProcessFarm
from sdk.backend import FarmBackend

pytestmark = pytest.mark.slow


def _backend(farm: InProcessFarm) -> FarmBackend:
    backend = FarmBackend(farm.sdk_settings(fallback="error"), client=farm.client())
    return backend


def _farm_graphs(farm: InProcessFarm) -> int:
    return len(farm.store.recent_jobs())


def test_a_float_from_item_scales_a_tensor(compiling_farm: InProcessFarm) -> None:
    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x * t.sum().item()

    compiled = torch.compile(fn, backend=_backend(compiling_farm), fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for t in (torch.randn(3), torch.randn(3)):  # another value: the same graph
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x, t), fn(x, t))
    assert _farm_graphs(compiling_farm) == 1


def test_a_size_from_item_makes_a_data_dependent_tensor(compiling_farm: InProcessFarm) -> None:
    def fn(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n.item()) + x.sum()

    compiled = torch.compile(fn, backend=_backend(compiling_farm), fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for n in (5, 9):
            x = torch.randn(4)
            out = compiled(x, torch.tensor(n))
            assert out.shape == (n,)
            torch.testing.assert_close(out, fn(x, torch.tensor(n)))
    assert _farm_graphs(compiling_farm) == 1


def test_a_checked_int_from_an_input_tensor_stays_symbolic(compiling_farm: InProcessFarm) -> None:
    """Failed before sdk/scalars.py skipped integer inputs: the int was specialized, and
    the graph's `torch._check` became `5 >= 0`, which the farm refuses."""

    def fn(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 0)
        return x.new_ones(k) * 2

    compiled = torch.compile(fn, backend=_backend(compiling_farm), fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for n in (5, 3):
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x, torch.tensor(n)), fn(x, torch.tensor(n)))
    assert _farm_graphs(compiling_farm) == 1


def test_layer_norm_eps_under_dynamic_runs_every_batch_with_one_farm_graph(
    compiling_farm: InProcessFarm,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=_backend(compiling_farm), dynamic=True)
    for batch in (4, 7, 16, 33):
        x = torch.randn(batch, 8)
        out, ref = compiled(x), eager(x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        out.pow(2).mean().backward()
        ref.pow(2).mean().backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    assert _farm_graphs(compiling_farm) == 1


def test_a_float_scale_stays_symbolic_one_graph_for_every_value(compiling_farm: InProcessFarm) -> None:
    """A float used only in tensor arithmetic is not specialized (sdk/scalars.py): the
    worker's `.item()` gives an unbacked float that AOTAutograd tensorifies. Before,
    each new value was a recompile and a second farm graph."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    eager = copy.deepcopy(lin)

    def fn(m: torch.nn.Module, x: torch.Tensor, scale: float) -> torch.Tensor:
        return m(x) * scale + scale

    compiled = torch.compile(fn, backend=_backend(compiling_farm), dynamic=True)
    for scale in (0.5, 2.25, -1.5):
        x = torch.randn(3, 4)
        out, ref = compiled(lin, x, scale), fn(eager, x, scale)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
    torch.testing.assert_close(lin.weight.grad, eager.weight.grad)
    assert _farm_graphs(compiling_farm) == 1


def test_a_float_argument_that_changes_compiles_on_the_farm(compiling_farm: InProcessFarm) -> None:
    """An LR scheduler's `lr` changes between calls of a compiled optimizer step: Dynamo
    makes it a symbolic float, the SDK specializes it, and the retraced graph computes
    `-lr` from a constant. Before, that constant operator call was refused by the
    format (an operator without a node operand), so every step after the first compiled
    locally; the SDK now folds it before it sends the graph."""

    def sgd(p: torch.Tensor, g: torch.Tensor, lr: float) -> None:
        p.add_(g, alpha=-lr)

    compiled = torch.compile(sgd, backend=_backend(compiling_farm))
    p, g = torch.randn(8), torch.randn(8)
    eager = p.clone()
    for lr in (0.1, 0.05, 0.025):
        compiled(p, g, lr)
        sgd(eager, g, lr)
    torch.testing.assert_close(p, eager)
    assert _farm_graphs(compiling_farm) >= 2
