"""The staged compile's assembly (`assemble_task`, on the stages queue): every binary
cached? Then the manifest (the one the whole-graph path writes, plus `stages`) is signed
and written, and the job is SUCCEEDED. Binaries evicted meanwhile are sent to be built
again, a bounded number of times (`KERNELS_LOST` after that)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from torchfarm.fx import autotune
from torchfarm.fx.vecisa import probed_toolchain
from torchfarm.storage.store import Attempts
from torchfarm.trust.seal import TamperedRecord
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import KernelRef, Manifest
from workers.board import BUILD, CACHED, Plan, StageBoard
from workers.jobs.sending import claim, send_assembly, send_builds, stage_record
from workers.jobs.stage import run_stage
from workers.runtime import (
    JobFailed,
    WorkerContext,
    get_verified_blob,
    in_tenant,
)

log = logging.getLogger(__name__)


def run_assembly(key: str, ctx: WorkerContext, namespace: str) -> None:
    """Writes the staged job's artifact from its plan and the cached kernel binaries,
    exactly as the whole-graph path writes one. Missing binaries (evicted meanwhile)
    are sent to be built again, a bounded number of times."""
    ctx = in_tenant(ctx, namespace)

    def work(board: StageBoard) -> Manifest | None:
        try:
            plan = board.get_plan(key)
        except TamperedRecord as e:
            raise JobFailed(JobError.RECORD_TAMPERED, str(e)) from e
        if plan is None:
            raise JobFailed(JobError.PLAN_EXPIRED, "the staged compile's plan is no longer in the cache")
        return _assemble(key, ctx, plan, board)

    manifest = run_stage(key, ctx, Attempts.ASSEMBLY, "assembly", work)
    if manifest is not None:
        log.info(
            "job key=%s assembled: %d kernels, %d bytes, %.2fs since lowering began",
            keys.short(key), len(manifest.kernels), manifest.total_bytes(),
            manifest.timings.get("total", 0.0),
        )


def _assemble(key: str, ctx: WorkerContext, plan: Plan, board: StageBoard) -> Manifest | None:
    t0 = time.time()
    wanted = list(dict.fromkeys(k.cache_key for k in plan.kernels))
    cached = board.cached_kernels(wanted)
    binaries = {k: ref for k, (ref, _) in cached.items()}
    missing = [k for k in wanted if k not in binaries]
    if missing:
        resends = board.count(key, "kernel_resends")
        if resends == 0:  # the job's record expired: no one waits for it
            return None
        if resends > ctx.settings.max_attempts:
            raise JobFailed(JobError.KERNELS_LOST, f"{len(missing)} kernel binaries left the cache again")
        log.warning("job key=%s: %d kernel binaries missing at assembly; building them again",
                    keys.short(key), len(missing))
        board.forget_binaries(missing)  # a record whose blob is gone would read as cached
        ctx.store.update_job(key, stage=Stage.KERNELS)
        by_key = {k.cache_key: k for k in plan.kernels}
        again = [by_key[k] for k in missing]
        verdicts = claim(ctx, key, plan.target, again)
        send_builds(ctx, key, plan.target, [k for k, v in zip(again, verdicts, strict=False) if v == BUILD])
        if all(v == CACHED for v in verdicts):  # built meanwhile: nothing will send it
            send_assembly(ctx.store, ctx, key, plan.target)
        return None
    kernels = tuple(
        KernelRef(name=k.name, kind=k.kind, source=k.source, binary=binaries[k.cache_key])
        for k in plan.kernels
    )
    manifest = Manifest(
        key=key, fingerprint=ctx.fingerprint.to_dict(), payload=plan.payload, kernels=kernels,
        worker=ctx.name, created=time.time(), tenant=ctx.store.namespace,
        guards=tuple(plan.guards), toolchain={**probed_toolchain(), **autotune.in_toolchain(plan.autotune)},
    )
    if manifest.total_bytes() > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            JobError.ARTIFACT_TOO_LARGE,
            f"the artifact is {manifest.total_bytes()} bytes; the farm stores at most "
            f"{ctx.settings.max_artifact_bytes}",
        )
    # Sign only what was verified: every blob's bytes against its digest.
    if any(get_verified_blob(ctx.store, b.digest) is None for b in manifest.blobs()):
        raise JobFailed(JobError.PLAN_EXPIRED, "the payload or a kernel source left the cache")
    fields = board.job_fields(key)
    schedule = _schedule(plan, {k: seconds for k, (_, seconds) in cached.items()})
    stages, timings = _timings(plan, fields, len(wanted), schedule, t0, ctx.name)
    manifest = dataclasses.replace(manifest, timings=timings, stages=tuple(stages))
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds every blob
    return manifest


def _schedule(plan: Plan, seconds: dict[str, float]) -> list[list[float]]:
    """Each kernel-build job as [seconds after the lowering began that it was sent, build
    seconds of its kernels]: what bench/scaling.py schedules over N workers."""
    return [
        [after, round(sum(seconds.get(k, 0.0) for k in batch_keys), 3)]
        for after, batch_keys in plan.sends
    ]


def _timings(
    plan: Plan, fields: dict[str, str], total_kernels: int, schedule: list[list[float]],
    t0: float, worker: str,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    def f(name: str) -> float:
        return float(fields.get(name, 0.0) or 0.0)

    built = f("k_started") > 0
    kernels_s = max(f("k_ended") - f("k_started"), 0.0) if built else 0.0
    hit = int(f("kernels_hit"))
    workers = sorted(n.removeprefix("kworker:") for n in fields if n.startswith("kworker:"))
    assemble_s = time.time() - t0
    stages = [
        *plan.stages,
        {
            **stage_record(
                "kernels", kernels_s, f("k_started") - f("k_sent") if built else 0.0,
                ",".join(workers), total_kernels, hit,
            ),
            "sends": schedule,
            "lowered_after_s": plan.lowered_after,
        },
        stage_record("assemble", assemble_s, t0 - f("a_sent") if f("a_sent") else 0.0, worker),
    ]
    timings = {
        **plan.timings,
        "kernels": kernels_s,
        "kernels_busy": f("k_busy"),
        "assemble": assemble_s,
        "total": time.time() - f("started") if f("started") else 0.0,
    }
    return stages, timings
