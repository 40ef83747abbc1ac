"""Celery tasks: decode the message, call the plain job function, map time limits.
Each job function runs at the start of an interpreter stack chunk of its own
(workers/stackroom.py): at the depth Celery calls a task, Inductor's loops crossed a
chunk boundary, and the lowering ran 25 % slower for it.

Retries of a lost worker come from `acks_late` + `task_reject_on_worker_lost`
(torchfarm.celeryconf); a task that lost its Redis or broker connection (a failover) is
retried by Celery (`TRANSIENT_RETRY`); `run_delivery` counts deliveries and stops at the
cap. Errors of the compile itself are deterministic and are never retried.

`register` puts the tasks on a worker's app (workers/factory.py); each reads the `Worker`
it was handed and that worker's `JobContexts`, never a global.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded

from torchfarm.celeryconf import TRANSIENT_ERRORS, TRANSIENT_RETRY
from torchfarm.fx.fingerprint import Fingerprint, local_fingerprint
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
from workers.board import StageBoard
from workers.jobs.assemble import run_assembly
from workers.jobs.build import run_kernel_batch
from workers.jobs.export import run_export_job
from workers.jobs.graph import run_job
from workers.jobs.lower import run_lowering
from workers.jobs.triton import KernelContext, fail_kernel_job, run_kernel_job
from workers.limits import SOFT_LIMIT
from workers.runtime import WorkerContext, executor_for, fail_job
from workers.stackroom import in_stack_room
from workers.worker import Worker


class JobContexts:
    """One worker's job contexts in a pool process, which its tasks pass to their job
    functions: each built on first use, after the fork, from the worker's settings."""

    def __init__(self, worker: Worker, send: Callable[[str, list[Any], str], None]) -> None:
        self.worker = worker
        self.send = send

    @functools.cached_property
    def graph(self) -> WorkerContext:
        """The context of graph jobs and their stages."""
        settings = self.worker.settings
        return WorkerContext(
            settings=settings,
            store=_store(self.worker),
            fingerprint=_graph_fingerprint(self.worker),
            name=settings.worker_name(),
            signer=self.signer,
            seal=_seal(self.worker, self.signer),
            timeout_errors=(SoftTimeLimitExceeded,),
            retried_errors=TRANSIENT_ERRORS,
            timed_out=lambda: SOFT_LIMIT.fired,
            send=self.send,
            sandbox=self.sandbox,
        )

    @functools.cached_property
    def kernel(self) -> KernelContext:
        """The context of Triton kernel jobs (`compile_kernel_task`)."""
        import importlib.metadata

        settings = self.worker.settings
        return KernelContext(
            store=_store(self.worker),
            name=settings.worker_name(),
            targets=frozenset(str(t) for t in self.worker.plan.kernel),
            triton_version=importlib.metadata.version("triton"),
            max_attempts=settings.max_attempts,
            failed_ttl_s=settings.failed_ttl_s,
            done_ttl_s=settings.done_ttl_s,
            scratch_dir=os.environ.get("TRITON_CACHE_DIR"),  # Triton's own setting, not ours
            executor=executor_for(settings, self.sandbox),
            signer=self.signer,
            signature_ttl_s=settings.signature_ttl_s,
            runner_errors=(SoftTimeLimitExceeded, *TRANSIENT_ERRORS),
        )

    @functools.cached_property
    def signer(self) -> Signer | None:
        """The worker's signing key, for graph artifacts and kernels alike; None where the farm does not sign."""
        settings = self.worker.settings
        if not settings.signing_key_file:
            return None
        return Signer.from_file(settings.signing_key_file, settings.signing_key_id)

    @functools.cached_property
    def sandbox(self) -> sandbox.Sandbox | None:
        """The worker's sandbox, shared by both contexts; None when compiles run here."""
        worker = self.worker
        if worker.sandbox_mode == "off":
            return None
        plan = worker.plan
        # The forkserver's warm-up compile is a CPU graph's; a GPU worker's forkserver must
        # not start the GPU's runtime either, since it forks every run.
        warm = worker.settings.warmup and bool(plan.graph) and not worker.compiles_in_pool and plan.own_gpu is None
        device = plan.own_gpu.device if plan.own_gpu is not None else "cpu"
        return sandbox.for_worker(worker.settings, worker.sandbox_mode, warm_compile=warm, device=device)

    def start_forkserver(self) -> None:
        """Starts the sandbox's forkserver without waiting for it: the imports and header
        builds are done by the first job."""
        box = self.sandbox
        if box is not None and box.forkserver is not None:
            box.forkserver.start(box)


