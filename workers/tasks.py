"""Celery tasks: decode the message, call the plain job function, map time limits.
Each job function runs at the start of an interpreter stack chunk of its own
(workers/stackroom.py): at the depth Celery calls a task, Inductor's loops crossed a
chunk boundary, and the lowering ran 25 % slower for it.

Retries of a lost worker come from `acks_late` + `task_reject_on_worker_lost`
(torchfarm.celeryconf); a task that lost its Redis or broker connection (a failover) is
retried by Celery (`TRANSIENT_RETRY`); `run_delivery` counts deliveries and stops at the
cap. Errors of the compile itself are deterministic and are never retried.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator

from celery import signals
from celery.exceptions import SoftTimeLimitExceeded

from torchfarm.celeryconf import TRANSIENT_RETRY
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState, Store
from torchfarm.trust.seal import Seal
from torchfarm.trust.signing import Signer
from torchfarm.wire.codes import HANDED_ON, JobError
from torchfarm.wire.routing import (
    ASSEMBLE_TASK,
    BUILD_KERNELS_TASK,
    COMPILE_TASK,
    EXPORT_TASK,
    KERNEL_TASK,
    LOWER_TASK,
)
from workers import identity, sandbox
from workers import metrics as worker_metrics
from workers.app import app, compiles_in_pool, plan, sandbox_mode, settings
from workers.board import StageBoard
from workers.hard_limits import on_task_failure
from workers.jobs.assemble import run_assembly
from workers.jobs.build import run_kernel_batch
from workers.jobs.export import run_export_job
from workers.jobs.graph import run_job
from workers.jobs.lower import run_lowering
from workers.jobs.triton import KernelContext, fail_kernel_job, run_kernel_job
from workers.limits import SOFT_LIMIT
from workers.runtime import WorkerContext, executor_for, fail_job
from workers.stackroom import in_stack_room

# A task killed at the hard time limit runs nothing more; the main process ends its job.
signals.task_failure.connect(on_task_failure, weak=False)
signals.task_prerun.connect(SOFT_LIMIT.task_started, weak=False)


@functools.cache
def worker_context() -> WorkerContext:
    """This pool process's context for graph jobs, which every graph task passes to its
    job function; built on first use, after the fork, from the worker's settings."""
    signer = (
        Signer.from_file(settings.signing_key_file, settings.signing_key_id)
        if settings.signing_key_file
        else None
    )
    return WorkerContext(
        settings=settings,
        store=Store.from_url(settings.cache_url, settings.redis_prefix, settings.blob_url, settings.state_url),
        fingerprint=_graph_fingerprint(),
        name=settings.worker_name(),
        signer=signer,
        seal=_seal(signer),
        timeout_errors=(SoftTimeLimitExceeded,),
        timed_out=lambda: SOFT_LIMIT.fired,
        send=_send,
        sandbox=_sandbox(),
    )


@functools.cache
def _sandbox() -> sandbox.Sandbox | None:
    if sandbox_mode == "off":
        return None
    # The forkserver's warm-up compile is a CPU graph's; a GPU worker's forkserver must
    # not start the GPU's runtime either, since it forks every run.
    warm = settings.warmup and bool(plan.graph) and not compiles_in_pool and plan.own_gpu is None
    device = plan.own_gpu.device if plan.own_gpu is not None else "cpu"
    return sandbox.for_worker(settings, sandbox_mode, warm_compile=warm, device=device)


@signals.worker_process_init.connect
def _start_forkserver(**_: object) -> None:
    """Each pool process starts its sandbox's forkserver as it starts, without waiting
    for it: the imports and header builds are done by its first job."""
    box = _sandbox()
    if box is not None and box.forkserver is not None:
        box.forkserver.start(box)


def _seal(signer: Signer | None) -> Seal | None:
    """The record seal: its own key file, else derived from the signing key."""
    if settings.record_key_file:
        return Seal.from_file(settings.record_key_file)
    return Seal.from_signer(signer) if signer is not None else None


def _send(task: str, args: list, queue: str) -> None:
    app.send_task(task, args=args, queue=queue)


@contextlib.contextmanager
def _time_limit_fails(key: str, namespace: str, what: str) -> Iterator[None]:
    """Celery's soft time limit, hit inside the block, fails the job COMPILE_TIMEOUT."""
    try:
        yield
    except SoftTimeLimitExceeded:
        fail_job(
            key, worker_context(), JobError.COMPILE_TIMEOUT, f"{what} ran past the farm's time limit", namespace
        )


@app.task(name=COMPILE_TASK, **TRANSIENT_RETRY)
def compile_task(key: str, namespace: str = "") -> None:
    """Compiles the job `key` of the tenant namespace `namespace` ("" on an open farm)."""
    began = time.time()
    try:
        with _time_limit_fails(key, namespace, "the compile"):
            in_stack_room(run_job, key, worker_context(), namespace)
    finally:
        if settings.metrics_port:
            _record(key, namespace, began)


