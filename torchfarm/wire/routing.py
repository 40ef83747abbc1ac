"""Which Celery queue serves which job: one queue per exact target and job kind.

    graph compiles    cpu.avx512.b3f9c21   cuda.sm_90.b3f9c21   mps.b3f9c21   xpu.<name>.b3f9c21
    exports           the graph compiles' queues, under their own task name
    C++ kernel builds and assembly of staged compiles   stages.cpu.avx512.b3f9c21
    Triton kernels    kernels.cuda.sm_90        kernels.rocm.gfx942

The queue name is the target's text form with ":" turned into "." (Celery and KEDA
are happiest with dotted names), so a queue names its target and back. Graph and stage
queues end in the build's digest, "b" and six hex digits (torchfarm/wire/builds.py): a
client of one torch build never meets a worker of another on a queue. Triton kernel
queues do not: a kernel job carries no torch build, and its worker checks Triton's
version itself. A worker
consumes exactly the queues of the targets it registered (workers/serving.py), and it
still checks the full build fingerprint (torch build, compiler) of each job, so a job
can never produce an artifact for another machine than the one that asked.

Graph compiles and kernel compiles have separate queues because a CPU-only worker can
compile Triton kernels for a GPU (Triton takes an explicit target), but cannot lower a
graph for one: the CPU build of torch has no CUDA device (docs/targets.md).
"""

from __future__ import annotations

import re
from typing import Any

from torchfarm.v1 import farm_pb2
from torchfarm.wire import targets
from torchfarm.wire.targets import DEVICES, Target, TargetError

__all__ = [
    "ASSEMBLE_TASK", "BUILD_KERNELS_TASK", "COMPILE_TASK", "DEVICES", "EXPORT", "EXPORT_TASK",
    "GRAPH", "KERNEL", "KERNEL_TASK", "LOWER_TASK", "UnknownDevice",
    "describe", "job_kind_of_queue", "queue_for", "queue_name", "served_targets", "stage_queue",
    "build_of_queue", "target_of", "target_of_queue", "unserved_message",
]

COMPILE_TASK = "torchfarm.compile"
"""The Celery task name of a graph compile; its one argument is the cache key. On the
staged path it is the decomposition stage, which sends `LOWER_TASK`."""

KERNEL_TASK = "torchfarm.compile_kernel"
"""The Celery task name of a Triton kernel compile; its one argument is the kernel key."""

EXPORT_TASK = "torchfarm.export"
"""The Celery task name of an AOTInductor export; its one argument is the cache key."""

GRAPH = "graph"
"""Job kind: an FX graph lowered by Inductor (needs the target's torch device)."""

KERNEL = "kernel"
"""Job kind: one Triton kernel compiled to a binary (needs only Triton)."""

EXPORT = "export"
"""Job kind: a torch.export program built into an AOTInductor package. It needs what a
graph compile needs, so it shares the target's graph queue (workers/jobs/export.py)."""

KERNEL_QUEUE_PREFIX = "kernels."
"""Queues of kernel jobs are the target's queue name under this prefix."""

LOWER_TASK = "torchfarm.lower"
"""The Celery task name of a staged compile's lowering (workers/jobs/lower.py), sent by its
decomposition: the graph's key, its namespace and its exact target."""

BUILD_KERNELS_TASK = "torchfarm.build_kernels"
"""The Celery task name of a staged compile's C++ kernel builds (workers/jobs/build.py):
the graph's key, its namespace, and a batch of kernel cache keys."""

ASSEMBLE_TASK = "torchfarm.assemble"
"""The Celery task name of a staged compile's last stage: kernels and payload into the
artifact (workers/jobs/assemble.py); its arguments are the graph's key and namespace."""

STAGE_QUEUE_PREFIX = "stages."
"""Queues of a staged compile's lowering, kernel-build and assembly jobs: the graph
target's queue name under this prefix ("stages.cpu.avx512"). Every worker that lowers
graphs for the target consumes it, so one graph's kernels build on all of them at once."""

BUILD_SUFFIX = re.compile(r"\.b([0-9a-f]{6})$")
"""The build digest that ends a graph or stage queue's name (torchfarm/wire/builds.py)."""

UnknownDevice = TargetError
"""Raised for a target the farm cannot route (kept under its old name for callers)."""


def target_of(msg: farm_pb2.Target, what: str = "a compile") -> Target:
    """The exact target of a `torchfarm.v1.Target` message; TargetError otherwise."""
    return targets.require_exact(targets.from_proto(msg), what)


