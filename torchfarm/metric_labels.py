"""How every metric names a target: one label scheme for the coordinator and the workers.

A queue's name encodes three things (torchfarm/wire/routing.py); metrics spell them as labels:

- `target`: the target as users type it and the CLI prints it, "cpu:avx512",
  "cuda:sm_90" (torchfarm/wire/targets.py); a bare device ("cpu") for a queue that names no
  exact target;
- `kind`: which jobs the queue carries: "graph" (graph compiles and exports), "stage"
  (a staged compile's lowering, kernel builds and assembly) or "kernel" (Triton kernels);
- `build`: the build digest a graph or stage queue ends in ("3f9c21"), "" for a kernel
  queue. Only the queue gauges carry it, where two builds' queues of one target are
  distinct series; a worker serves one build, which its `torchfarm_build_info` names.

Label values stay few: a farm has a handful of targets and builds, never a key or job id.
"""

from __future__ import annotations

from typing import NamedTuple

from torchfarm.wire import routing
from torchfarm.wire.targets import DEVICES, TargetError

KINDS = ("graph", "stage", "kernel")
"""Every value of the `kind` label."""

UNKNOWN = "unknown"
"""The `target` of a queue name that is no farm queue (a job record without one)."""


class QueueLabels(NamedTuple):
    target: str
    kind: str
    build: str


def of_queue(queue: str) -> QueueLabels:
    """"stages.cpu.avx512.b3f9c21" → ("cpu:avx512", "stage", "3f9c21");
    "kernels.cuda.sm_90" → ("cuda:sm_90", "kernel", "")."""
    if queue.startswith(routing.KERNEL_QUEUE_PREFIX):
        kind = "kernel"
    elif queue.startswith(routing.STAGE_QUEUE_PREFIX):
        kind = "stage"
    else:
        kind = "graph"
    return QueueLabels(target_of_queue(queue), kind, routing.build_of_queue(queue))


def target_of_queue(queue: str) -> str:
    """The `target` label of a queue: its target's text form, or its device alone when
    the rest does not parse, or UNKNOWN."""
    try:
        return str(routing.target_of_queue(queue))
    except TargetError:
        base = queue.removeprefix(routing.KERNEL_QUEUE_PREFIX).removeprefix(routing.STAGE_QUEUE_PREFIX)
        device = base.split(".", 1)[0]
        return device if device in DEVICES else UNKNOWN


def device_of(target: str) -> str:
    """"cuda:sm_90" → "cuda": what KEDA's per-pool queries select with `target=~"cuda(:.*)?"`."""
    return target.split(":", 1)[0]
