"""The staged compile: lowering, then C++ kernel builds on every worker of the target,
then assembly. Plain functions, no Celery; workers/tasks.py wraps them.

    compile_task (graph queue)        build_kernels × N (stages queue)    assemble (stages queue)
    ──────────────────────────        ────────────────────────────────    ───────────────────────
    run_job: decode, lower_graph      run_kernel_batch: cache check,      run_assembly: every
    (AOTAutograd + Inductor, C++      build each spec, store binary,      binary cached? → sign
    builds deferred) → fan_out:       release its keys from the job's     the manifest, job
    plan + pending set in Redis,  ──▶ pending set; the batch that     ──▶ SUCCEEDED. Missing
    cache hits skip, misses sent      empties it sends the assembly       ones → sent again.

No task waits for another: each stage ends by sending the next one, and the barrier is
a Redis set (torchfarm/stages.py). A worker lost mid-stage is covered by Celery's
acks_late redelivery; every stage is idempotent and counts its deliveries against
`max_attempts` on the job record.

Decomposition (AOTAutograd) runs inside the lowering job and is timed as its own stage:
torch 2.13 has no serialized form of AOTAutograd's output that Inductor can take in
another process without pickle (ARCHITECTURE.md, "The staged compile").
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any

from sdk.loader import KernelSpec, kernel_name
from torchfarm import keys, routing, targets
from torchfarm.manifest import KernelRef, Manifest
from torchfarm.stages import Plan, PlannedKernel, StageBoard, kernel_cache_key
from torchfarm.store import JobState
from workers.compiler import CompileFailed, LoweredGraph, build_kernel
from workers.job import JobFailed, WorkerContext, _fail, _put, as_job_failure
from workers.limits import cpu_time_limit

log = logging.getLogger(__name__)

HANDED_ON = frozenset({"kernels", "assembling"})
"""Stages of a staged job after its lowering job has ended: later jobs finish it."""


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


def _queue(target: str) -> str:
    return routing.stage_queue(targets.parse(target))


def _send(ctx: WorkerContext, task: str, args: list[Any], queue: str) -> None:
    if ctx.send is None:
        raise RuntimeError("this worker context cannot send stage jobs (WorkerContext.send)")
    ctx.send(task, args, queue)


def _batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def fan_out(
    key: str, ctx: WorkerContext, target: str, lowered: LoweredGraph,
    guards: tuple[Any, ...], decode_s: float,
) -> None:
    """Ends the lowering job: stores the payload and kernel specs, records the plan and
    the kernels still to build, then sends their build jobs (or the assembly at once
    when the kernel cache holds every one)."""
    store, board = ctx.store, StageBoard(ctx.store)
    build = ctx.fingerprint.to_dict()
    t0 = time.perf_counter()
    kernels = [
        PlannedKernel(
            name=kernel_name(spec),
            kind="cpp" if KernelSpec.from_bytes(spec).is_library() else "cpp-object",
            source=_put(store, spec),
            cache_key=kernel_cache_key(spec, target, build),
        )
        for spec in lowered.specs
    ]
    wanted = list(dict.fromkeys(k.cache_key for k in kernels))
    hits = board.cached_binaries(wanted)
    misses = [k for k in wanted if k not in hits]
    job = store.get_job(key)
    queued = (job.started - job.created) if job is not None and job.started else 0.0
    t = lowered.timings
    decompose = decode_s + t.get("decompose", 0.0)
    stages = [
        stage_record("decompose", decompose, queued, ctx.name),
        stage_record(
            "lower", t["compile"] - t.get("decompose", 0.0) + t["collect"]
            + time.perf_counter() - t0, 0.0, ctx.name,
        ),
    ]
    plan = Plan(
        payload=_put(store, lowered.payload), kernels=kernels, target=target,
        guards=list(guards), stages=stages, timings={"decode": decode_s, **t},
    )
    ttl = ctx.settings.done_ttl_s
    board.put_plan(key, plan, misses, ttl)
    now = time.time()
    store.update_job(
        key, stage="kernels" if misses else "assembling", stages=stages,
        kernels_total=len(wanted), kernels_done=len(hits), kernels_hit=len(hits),
        k_sent=now, a_sent=None if misses else now,
    )
    queue = _queue(target)
    for batch in _batches(misses, ctx.settings.kernel_batch):
        _send(ctx, routing.BUILD_KERNELS_TASK, [key, store.namespace, batch], queue)
    if not misses:
        _send(ctx, routing.ASSEMBLE_TASK, [key, store.namespace], queue)
    log.info(
        "job key=%s lowered: %d kernels, %d in the kernel cache, %d build jobs sent to %s",
        keys.short(key), len(wanted), len(hits), len(_batches(misses, ctx.settings.kernel_batch)),
        queue,
    )


def _live_job(key: str, ctx: WorkerContext) -> bool:
    job = ctx.store.get_job(key)
    if job is None or job.state in JobState.TERMINAL:
        log.info("job key=%s is %s; stage job dropped", keys.short(key), job.state if job else "gone")
        return False
    return True


def run_kernel_batch(key: str, ctx: WorkerContext, namespace: str, cache_keys: list[str]) -> None:
    """Builds the kernels `cache_keys` of the staged job `key` that the kernel cache does
    not hold, stores them, and sends the assembly if they were the job's last."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    board = StageBoard(ctx.store)
    if not _live_job(key, ctx):
        return
    batch = hashlib.sha256(",".join(sorted(cache_keys)).encode()).hexdigest()[:16]
    attempt = board.count(key, f"kattempts:{batch}")
    try:
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS",
                f"a kernel-build job was delivered {attempt} times; a worker was lost on each try",
            )
        plan = board.get_plan(key)
        if plan is None:
            raise JobFailed("PLAN_EXPIRED", "the staged compile's plan is no longer in the cache")
        board.note_kernel_start(key, ctx.name)
        if ctx.settings.kernel_job_delay_s:
            time.sleep(ctx.settings.kernel_job_delay_s)  # test hook (WorkerSettings)
        busy = _build_missing(key, ctx, plan, cache_keys, board)
    except JobFailed as e:
        _fail(key, ctx, e.code, str(e))
        return
    hits = len(cache_keys) - busy[1]
    left = board.release(key, cache_keys, hits, busy[0])
    log.info(
        "job key=%s: %d kernels built, %d found cached in %.2fs; %d still pending",
        keys.short(key), busy[1], hits, busy[0], left,
    )
    if left == 0:
        ctx.store.update_job(key, stage="assembling", a_sent=time.time())
        _send(ctx, routing.ASSEMBLE_TASK, [key, namespace], _queue(plan.target))


