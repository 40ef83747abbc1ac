"""How the stage jobs of a staged compile send each other and claim kernels.

No task waits for another: each stage ends by sending the next one, and the barrier is
a Redis set (workers/board.py) that holds `LOWERING` until the lowering ends, so the
assembly cannot start while kernels are still being discovered. Jobs in flight at once
build a kernel they share once: the first claims it and sends its build, the others
wait on that build, which releases them all (`StageBoard.claim`; `settle` in
workers/jobs/build.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TypeVar

from torchfarm.fx.cpp_kernels import KernelSpec, kernel_name
from torchfarm.storage.store import Store
from torchfarm.wire import builds, routing, targets
from torchfarm.wire.codes import Stage
from workers.board import PlannedKernel, StageBoard, kernel_cache_key, waiter_name
from workers.runtime import WorkerContext, put_blob

T = TypeVar("T")


def stage_record(
    stage: str, seconds: float, queued: float = 0.0, worker: str = "",
    kernels: int = 0, kernels_hit: int = 0,
) -> dict[str, Any]:
    """One stage's entry in the manifest's and the job record's `stages`."""
    return {
        "stage": stage, "seconds": round(max(seconds, 0.0), 4),
        "queued_seconds": round(max(queued, 0.0), 4), "worker": worker,
        "kernels": kernels, "kernels_hit": kernels_hit,
    }


def stage_queue(target: str, ctx: WorkerContext) -> str:
    """The stage queue of `target` among the workers of this one's build."""
    return routing.stage_queue(targets.parse(target), builds.digest(ctx.fingerprint.to_dict()))


def send_stage(ctx: WorkerContext, task: str, args: list[Any], queue: str) -> None:
    if ctx.send is None:
        raise RuntimeError("this worker context cannot send stage jobs (WorkerContext.send)")
    ctx.send(task, args, queue)


def in_batches(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def send_builds(
    ctx: WorkerContext, key: str, target: str, kernels: list[PlannedKernel]
) -> list[list[str]]:
    """Sends `kernels`' build jobs, `kernel_batch` a job; returns each job's cache keys."""
    batches = in_batches(kernels, kernel_batch(ctx))
    for batch in batches:
        refs = [[k.cache_key, k.source.digest] for k in batch]
        send_build(ctx, key, ctx.store.namespace, target, refs)
    return [[k.cache_key for k in batch] for batch in batches]


def send_build(ctx: WorkerContext, key: str, namespace: str, target: str, refs: list[list[str]]) -> None:
    """Sends one kernel-build job, sealed (`build_seal`): the broker is no more trusted
    than the cache, and a build job names the specs a worker will compile."""
    send_stage(
        ctx, routing.BUILD_KERNELS_TASK,
        [key, namespace, target, refs, build_seal(ctx, key, namespace, target, refs)],
        stage_queue(target, ctx),
    )


def build_seal(ctx: WorkerContext, key: str, namespace: str, target: str, refs: list[list[str]]) -> str:
    """The seal of a kernel-build message; "" on a farm without a seal."""
    if ctx.seal is None:
        return ""
    return ctx.seal.mac("build", namespace, key, target, json.dumps(refs))


def claim(ctx: WorkerContext, key: str, target: str, kernels: list[PlannedKernel]) -> list[int]:
    """The job `key` waits for `kernels` (StageBoard.claim); each one's verdict. Claims
    lapse with the broker's visibility timeout, before the coordinator calls a job that
    waited on an orphaned claim stale and queues it again (`stale_job_s`), so the new
    try claims the kernel itself."""
    return StageBoard(ctx.store, ctx.seal).claim(
        key, waiter_name(ctx.store.namespace, key, target), [k.cache_key for k in kernels],
        ctx.settings.done_ttl_s, ctx.settings.visibility_timeout_s,
    )


def planned(ctx: WorkerContext, target: str, spec: bytes) -> PlannedKernel:
    """A kernel spec as the pipeline knows it: its blob stored, its kernel cache key."""
    return PlannedKernel(
        name=kernel_name(spec),
        kind="cpp" if KernelSpec.from_bytes(spec).is_library() else "cpp-object",
        source=put_blob(ctx.store, spec),
        cache_key=kernel_key(ctx, spec, target),
    )


def kernel_key(ctx: WorkerContext, spec: bytes, target: str) -> str:
    """The spec's kernel cache key for this worker's build, and, with
    `kernel_cache_scope="tenant"`, for the job's tenant alone."""
    tenant = ctx.store.namespace if ctx.settings.kernel_cache_scope == "tenant" else None
    return kernel_cache_key(spec, target, ctx.fingerprint.to_dict(), tenant)


def build_threads() -> int:
    """How many kernels a kernel-build job builds at once: the cores this worker process
    may run on (one, for a worker pinned to a core)."""
    return max(len(os.sched_getaffinity(0)), 1)


def kernel_batch(ctx: WorkerContext) -> int:
    """Kernels per build job this worker sends: `TORCHFARM_KERNEL_BATCH`, or by default
    what one job builds at once here. The workers of one target are taken to be alike."""
    return ctx.settings.kernel_batch or build_threads()


def send_assembly(store: Store, ctx: WorkerContext, key: str, target: str) -> None:
    store.update_job(key, stage=Stage.ASSEMBLING, a_sent=time.time())
    send_stage(ctx, routing.ASSEMBLE_TASK, [key, store.namespace], stage_queue(target, ctx))
