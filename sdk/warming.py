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

The script runner behind `torchfarm warm` is sdk/warm_mode.py.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import torch

from sdk import report
from sdk.errors import ConfigError
from sdk.report import WarmReport


def warm(
    model: Callable[..., Any],
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
    this machine is not (sdk/fleet.py). `training` defaults to whether any parameter
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
