"""Prewarming: compile a model's graphs on the farm ahead of time, so jobs start hot.

`sdk.warm(model, example_inputs)` runs one forward of the model through `sdk.compile`
and returns a `WarmReport` (sdk/report.py): per graph, its key and whether the farm's
cache already held it or the farm compiled it. The caller keeps nothing compiled.

- Training graphs: when any parameter requires grad, the forward runs under grad, so
  AOTAutograd compiles the forward and the backward at once; no backward is run.
  `training=False` runs it under `torch.no_grad()` for the inference graphs.
- The model is not touched: the forward runs on a `copy.deepcopy` of a module (so
  BatchNorm running stats, counters and other buffers of the caller's model do not
  move; it costs one copy of the model's memory while warming), and under
  `torch.random.fork_rng` (so dropout does not advance the caller's random stream).
  `module.training` is the caller's: warm in the mode the job will run in.
- The graphs and their keys are what the job's own `sdk.compile` will capture with the
  same inputs' shapes, dtypes and strides, compile keywords, torch build and target;
  anything else makes other keys, and the job compiles those as usual.

`torchfarm warm SCRIPT.py [args]` runs a user's script in a fresh process in *warm
mode* (`run_script`): every `sdk.compile` in it compiles on the farm, blocking
(wait=False is ignored), and reports into one report the CLI prints at the end. The
script stops at the end of step N (`--steps`, default 1): a step ends when any model
`sdk.compile` returned is called for the (N+1)-th time, which stops the script before
that call runs; `--steps 0` runs the script to its end.
"""

from __future__ import annotations

import copy
import functools
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sdk import report
from sdk.errors import ConfigError
from sdk.report import REPORT_ENV, STEPS_ENV, WarmReport


def warm(
    model: Callable,
    example_inputs: Any,
    *,
    remote: str | None = None,
    training: bool | None = None,
    target: str | None = None,
    fallback: str = "local",
    **compile_kwargs: Any,
) -> WarmReport:
    """Compiles every graph of `model(*example_inputs)` on the farm; returns the report.

    `compile_kwargs` are `sdk.compile`'s (mode, options, dynamic, fullgraph): pass the
    ones the job passes, since they are in the key. `target` warms the cache for a fleet
    this machine is not (sdk/prewarm.py). `training` defaults to whether any parameter
    of the model requires grad (for a plain function: whether grad is enabled)."""
    from sdk.api import compile as farm_compile

    if not (remote or os.environ.get("TORCHFARM_REMOTE")):
        raise ConfigError("sdk.warm needs a farm: pass remote= or set TORCHFARM_REMOTE")
    if compile_kwargs.get("wait") is False:
        raise ConfigError("sdk.warm compiles blocking; wait=False does not apply")
    compile_kwargs.pop("wait", None)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    subject = model
    if isinstance(model, torch.nn.Module):
        subject = copy.deepcopy(model)
        if training is None:
            training = any(p.requires_grad for p in model.parameters())
    elif training is None:
        training = torch.is_grad_enabled()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with report.collect() as graphs, torch.random.fork_rng(devices=devices):
        compiled = farm_compile(subject, remote=remote, target=target, fallback=fallback, **compile_kwargs)
        with torch.set_grad_enabled(training):
            compiled(*inputs)
    return WarmReport(list(graphs))


class _Stop(SystemExit):
    """Ends a script in warm mode at the end of its last step (see the module docstring)."""


class _Runner:
    def __init__(self, steps: int):
        self.steps = steps
        self.calls: dict[int, int] = {}

    def before_call(self, obj: object) -> None:
        n = self.calls.get(id(obj), 0) + 1
        self.calls[id(obj)] = n
        if self.steps and n > self.steps:
            raise _Stop(0)

    def observe(self, compiled: Any) -> Any:
        if isinstance(compiled, torch.nn.Module):
            compiled.register_forward_pre_hook(lambda mod, args: self.before_call(mod))
            return compiled

        @functools.wraps(compiled)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.before_call(counted)
            return compiled(*args, **kwargs)

        return counted


_runner: _Runner | None = None


def active() -> bool:
    """True inside a script that `torchfarm warm` runs."""
    return _runner is not None


def observe(compiled: Any) -> Any:
    """What `sdk.compile` returns: in warm mode, the model with its calls counted."""
    return compiled if _runner is None else _runner.observe(compiled)


def run_script(script: str, args: list[str], report_path: str, steps: int) -> int:
    """Runs `script` as `__main__` in warm mode; writes the report to `report_path` and
    returns the script's exit status (0 when it stopped at the end of its steps)."""
    global _runner
    _runner = _Runner(steps)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    status = 0
    with report.collect() as graphs:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:  # the script's own exit, or _Stop
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            Path(report_path).write_text(WarmReport(list(graphs)).to_json())
            _runner = None
    return status


def main() -> int:
    """`python -m sdk.warmup SCRIPT [args]`, as `torchfarm warm` starts it."""
    if len(sys.argv) < 2 or REPORT_ENV not in os.environ:
        print(f"usage: {REPORT_ENV}=PATH python -m sdk.warmup SCRIPT.py [args]", file=sys.stderr)
        return 2
    steps = int(os.environ.get(STEPS_ENV, "1"))
    return run_script(sys.argv[1], sys.argv[2:], os.environ[REPORT_ENV], steps)


if __name__ == "__main__":
    # Through the importable module: its state is what `sdk.compile` reads.
    from sdk.warmup import main as _main

    sys.exit(_main())
