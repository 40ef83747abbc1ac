"""The whole-graph compile, in one job: `standalone_compile`, then the blobs, then the
signed manifest (written last, so a reader that sees it finds every blob)."""

from __future__ import annotations

import dataclasses
import time

from torchfarm.codes import JobError, Stage
from torchfarm.fx import guards as shape_guards
from torchfarm.fx.vecisa import probed_toolchain
from torchfarm.manifest import KernelRef, Manifest
from workers.compiler import CompileFailed, CompileResult, compile_graph
from workers.fakepg import fake_groups
from workers.limits import cpu_time_limit
from workers.runtime import JobFailed, Prepared, WorkerContext, added_guards, as_job_failure, put_blob
from workers.sandbox import Sandbox, SandboxFailed
from workers.sandbox import compile_whole as compile_in_sandbox


def compile_whole(key: str, ctx: WorkerContext, job: Prepared) -> Manifest:
    """The whole-graph compile, in this job, to the stored and signed manifest."""
    request, decoded = job.request, job.decoded
    ctx.store.update_job(key, stage=Stage.COMPILE)
    if ctx.compile_sandbox is not None:
        result, guards = _compile_sandboxed(ctx, ctx.compile_sandbox, job)
    else:
        mark = shape_guards.snapshot(decoded.shape_env)
        try:
            with cpu_time_limit(ctx.settings.compile_cpu_limit_s), fake_groups(job.request.graph):
                result = compile_graph(
                    decoded.gm,
                    decoded.example_inputs,
                    fake_mode=decoded.fake_mode,
                    dynamic=request.options.dynamic,
                    mode=request.options.mode,
                    inductor_options=job.inductor_options,
                )
        except CompileFailed as e:
            raise as_job_failure(e, ctx) from e
        guards = added_guards(decoded, mark)
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


_SANDBOX_CODES = {
    "graph": JobError.INVALID_GRAPH, "guard": JobError.UNSHIPPABLE_GUARD, "cpu": JobError.COMPILE_TIMEOUT,
}


def sandbox_failure(e: SandboxFailed) -> JobFailed:
    """A sandboxed compile's failure as its job's: the graph's, a guard's, the time
    limit's, or else the compiler's."""
    return JobFailed(_SANDBOX_CODES.get(e.kind, JobError.COMPILE_ERROR), str(e))


def _compile_sandboxed(ctx: WorkerContext, box: Sandbox, job: Prepared) -> tuple[CompileResult, tuple[list, ...]]:
    """The compile in the sandbox's child, which decodes the request again and holds no
    key; what it returns is checked there (workers/sandbox.py) before it is stored."""
    try:
        return compile_in_sandbox(
            box, job.request.SerializeToString(), ctx.settings.max_artifact_bytes,
            ctx.settings.installed_op_modules, on_gpu=job.request.target.device != "cpu",
        )
    except SandboxFailed as e:
        raise sandbox_failure(e) from e


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
        toolchain=probed_toolchain(),
    )