def register(app: Celery, worker: Worker, contexts: JobContexts | None = None) -> JobContexts:
    """Registers the worker's tasks on `app`, each reading `worker` (and `contexts`, by
    default built from it), never a global; returns the contexts."""
    jobs = contexts or JobContexts(worker, functools.partial(_send, app))
    settings = worker.settings
    signals.task_prerun.connect(SOFT_LIMIT.task_started, weak=False)  # once a process: Celery dedupes

    @contextlib.contextmanager
    def time_limit_fails(key: str, namespace: str, what: str) -> Iterator[None]:
        """Celery's soft time limit, hit inside the block, fails the job COMPILE_TIMEOUT."""
        try:
            yield
        except SoftTimeLimitExceeded:
            fail_job(key, jobs.graph, JobError.COMPILE_TIMEOUT, f"{what} ran past the farm's time limit", namespace)

    # shared=False: Celery would otherwise register each task, with this worker's
    # settings, on every app of the process finalized later, in place of that app's own.
    task = functools.partial(app.task, shared=False, **TRANSIENT_RETRY)

    @task(name=COMPILE_TASK)
    def compile_task(key: str, namespace: str = "") -> None:
        """Compiles the job `key` of the tenant namespace `namespace` ("" on an open farm)."""
        began = time.time()
        try:
            with time_limit_fails(key, namespace, "the compile"):
                in_stack_room(run_job, key, jobs.graph, namespace)
        finally:
            if settings.metrics_port:
                record(jobs.graph.store, key, namespace, began)

    @task(name=EXPORT_TASK)
    def export_task(key: str, namespace: str = "") -> None:
        """Builds the AOTInductor package of the export job `key` (workers/jobs/export.py)."""
        began = time.time()
        try:
            with time_limit_fails(key, namespace, "the export"):
                in_stack_room(run_export_job, key, jobs.graph, namespace)
        finally:
            if settings.metrics_port:
                worker_metrics.record_job(jobs.graph.store.tenant(namespace), key, began)

    @task(name=LOWER_TASK)
    def lower_task(key: str, namespace: str, target: str) -> None:
        """Lowers a staged compile from its stored decomposition (workers/jobs/lower.py)."""
        try:
            with time_limit_fails(key, namespace, "the lowering"):
                in_stack_room(run_lowering, key, jobs.graph, namespace, target)
        finally:
            if settings.metrics_port:
                record(jobs.graph.store, key, namespace, None)

    @task(name=BUILD_KERNELS_TASK)
    def build_kernels_task(
        key: str, namespace: str, target: str, kernels: list[list[str]], seal: str = ""
    ) -> None:
        """Builds a batch of a staged compile's C++ kernels (workers/jobs/build.py)."""
        with time_limit_fails(key, namespace, "a kernel build"):
            in_stack_room(run_kernel_batch, key, jobs.graph, namespace, target, kernels, seal)

    @task(name=ASSEMBLE_TASK)
    def assemble_task(key: str, namespace: str) -> None:
        """Writes a staged compile's artifact once all its kernels are built (workers/jobs/)."""
        try:
            in_stack_room(run_assembly, key, jobs.graph, namespace)
        finally:
            if settings.metrics_port:
                record(jobs.graph.store, key, namespace, None)

    @task(
        name=KERNEL_TASK,
        soft_time_limit=settings.kernel_soft_time_limit_s,
        time_limit=settings.kernel_soft_time_limit_s + 30,
    )
    def compile_kernel_task(key: str, namespace: str = "") -> None:
        """Compiles the Triton kernel job `key` (workers/jobs/triton.py)."""
        try:
            in_stack_room(run_kernel_job, key, jobs.kernel, namespace)
        except SoftTimeLimitExceeded:
            fail_kernel_job(
                key, jobs.kernel, JobError.KERNEL_TIMEOUT,
                f"the kernel compile ran past {settings.kernel_soft_time_limit_s}s", namespace,
            )

    return jobs


def record(store: Store, key: str, namespace: str, began: float | None) -> None:
    """Counts a graph job in the metrics once it has ended: a staged compile's graph job
    (its decomposition) and lowering job leave it running, and its assembly ends it
    (`began=None`: the job began with its graph job). The lowering and the assembly can
    both find it ended (a fast assembly ends it before its lowering task returns): the
    first to mark the job record counts it."""
    tenant = store.tenant(namespace)
    job = tenant.get_job(key)
    if job is None or (job.state not in JobState.TERMINAL and (began is None or job.stage in HANDED_ON)):
        return
    if began is None and StageBoard(tenant).count(key, "metrics_counted") > 1:
        return
    worker_metrics.record_job(tenant, key, job.started if began is None else began)


def _store(worker: Worker) -> Store:
    s = worker.settings
    return Store.from_url(s.cache_url, s.redis_prefix, s.blob_url, s.state_url)


def _seal(worker: Worker, signer: Signer | None) -> Seal | None:
    """The record seal: its own key file, else derived from the signing key."""
    if worker.settings.record_key_file:
        return Seal.from_file(worker.settings.record_key_file)
    return Seal.from_signer(signer) if signer is not None else None


def _send(app: Celery, task: str, args: list[Any], queue: str) -> None:
    app.send_task(task, args=args, queue=queue)


def _graph_fingerprint(worker: Worker) -> Fingerprint:
    """The fingerprint of the one target this worker lowers graphs for (workers/serving.py).

    A GPU target lowered without its GPU gets its device properties faked here, in the
    pool process that compiles (workers/gpuless.py).
    """
    plan = worker.plan
    if plan.fake_gpu is not None:
        from workers import gpuless

        gpuless.install(plan.fake_gpu, worker.settings.gpu_properties_file)
    if not plan.graph:
        return local_fingerprint()
    return identity.worker_fingerprint(plan.graph[0], worker.settings.reported_build)
