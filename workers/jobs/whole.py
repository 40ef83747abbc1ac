"""The whole-graph compile, in one job: `standalone_compile`, then the blobs, then the
signed manifest (written last, so a reader that sees it finds every blob)."""

from __future__ import annotations

import dataclasses
import time

from torchfarm.fx import autotune
from torchfarm.fx.vecisa import probed_toolchain
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import KernelRef, Manifest
from workers.compiler import CompileResult
from workers.runtime import JobFailed, Prepared, WorkerContext, put_blob


def compile_whole(key: str, ctx: WorkerContext, job: Prepared) -> Manifest:
    """The whole-graph compile, in this job, to the stored and signed manifest."""
    ctx.store.update_job(key, stage=Stage.COMPILE)
    result, guards = ctx.executor.compile_whole(job)
    size = len(result.payload) + sum(len(k.source) + len(k.binary) for k in result.kernels)
    if size > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            JobError.ARTIFACT_TOO_LARGE,
            f"the artifact is {size} bytes; the farm stores at most {ctx.settings.max_artifact_bytes}",
        )
    ctx.store.update_job(key, stage=Stage.STORE)
    t1 = time.perf_counter()
    manifest = _store(key, ctx, result, {"decode": job.decode_s, **result.timings})
    manifest = dataclasses.replace(manifest, guards=guards)
    timings = {
        **manifest.timings,
        "store": time.perf_counter() - t1,
        "total": time.perf_counter() - job.began,
    }
    manifest = dataclasses.replace(manifest, timings=timings)
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds every blob
    return manifest


def _store(
    key: str, ctx: WorkerContext, result: CompileResult, timings: dict[str, float]
) -> Manifest:
    kernels = tuple(
        KernelRef(
            name=k.name,
            kind=k.kind,
            source=put_blob(ctx.store, k.source),
            binary=put_blob(ctx.store, k.binary),
        )
        for k in result.kernels
    )
    return Manifest(
        key=key,
        fingerprint=ctx.fingerprint.to_dict(),
        payload=put_blob(ctx.store, result.payload),
        kernels=kernels,
        timings=timings,
        worker=ctx.name,
        created=time.time(),
        tenant=ctx.store.namespace,
        toolchain={**probed_toolchain(), **autotune.in_toolchain(result.autotune)},
    )
