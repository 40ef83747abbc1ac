"""The Triton kernel job (the CompileKernel RPC): request → checks → Triton compile for
the named target (the executor's `compile_triton`: workers/executor.py) → store.

Delivered like every job (`workers.runtime.run_delivery`): a redelivered job whose
kernel is already cached finishes at once, blobs are written by content digest, and the
record (`tf:kernel:<key>`: the kernel's manifest, signed where the farm signs,
torchfarm/kernels/kernel_artifact.py) is written after its blobs. A failure's message
goes to the client, so it passes `triton_errors.client_message` first: bounded, and
free of the worker's environment, paths and object reprs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from torchfarm.kernels import kernel_artifact
from torchfarm.storage.store import Store
from torchfarm.trust.signing import DEFAULT_TTL_S, Signer
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, routing
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import Manifest
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
    signer: Signer | None = None
    """Signs each kernel's manifest, as graph jobs sign artifacts; None on a farm that does not sign."""
    signature_ttl_s: int = DEFAULT_TTL_S
    runner_errors: tuple[type[BaseException], ...] = ()
    """The task runner's own exceptions (workers/runtime.py `Delivery`)."""


def run_kernel_job(key: str, ctx: KernelContext, namespace: str = "") -> None:
    store = ctx.store.tenant(namespace)
    delivery = Delivery(
        ctx.name, ctx.max_attempts, ctx.done_ttl_s, ctx.failed_ttl_s,
        lambda message: client_message(message, scratch=ctx.scratch_dir), ctx.runner_errors,
    )
    record = run_delivery(
        key, store, delivery, lambda s: s.get_kernel(key) is not None,
        lambda s: _compile_and_store(key, ctx, s),
    )
    if isinstance(record, Manifest):
        log.info(
            "kernel key=%s %s for %s: %d bytes in %.2fs", keys.short(key), record.kernels[0].name,
            record.fingerprint["target"], record.total_bytes(), record.timings["kernel"],
        )


def _compile_and_store(key: str, ctx: KernelContext, store: Store) -> Manifest:
    store.update_job(key, stage=Stage.COMPILE)
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
    manifest, blobs = kernel_artifact.build_manifest(
        key, store.namespace, target=str(target), triton_version=ctx.triton_version,
        name=request.name, kind=result.kind, binary=result.binary, assembly=result.assembly,
        metadata=result.metadata, worker=ctx.name, seconds=result.seconds,
    )
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.signature_ttl_s)
    for digest, data in blobs.items():
        store.put_blob(digest, data)
    store.put_kernel(manifest)  # last: a reader that sees it finds every blob
    return manifest


def fail_kernel_job(key: str, ctx: KernelContext, code: JobError, message: str, namespace: str = "") -> None:
    message = client_message(message, scratch=ctx.scratch_dir)
    record_failure(key, ctx.store.tenant(namespace), code, message, ctx.failed_ttl_s)