def queue_name(target: Target, kind: str = GRAPH, build: str = "") -> str:
    """"cuda:sm_90" → "cuda.sm_90.b3f9c21" (graph, of build digest "3f9c21") or
    "kernels.cuda.sm_90" (kernel). Without a build, a graph queue is the bare target's
    (only in tests and the inverse functions below)."""
    if kind not in (GRAPH, KERNEL, EXPORT):
        raise ValueError(f"unknown job kind {kind!r}")
    if kind == KERNEL and target.device not in targets.KERNEL_DEVICES:
        raise TargetError(
            f"the farm compiles Triton kernels for {', '.join(targets.KERNEL_DEVICES)} "
            f"targets, not {target}"
        )
    base = str(target).replace(":", ".", 1)
    if kind == KERNEL:
        return KERNEL_QUEUE_PREFIX + base
    if build and not re.fullmatch(r"[0-9a-f]{6}", build):
        raise ValueError(f"a build digest is six hex digits, not {build!r}")
    return f"{base}.b{build}" if build else base


def queue_for(msg: farm_pb2.Target, kind: str = GRAPH, build: str = "") -> str:
    """The queue for a request's `Target` message and build digest. Raises TargetError
    (INVALID_ARGUMENT)."""
    what = "a kernel compile" if kind == KERNEL else "a compile"
    return queue_name(target_of(msg, what), kind, build)


def stage_queue(target: Target, build: str = "") -> str:
    """"cpu:avx512" → "stages.cpu.avx512.b3f9c21": lowering, kernel builds and assembly of
    staged compiles, among the workers of one build."""
    return STAGE_QUEUE_PREFIX + queue_name(target, GRAPH, build)


def build_of_queue(name: str) -> str:
    """The build digest a queue's name ends in; "" for a kernel queue or one without."""
    found = BUILD_SUFFIX.search(name)
    return found.group(1) if found and not name.startswith(KERNEL_QUEUE_PREFIX) else ""


def job_kind_of_queue(name: str) -> str:
    return KERNEL if name.startswith(KERNEL_QUEUE_PREFIX) else GRAPH


def target_of_queue(name: str) -> Target:
    """The inverse of `queue_name`: "kernels.rocm.gfx942" → rocm:gfx942."""
    base = name.removeprefix(KERNEL_QUEUE_PREFIX).removeprefix(STAGE_QUEUE_PREFIX)
    if not name.startswith(KERNEL_QUEUE_PREFIX):
        base = BUILD_SUFFIX.sub("", base)
    device, _, detail = base.partition(".")
    return targets.make(device, detail)


def served_targets(worker: dict[str, Any]) -> dict[str, set[str]]:
    """Target text → job kinds, from one worker's heartbeat record.

    A record without "targets" (a worker from before exact targets) is read from its
    queue names; a queue that names no exact target ("cpu") serves nothing routable.
    """
    if "targets" in worker:
        return {t: set(kinds) for t, kinds in worker["targets"].items()}
    served: dict[str, set[str]] = {}
    for queue in worker.get("queues", ()):
        try:
            target = target_of_queue(queue)
        except TargetError:
            continue
        if target.exact:
            served.setdefault(str(target), set()).add(job_kind_of_queue(queue))
    return served


def live_queues(workers: dict[str, dict[str, Any]]) -> frozenset[str]:
    """The queues the workers (`Store.live_workers`) consume."""
    return frozenset(q for w in workers.values() for q in w.get("queues", ()))


def unserved_message(target: str, kind: str, workers: dict[str, dict[str, Any]]) -> str:
    """Why `target` cannot be served, naming it and what the live workers do serve."""
    live: dict[str, set[str]] = {}
    for w in workers.values():
        for t, kinds in served_targets(w).items():
            live.setdefault(t, set()).update(kinds)
    what = "compiles Triton kernels" if kind == KERNEL else "compiles graphs"
    start = f"`torchfarm worker --targets {target}` serves it, on a machine that can build for it (docs/targets.md)"
    if not live:
        return f"no live worker {what} for target {target}; no worker is live; {start}"
    listed = ", ".join(f"{t} ({'+'.join(sorted(k))})" for t, k in sorted(live.items()))
    return f"no live worker {what} for target {target}; live targets: {listed}; {start}"


def describe(msg: farm_pb2.Target) -> str:
    """A short human name for a target message, for errors: "cpu:avx512", "cuda:sm_90"."""
    detail = msg.isa if msg.device == "cpu" else msg.arch
    return f"{msg.device}:{detail}" if detail else msg.device
