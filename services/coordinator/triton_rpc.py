"""The coordinator's kernel path: one Triton kernel → its binary, free of gRPC and torch.

compile: check the request (target, source structure, signature, options) → pick the
Triton version → derive the kernel key → answer from the kernel cache → or join the
in-flight job → or, if a live worker serves the target's kernel queue, create the job
and queue it → wait for the job's record to end → read the kernel's manifest and blobs
from the cache, refusing (and recompiling) one whose signature this coordinator rejects,
as it does artifacts.

It shares the job board, the blob store and the dispatcher with graph compiles
(services/coordinator/farm.py); a kernel job lives on `kernels.<target>` queues
(torchfarm/wire/routing.py) and its record under `tf:kernel:<key>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.coordinator.errors import (
    BackendUnavailable,
    InvalidRequest,
    KernelFailed,
    NoWorker,
    RequestTooLarge,
)
from services.coordinator.farm import Farm
from services.coordinator.runner import Runner
from torchfarm.kernels import triton_check
from torchfarm.storage.store import JobState, Store
from torchfarm.trust.tokens import OPEN, Tenant
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, labels, routing
from torchfarm.wire.codes import JobError, Reason
from torchfarm.wire.manifest import Manifest
from torchfarm.wire.targets import Target, TargetError

log = logging.getLogger(__name__)

KERNEL_WAIT_S = 120.0
"""How long a CompileKernel call waits for the worker before answering UNAVAILABLE."""

CLIENT_ERRORS = {
    JobError.INVALID_KERNEL: Reason.INVALID_KERNEL,
    JobError.KERNEL_COMPILE_ERROR: Reason.KERNEL_COMPILE_ERROR,
}
"""Failure codes caused by the kernel itself, and the refusal each is answered with
(INVALID_ARGUMENT, never retried)."""


@dataclass(frozen=True)
class CompiledKernel:
    key: str
    cache_hit: bool
    manifest: Manifest
    """The kernel's manifest, signed where the farm signs (torchfarm/kernels/kernel_artifact.py)."""
    metadata: str
    assembly: str
    binary: bytes


class KernelService:
    def __init__(self, farm: Farm, runner: Runner, wait_s: float = KERNEL_WAIT_S):
        self.farm = farm
        self.runner = runner
        """Where each blocking store call runs: the one `farm` uses."""
        self.wait_s = wait_s

    async def compile(
        self, request: farm_pb2.KernelRequest, size: int, tenant: Tenant = OPEN
    ) -> CompiledKernel:
        """The kernel's binary. A new kernel job counts against the tenant's quota of
        jobs in flight, as a Submit's does (Farm.charge)."""
        settings = self.farm.settings
        namespace = tenant.namespace
        if size > settings.max_request_bytes:
            raise RequestTooLarge(
                f"request is {size} bytes; the farm accepts at most {settings.max_request_bytes}"
            )
        target, queue = await self.runner.compute(_checked, request, tenant=namespace)
        workers = await self.runner.run(self.farm.store.live_workers)
        request = _with_triton_version(request, str(target), workers)
        key = await self.runner.compute(keys.compute_kernel_key, request, namespace, tenant=namespace)
        store = self.farm.store.tenant(namespace)
        manifest = await self.runner.run(self._start, store, key, queue, request, tenant)
        hit = manifest is not None
        if manifest is None:
            await self._wait(store, key, tenant)
            manifest = await self.runner.run(self._cached, store, key)
        kernel = None if manifest is None else await self.runner.run(self._read, store, manifest, hit)
        if kernel is None:
            raise BackendUnavailable(
                f"kernel {keys.short(key)} was evicted or refused before it was read", Reason.KERNEL_EVICTED
            )
        log.info(
            "kernel key=%s target=%s name=%s hit=%s label=%s",
            keys.short(key), target, request.name, hit, request.label,
        )
        return kernel

    def _cached(self, store: Store, key: str) -> Manifest | None:
        """The kernel's manifest if the cache holds it whole and this coordinator would
        serve it (`Farm.refuses`); a refused one is dropped, so the kernel compiles again."""
        manifest = store.get_kernel(key)
        if manifest is not None and self.farm.refuses(manifest, key, store.namespace):
            store.delete_kernel(key)
            return None
        return manifest

    def _read(self, store: Store, manifest: Manifest, hit: bool) -> CompiledKernel | None:
        """The kernel `manifest` names, its blobs read; None where one was evicted or is
        not the UTF-8 text a reply carries (then the record is dropped)."""
        key, ref = manifest.key, manifest.kernels[0]
        metadata, assembly, binary = (
            store.get_blob(d) for d in (manifest.payload.digest, ref.source.digest, ref.binary.digest)
        )
        if metadata is None or assembly is None or binary is None:
            return None
        try:
            return CompiledKernel(key, hit, manifest, metadata.decode(), assembly.decode(), binary)
        except UnicodeDecodeError:  # a reply's text fields are UTF-8; a worker writes no other
            log.warning("key=%s cached kernel refused (its text is not UTF-8); recompiling", keys.short(key))
            store.delete_kernel(key)
            return None

    def _start(
        self, store: Store, key: str, queue: str, request: farm_pb2.KernelRequest, tenant: Tenant
    ) -> Manifest | None:
        """The kernel's manifest on a cache hit; otherwise None, once a job for `key` is
        queued or running."""
        cached = self._cached(store, key)
        if cached is not None:
            return cached
        job = store.get_job(key)
        if job is not None and (self.farm.is_stale(job) or job.state == JobState.SUCCEEDED):
            store.delete_job(key)  # stuck, or done but its record was evicted
            job = None
        if job is not None:
            return None  # join it; a failed one answers at once in _wait
        settings = self.farm.settings
        if store.create_job(
            key, queue, request.label, settings.job_ttl_s,
            request=request.SerializeToString(), kind="kreq",
        ):
            self.farm.charge(store, key, tenant)
            try:
                self.farm.dispatcher.send_kernel(key, queue, tenant.namespace)
            except Exception:
                store.abandon_job(key)
                store.forget_job(tenant.name, key)
                raise
        return None

    async def _wait(self, store: Store, key: str, tenant: Tenant) -> None:
        async with self.farm.wait_slot(tenant), self.farm.job_changes(key, tenant) as changed:
            await self._wait_for(store, key, changed)

    async def _wait_for(self, store: Store, key: str, changed: Callable[[], Awaitable[None]]) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            job = await self.runner.run(store.get_job, key)
            if job is None:
                if await self.runner.run(store.get_kernel, key) is not None:
                    return
                raise BackendUnavailable(f"kernel job {keys.short(key)} vanished")
            if job.state == JobState.SUCCEEDED:
                return
            if job.state == JobState.FAILED:
                message = f"{job.error_code}: {job.message}"
                if job.error_code in CLIENT_ERRORS:
                    raise InvalidRequest(message, reason=CLIENT_ERRORS[JobError(job.error_code)])
                raise KernelFailed(message)
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"kernel {keys.short(key)} did not compile within {self.wait_s:.0f}s "
                    f"(state {job.state})", reason=Reason.KERNEL_TIMEOUT,
                )
            with contextlib.suppress(TimeoutError):  # woken, or the deadline is up
                await asyncio.wait_for(changed(), max(0.0, deadline - time.monotonic()) + 0.01)