def _record(key: str, namespace: str, began: float | None) -> None:
    """Counts a graph job in the metrics once it has ended: a staged compile's graph job
    (its decomposition) and lowering job leave it running, and its assembly ends it
    (`began=None`: the job began with its graph job). The lowering and the assembly can
    both find it ended (a fast assembly ends it before its lowering task returns): the
    first to mark the job record counts it."""
    store = worker_context().store.tenant(namespace)
    job = store.get_job(key)
    if job is None or (job.state not in JobState.TERMINAL and (began is None or job.stage in HANDED_ON)):
        return
    if began is None and StageBoard(store).count(key, "metrics_counted") > 1:
        return
    worker_metrics.record_job(store, key, job.started if began is None else began)


@app.task(name=EXPORT_TASK, **TRANSIENT_RETRY)
def export_task(key: str, namespace: str = "") -> None:
    """Builds the AOTInductor package of the export job `key` (workers/jobs/export.py)."""
    began = time.time()
    try:
        with _time_limit_fails(key, namespace, "the export"):
            in_stack_room(run_export_job, key, worker_context(), namespace)
    finally:
        if settings.metrics_port:
            worker_metrics.record_job(worker_context().store.tenant(namespace), key, began)


@app.task(name=LOWER_TASK, **TRANSIENT_RETRY)
def lower_task(key: str, namespace: str, target: str) -> None:
    """Lowers a staged compile from its stored decomposition (workers/jobs/lower.py)."""
    try:
        with _time_limit_fails(key, namespace, "the lowering"):
            in_stack_room(run_lowering, key, worker_context(), namespace, target)
    finally:
        if settings.metrics_port:
            _record(key, namespace, None)


@app.task(name=BUILD_KERNELS_TASK, **TRANSIENT_RETRY)
def build_kernels_task(
    key: str, namespace: str, target: str, kernels: list[list[str]], seal: str = ""
) -> None:
    """Builds a batch of a staged compile's C++ kernels (workers/jobs/build.py)."""
    with _time_limit_fails(key, namespace, "a kernel build"):
        in_stack_room(run_kernel_batch, key, worker_context(), namespace, target, kernels, seal)


@app.task(name=ASSEMBLE_TASK, **TRANSIENT_RETRY)
def assemble_task(key: str, namespace: str) -> None:
    """Writes a staged compile's artifact once all its kernels are built (workers/jobs/)."""
    try:
        in_stack_room(run_assembly, key, worker_context(), namespace)
    finally:
        if settings.metrics_port:
            _record(key, namespace, None)


def _graph_fingerprint():
    """The fingerprint of the one target this worker lowers graphs for (workers/serving.py).

    A GPU target lowered without its GPU gets its device properties faked here, in the
    pool process that compiles (workers/gpuless.py).
    """
    if plan.fake_gpu is not None:
        from workers import gpuless

        gpuless.install(plan.fake_gpu, settings.gpu_properties_file)
    if not plan.graph:
        return local_fingerprint()
    return identity.worker_fingerprint(plan.graph[0], settings.reported_build)


@functools.cache
def kernel_context() -> KernelContext:
    """This pool process's context for Triton kernel jobs (`compile_kernel_task`), built
    on first use, after the fork."""
    import importlib.metadata

    return KernelContext(
        store=Store.from_url(settings.cache_url, settings.redis_prefix, settings.blob_url, settings.state_url),
        name=settings.worker_name(),
        targets=frozenset(str(t) for t in plan.kernel),
        triton_version=importlib.metadata.version("triton"),
        max_attempts=settings.max_attempts,
        failed_ttl_s=settings.failed_ttl_s,
        done_ttl_s=settings.done_ttl_s,
        scratch_dir=os.environ.get("TRITON_CACHE_DIR"),  # Triton's own setting, not ours
        executor=executor_for(settings, _sandbox()),
    )


@app.task(
    name=KERNEL_TASK,
    soft_time_limit=settings.kernel_soft_time_limit_s,
    time_limit=settings.kernel_soft_time_limit_s + 30,
    **TRANSIENT_RETRY,
)
def compile_kernel_task(key: str, namespace: str = "") -> None:
    """Compiles the Triton kernel job `key` (workers/jobs/triton.py)."""
    try:
        in_stack_room(run_kernel_job, key, kernel_context(), namespace)
    except SoftTimeLimitExceeded:
        fail_kernel_job(
            key, kernel_context(), JobError.KERNEL_TIMEOUT,
            f"the kernel compile ran past {settings.kernel_soft_time_limit_s}s", namespace,
        )
