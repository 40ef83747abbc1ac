"""Warm mode: `torchfarm warm SCRIPT.py [args]` runs a user's script in a fresh process in *warm
mode* (`run_script`): every `sdk.compile` in it compiles on the farm, blocking
(wait=False is ignored), and reports into one report the CLI prints at the end. The
script stops at the end of step N (`--steps`, default 1): a step ends when any model
`sdk.compile` returned is called for the (N+1)-th time, which stops the script before
that call runs; `--steps 0` runs the script to its end.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import torch

from sdk import report
from sdk.report import REPORT_ENV, STEPS_ENV, WarmReport


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
    """`python -m sdk.warm_mode SCRIPT [args]`, as `torchfarm warm` starts it."""
    if len(sys.argv) < 2 or REPORT_ENV not in os.environ:
        print(f"usage: {REPORT_ENV}=PATH python -m sdk.warm_mode SCRIPT.py [args]", file=sys.stderr)
        return 2
    steps = int(os.environ.get(STEPS_ENV, "1"))
    return run_script(sys.argv[1], sys.argv[2:], os.environ[REPORT_ENV], steps)


if __name__ == "__main__":
    # Through the importable module: its state is what `sdk.compile` reads.
    from sdk.warm_mode import main as _main

    sys.exit(_main())