def _with_triton_version(
    request: farm_pb2.KernelRequest, target: str, workers: dict[str, dict[str, Any]]
) -> farm_pb2.KernelRequest:
    """The request, with the Triton version of a live worker that will compile it.

    A client that names a version gets exactly that or UNAVAILABLE; one that names
    none gets the newest version a live worker for the target runs. Either way the
    version is in the key, since the binary depends on it.
    """
    versions = sorted(
        {
            _kernel_triton(w)
            for w in workers.values()
            if routing.KERNEL in routing.served_targets(w).get(target, ())
        },
        key=_version_key,
    )
    if not versions:
        raise NoWorker(routing.unserved_message(target, routing.KERNEL, workers))
    wanted = request.triton_version
    if wanted and wanted not in versions:
        raise NoWorker(
            f"no live worker compiles kernels for {target} with Triton {wanted} "
            f"(live: {', '.join(v or '?' for v in versions)})"
        )
    out = farm_pb2.KernelRequest()
    out.CopyFrom(request)
    out.triton_version = wanted or versions[-1]
    return out


def _kernel_triton(worker: dict[str, Any]) -> str:
    """The Triton a worker's kernel jobs compile with: its heartbeat's `triton`, else
    its build's (a worker that serves kernels only, or one from before the field)."""
    return str(worker.get("triton") or worker.get("fingerprint", {}).get("triton_version", ""))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.+-]", version))


def _checked(request: farm_pb2.KernelRequest) -> tuple[Target, str]:
    """The target and queue of a well-formed kernel request; InvalidRequest otherwise.
    Reading up to 256 KiB of source is pure Python: `compile` runs it off the loop."""
    try:
        labels.check_label(request.label)
        target = routing.target_of(request.target, "a kernel compile")
        queue = routing.queue_name(target, routing.KERNEL)
        checked = triton_check.check_kernel_source(request.source, request.name)
        triton_check.check_signature(request, checked)
        triton_check.check_options(request.options)
    except labels.BadLabel as e:
        raise InvalidRequest(str(e), reason=Reason.INVALID_REQUEST) from e
    except (TargetError, triton_check.KernelRejected) as e:
        raise InvalidRequest(str(e), reason=Reason.INVALID_KERNEL) from e
    return target, queue
