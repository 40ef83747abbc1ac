"""One training step of a zoo model through `sdk.compile`, against eager.

Shared by the real-model suite (tests/integration/test_real_models.py) and
`make coverage-report` (scripts/model_coverage.py). Run as a module, it takes one step
in this fresh process and prints its result as JSON (`fresh_step`), which is how both
check that a second process hits every graph the first put on the farm:

    python -m tests.realmodels.step NAME ADDRESS
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import sdk
from sdk import report
from tests.realmodels.zoo import Arch, arch_named

TOLERANCE = 1e-4
"""Largest absolute difference from eager: the loss, every output tensor, every gradient
(issue 18; issue 43 asks 1e-3)."""


@dataclass
class StepResult:
    arch: str
    family: str
    graphs: int = 0
    on_farm: int = 0
    hits: int = 0
    """Graphs the farm answered from its cache."""
    fell_back: list[str] = field(default_factory=list)
    """One line per graph compiled locally: its index and the farm's reason."""
    split: list[str] = field(default_factory=list)
    """One line per graph split at calls the farm refuses (sdk/split.py): its index and
    the calls that ran eagerly. Its pieces count among the graphs; it does not."""
    loss_error: float = 0.0
    """The loss's and every other output tensor's largest difference from eager."""
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
            + (f"; split: {'; '.join(self.split)}" if self.split else "")
            + (f"; step failed: {self.error}" if self.error else "")
        )


def _outputs(out: Any) -> list[torch.Tensor]:
    """The loss first, then every other tensor of the model's output, detached."""
    rest = [v for k, v in out.items() if k != "loss" and isinstance(v, torch.Tensor)]
    return [t.detach() for t in [out.loss, *rest]]


def _loss_and_grads(model: torch.nn.Module, inputs: dict) -> tuple[list[torch.Tensor], list]:
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return _outputs(out), [p.grad for p in model.parameters()]


def _max_error(got: list, want: list) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if (g is None) != (w is None):
            return float("inf")
        if g is not None:
            worst = max(worst, (g - w).abs().max().item())
    return worst


def train_step(arch: Arch, remote: str, **compile_kwargs: Any) -> StepResult:
    """Builds the model, runs one eager and one compiled step, and compares them."""
    compile_kwargs = {**arch.compile_kwargs, **compile_kwargs}
    result = StepResult(arch.name, arch.family)
    torch.manual_seed(0)
    model, inputs = arch.build()
    model.train()
    eager = copy.deepcopy(model)
    want_outputs, want_grads = _loss_and_grads(eager, inputs)
    torch._dynamo.reset()
    try:
        with report.collect() as graphs:
            compiled = sdk.compile(model, remote=remote, fallback="local", **compile_kwargs)
            model.zero_grad(set_to_none=True)
            out = compiled(**inputs)
            out.loss.backward()
    except Exception as e:  # noqa: BLE001 - the report says which model failed and how
        result.error = f"{type(e).__name__}: {str(e)[:300]}"
        return result
    finally:
        torch._dynamo.reset()
    compiles = report.WarmReport(graphs).compiles
    result.graphs = len(compiles)
    result.on_farm = sum(g.outcome in (report.HIT, report.COMPILED, report.JOINED) for g in compiles)
    result.hits = sum(g.outcome == report.HIT for g in compiles)
    result.fell_back = [f"graph {g.graph}: {g.error}" for g in compiles if g.outcome == report.LOCAL]
    result.split = [f"graph {g.graph}: {g.error}" for g in graphs if g.outcome == report.SPLIT]
    result.loss_error = _max_error(_outputs(out), want_outputs)
    result.grad_error = _max_error([p.grad for p in model.parameters()], want_grads)
    return result


def fresh_step(name: str, remote: str, env: dict[str, str] | None = None, timeout_s: float = 900) -> StepResult:
    """`train_step` of the zoo model `name` in a new Python process (its own Dynamo and
    Inductor caches), against the same farm: a second process's view of the cache."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.realmodels.step", name, remote],
        cwd=root, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout_s,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return StepResult(name, arch_named(name).family, error=f"the fresh process failed: {proc.stderr[-300:]}")
    return StepResult(**json.loads(lines[-1]))


def main(argv: list[str]) -> int:
    name, remote = argv
    result = train_step(arch_named(name), remote)
    print(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