def _build_missing(
    key: str, ctx: WorkerContext, plan: Plan, cache_keys: list[str], board: StageBoard
) -> tuple[float, int]:
    """(build seconds, kernels built) for the batch's kernels not yet cached."""
    by_key = {k.cache_key: k for k in plan.kernels}
    unknown = [k for k in cache_keys if k not in by_key]
    if unknown:
        raise JobFailed("MALFORMED_REQUEST", f"kernel {unknown[0][:12]} is not in the job's plan")
    cached = board.cached_binaries(cache_keys)
    t0, built = time.perf_counter(), 0
    for cache_key in cache_keys:
        if cache_key in cached:
            continue
        spec = ctx.store.get_blob(by_key[cache_key].source.digest)
        if spec is None:
            raise JobFailed("PLAN_EXPIRED", "a kernel's source left the cache before its build")
        t1 = time.perf_counter()
        try:
            with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
                kernel = build_kernel(spec)
        except CompileFailed as e:
            raise as_job_failure(e, ctx) from e
        board.put_binary(cache_key, kernel.binary, ctx.name, time.perf_counter() - t1)
        built += 1
    return time.perf_counter() - t0, built


def run_assembly(key: str, ctx: WorkerContext, namespace: str) -> None:
    """Writes the staged job's artifact from its plan and the cached kernel binaries,
    exactly as the whole-graph path writes one. Missing binaries (evicted meanwhile)
    are sent to be built again, a bounded number of times."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    store, board = ctx.store, StageBoard(ctx.store)
    if store.get_manifest(key) is not None:
        store.update_job(key, state=JobState.SUCCEEDED, stage="done")
        board.clear(key)
        return
    if not _live_job(key, ctx):
        return
    try:
        if board.count(key, "assemble_attempts") > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS", "the assembly was delivered too often; a worker was lost each time"
            )
        plan = board.get_plan(key)
        if plan is None:
            raise JobFailed("PLAN_EXPIRED", "the staged compile's plan is no longer in the cache")
        manifest = _assemble(key, ctx, plan, board)
    except JobFailed as e:
        _fail(key, ctx, e.code, str(e))
        return
    if manifest is None:
        return
    store.update_job(
        key, state=JobState.SUCCEEDED, stage="done", timings=manifest.timings,
        stages=list(manifest.stages), artifact_bytes=manifest.total_bytes(),
    )
    store.expire_job(key, ctx.settings.done_ttl_s)
    board.clear(key)
    log.info(
        "job key=%s assembled: %d kernels, %d bytes, %.2fs since lowering began",
        keys.short(key), len(manifest.kernels), manifest.total_bytes(),
        manifest.timings.get("total", 0.0),
    )


def _assemble(key: str, ctx: WorkerContext, plan: Plan, board: StageBoard) -> Manifest | None:
    t0 = time.time()
    wanted = list(dict.fromkeys(k.cache_key for k in plan.kernels))
    binaries = board.cached_binaries(wanted)
    missing = [k for k in wanted if k not in binaries]
    if missing:
        if board.count(key, "kernel_resends") > ctx.settings.max_attempts:
            raise JobFailed("KERNELS_LOST", f"{len(missing)} kernel binaries left the cache again")
        log.warning("job key=%s: %d kernel binaries missing at assembly; building them again",
                    keys.short(key), len(missing))
        board.add_pending(key, missing, ctx.settings.done_ttl_s)
        ctx.store.update_job(key, stage="kernels")
        for batch in _batches(missing, ctx.settings.kernel_batch):
            _send(ctx, routing.BUILD_KERNELS_TASK, [key, ctx.store.namespace, batch], _queue(plan.target))
        return None
    kernels = tuple(
        KernelRef(name=k.name, kind=k.kind, source=k.source, binary=binaries[k.cache_key])
        for k in plan.kernels
    )
    manifest = Manifest(
        key=key, fingerprint=ctx.fingerprint.to_dict(), payload=plan.payload, kernels=kernels,
        worker=ctx.name, created=time.time(), tenant=ctx.store.namespace,
        guards=tuple(plan.guards),
    )
    if manifest.total_bytes() > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            "ARTIFACT_TOO_LARGE",
            f"the artifact is {manifest.total_bytes()} bytes; the farm stores at most "
            f"{ctx.settings.max_artifact_bytes}",
        )
    if not ctx.store.has_blobs(b.digest for b in manifest.blobs()):
        raise JobFailed("PLAN_EXPIRED", "the payload or a kernel source left the cache")
    fields = board.job_fields(key)
    stages, timings = _timings(plan, fields, len(wanted), t0, ctx.name)
    manifest = dataclasses.replace(manifest, timings=timings, stages=tuple(stages))
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds every blob
    return manifest


def _timings(
    plan: Plan, fields: dict[str, str], total_kernels: int, t0: float, worker: str
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
        stage_record(
            "kernels", kernels_s, f("k_started") - f("k_sent") if built else 0.0,
            ",".join(workers), total_kernels, hit,
        ),
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
