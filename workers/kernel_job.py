"""A worker's kernel job, free of Celery: request → checks → Triton compile → store.

Like `workers/job.py`, idempotent under at-least-once delivery: a redelivered job whose
kernel is already cached finishes at once, and blobs are written by content digest.
The record (`tf:kernel:<key>`) is written after its blobs. A failure's message goes to
the client, so it passes `kernel_errors.client_message` first: bounded, and free of the
worker's environment, paths and object reprs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from torchfarm import keys, routing
from torchfarm.kernelcheck import KernelRejected
from torchfarm.manifest import blob_digest
from torchfarm.store import JobState, Store
from torchfarm.targets import TargetError
from torchfarm.v1 import farm_pb2
from workers.kernel_errors import client_message
from workers.kernels import KernelCompileError, compile_kernel

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


class _Failed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def run_kernel_job(key: str, ctx: KernelContext, namespace: str = "") -> None:
    store = ctx.store.tenant(namespace)
    attempt = store.incr_attempts(key)
    try:
        if store.get_kernel(key) is not None:
            store.update_job(key, state=JobState.SUCCEEDED, stage="done")
            return
        if attempt > ctx.max_attempts:
            raise _Failed("TOO_MANY_ATTEMPTS", f"the kernel job was delivered {attempt} times")
        store.update_job(key, state=JobState.RUNNING, stage="compile", worker=ctx.name, started=time.time())
        t0 = time.perf_counter()
        request = _load(key, store, namespace)
        try:
            target = routing.target_of(request.target, "a kernel compile")
        except TargetError as e:
            raise _Failed("INVALID_KERNEL", str(e)) from e
        if str(target) not in ctx.targets:
            raise _Failed("WRONG_TARGET", f"this worker compiles kernels for {sorted(ctx.targets)}, not {target}")
        if request.triton_version != ctx.triton_version:
            raise _Failed(
                "BUILD_MISMATCH",
                f"the kernel needs Triton {request.triton_version}; this worker has {ctx.triton_version}",
            )
        try:
            result = compile_kernel(request, target)
        except KernelRejected as e:
            raise _Failed("INVALID_KERNEL", str(e)) from e
        except KernelCompileError as e:
            raise _Failed("KERNEL_COMPILE_ERROR", str(e)) from e
        store.update_job(key, stage="store")
        binary = _put(store, result.binary)
        assembly = _put(store, result.assembly.encode()) if result.assembly else None
        record = {
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
        store.put_kernel(key, record)  # last: a reader that sees it finds both blobs
    except _Failed as e:
        message = client_message(str(e), scratch=ctx.scratch_dir)
        log.warning("kernel key=%s failed: %s: %s", keys.short(key), e.code, message[-500:])
        store.fail_job(key, e.code, message, ctx.failed_ttl_s)
        return
    total = time.perf_counter() - t0
    store.update_job(
        key, state=JobState.SUCCEEDED, stage="done",
        timings={"kernel": result.seconds, "total": total}, artifact_bytes=len(result.binary),
    )
    store.expire_job(key, ctx.done_ttl_s)
    log.info(
        "kernel key=%s %s for %s: %d bytes in %.2fs", keys.short(key), request.name, target,
        len(result.binary), result.seconds,
    )


def fail_kernel_job(key: str, ctx: KernelContext, code: str, message: str, namespace: str = "") -> None:
    message = client_message(message, scratch=ctx.scratch_dir)
    ctx.store.tenant(namespace).fail_job(key, code, message, ctx.failed_ttl_s)


def _load(key: str, store: Store, namespace: str) -> farm_pb2.KernelRequest:
    data = store.get_kernel_request(key)
    if data is None:
        raise _Failed("REQUEST_EXPIRED", "the kernel request is no longer in the cache")
    request = farm_pb2.KernelRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as e:
        raise _Failed("MALFORMED_REQUEST", f"cannot parse the kernel request: {e}") from e
    if keys.compute_kernel_key(request, namespace) != key:
        raise _Failed("MALFORMED_REQUEST", "the stored kernel request does not match its key")
    return request


def _put(store: Store, data: bytes) -> dict:
    digest = blob_digest(data)
    store.put_blob(digest, data)
    return {"digest": digest, "size": len(data)}
