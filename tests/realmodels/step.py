"""One training step of a zoo model through `sdk.compile`, against eager.

Shared by the real-model suite (tests/integration/test_real_models.py) and
`make coverage-report` (scripts/model_coverage.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

import sdk
from sdk import report
from tests.realmodels.zoo import Arch

TOLERANCE = 1e-4
"""Largest absolute difference from eager, loss and every gradient (issue 18)."""


@dataclass
class StepResult:
    arch: str
    family: str
    graphs: int = 0
    on_farm: int = 0
    fell_back: list[str] = field(default_factory=list)
    """One line per graph compiled locally: its index and the farm's reason."""
    loss_error: float = 0.0
    grad_error: float = 0.0
    error: str = ""
    """Set when the step itself raised."""

    @property
    def share(self) -> float:
        return self.on_farm / self.graphs if self.graphs else 0.0

    def line(self) -> str:
        return (
            f"{self.arch}: {self.on_farm}/{self.graphs} graphs on the farm ({self.share:.0%}), "
            f"loss error {self.loss_error:.1e}, gradient error {self.grad_error:.1e}"
            + (f"; fell back: {'; '.join(self.fell_back)}" if self.fell_back else "")
            + (f"; step failed: {self.error}" if self.error else "")
        )


def _loss_and_grads(model: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _max_error(got: list, want: list) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if (g is None) != (w is None):
            return float("inf")
        if g is not None:
            worst = max(worst, (g - w).abs().max().item())
    return worst


def train_step(arch: Arch, remote: str, **compile_kwargs) -> StepResult:
    """Builds the model, runs one eager and one compiled step, and compares them."""
    result = StepResult(arch.name, arch.family)
    torch.manual_seed(0)
    model, inputs = arch.build()
    model.train()
    eager = copy.deepcopy(model)
    want_loss, want_grads = _loss_and_grads(eager, inputs)
    torch._dynamo.reset()
    try:
        with report.collect() as graphs:
            compiled = sdk.compile(model, remote=remote, fallback="local", **compile_kwargs)
            model.zero_grad(set_to_none=True)
            loss = compiled(**inputs).loss
            loss.backward()
    except Exception as e:  # noqa: BLE001 - the report says which model failed and how
        result.error = f"{type(e).__name__}: {str(e)[:300]}"
        return result
    finally:
        torch._dynamo.reset()
    result.graphs = len(graphs)
    result.on_farm = sum(g.outcome in (report.HIT, report.COMPILED, report.JOINED) for g in graphs)
    result.fell_back = [f"graph {g.graph}: {g.error}" for g in graphs if g.outcome == report.LOCAL]
    result.loss_error = (loss.detach() - want_loss).abs().item()
    result.grad_error = _max_error([p.grad for p in model.parameters()], want_grads)
    return result
