"""The Triton kernel job (the CompileKernel RPC): request → checks → Triton compile for
the named target (the executor's `compile_triton`: workers/executor.py) → store. Delivered like
every job (`workers.runtime.run_delivery`): a redelivered job whose kernel is already
cached finishes at once, blobs are written by content digest, and the record
(`tf:kernel:<key>`) is written after its blobs. A failure's message goes to the client,
so it passes `triton_errors.client_message` first: bounded, and free of the worker's
environment, paths and object reprs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, routing
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import blob_digest
from torchfarm.wire.targets import TargetError
from workers.executor import Executor
from workers.inprocess import InProcessExecutor
from workers.runtime import Delivery, JobFailed, load_request, record_failure, run_delivery
from workers.triton_errors import client_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelContext:
    store: Store
    name: str
    targets: frozenset[str]
    """Targets this worker compiles kernels for ("cuda:sm_90", ...)."""
    triton_version: str
    max_attempts: int = 3
    failed_ttl_s: int = 60
    done_ttl_s: int = 3600
    scratch_dir: str | None = None
    """The job's scratch directory (Triton's cache): paths under it may appear in errors."""
    executor: Executor = field(default_factory=InProcessExecutor)
    """Where Triton runs (workers/executor.py): the sandbox's secret-free child, or this process."""


@dataclass(frozen=True)
class KernelRecord:
    """A compiled kernel's record, as stored; the job's outcome."""

    fields: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)

    def total_bytes(self) -> int:
        return int(self.fields["binary"]["size"])


def run_kernel_job(key: str, ctx: KernelContext, namespace: str = "") -> None:
    store = ctx.store.tenant(namespace)
    delivery = Delivery(
        ctx.name, ctx.max_attempts, ctx.done_ttl_s, ctx.failed_ttl_s,
        lambda message: client_message(message, scratch=ctx.scratch_dir),
    )
    record = run_delivery(
        key, store, delivery, lambda s: s.get_kernel(key) is not None,
        lambda s: _compile_and_store(key, ctx, s),
    )
    if isinstance(record, KernelRecord):
        log.info(
            "kernel key=%s %s for %s: %d bytes in %.2fs", keys.short(key), record.fields["name"],
            record.fields["target"], record.total_bytes(), record.fields["seconds"],
        )


def _compile_and_store(key: str, ctx: KernelContext, store: Store) -> KernelRecord:
    store.update_job(key, stage=Stage.COMPILE)
    t0 = time.perf_counter()
    request = load_request(key, store, farm_pb2.KernelRequest, "kernel")
    try:
        target = routing.target_of(request.target, "a kernel compile")
    except TargetError as e:
        raise JobFailed(JobError.INVALID_KERNEL, str(e)) from e
    if str(target) not in ctx.targets:
        raise JobFailed(JobError.WRONG_TARGET, f"this worker compiles kernels for {sorted(ctx.targets)}, not {target}")
    if request.triton_version != ctx.triton_version:
        raise JobFailed(
            JobError.BUILD_MISMATCH,
            f"the kernel needs Triton {request.triton_version}; this worker has {ctx.triton_version}",
        )
    result = ctx.executor.compile_triton(request, target)
    store.update_job(key, stage=Stage.STORE)
    binary = _put(store, result.binary)
    assembly = _put(store, result.assembly.encode()) if result.assembly else None
    fields = {
        "key": key,
        "target": str(target),
        "name": request.name,
        "kind": result.kind,
        "binary": binary,
        "assembly": assembly,
        "metadata": result.metadata,
        "triton_version": ctx.triton_version,
        "worker": ctx.name,
        "seconds": result.seconds,
        "created": time.time(),
    }
    store.put_kernel(key, fields)  # last: a reader that sees it finds both blobs
    return KernelRecord(fields, {"kernel": result.seconds, "total": time.perf_counter() - t0})


def fail_kernel_job(key: str, ctx: KernelContext, code: JobError, message: str, namespace: str = "") -> None:
    message = client_message(message, scratch=ctx.scratch_dir)
    record_failure(key, ctx.store.tenant(namespace), code, message, ctx.failed_ttl_s)


def _put(store: Store, data: bytes) -> dict:
    digest = blob_digest(data)
    store.put_blob(digest, data)
    return {"digest": digest, "size": len(data)}
