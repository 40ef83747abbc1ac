"""The staged compile's first two stages, decomposition and lowering, as two jobs.

    compile_task (graph queue)               lower_task (stages queue)
    ──────────────────────────               ─────────────────────────
    run_job → decompose_or_lower: decode,    run_lowering: decode the request, load its
    AOTAutograd up to the partition      ──▶ decomposition, lower_graph with AOTAutograd's
    (workers/decompose.py); store the        tracing replaced by it (Inductor runs on each
    forward and backward graphs; send        graph), kernels streamed out; fan_out
    the lowering                             (workers/pipeline.py)

The decomposition is device-agnostic work, so any worker of the target may take either
job: on a farm of several workers the lowering may start on another one. A graph
whose decomposition cannot leave its job (`NotDecomposable`) is lowered in the graph job,
decomposition included, as one job; so is one whose stored decomposition is gone or
does not fit when its lowering runs. Neither job waits for the other.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from torchfarm.fx import guards as shape_guards
from torchfarm import keys, routing, targets
from torchfarm.manifest import Manifest
from workers.board import StageBoard
from torchfarm.store import JobState
from workers.compiler import CompileFailed, LoweredGraph, NeedsWholeGraph, lower_graph
from workers.decompose import Decomposition, NotDecomposable, decompose_graph, using_decomposition
from workers.job import (
    JobFailed, Prepared, WorkerContext, _fail, added_guards, as_job_failure, compile_whole, prepare,
)
from workers.limits import cpu_time_limit
from workers.pipeline import KernelStream, _live_job, _send, fan_out, stage_record

log = logging.getLogger(__name__)


def decompose_or_lower(key: str, ctx: WorkerContext, job: Prepared) -> Manifest | None:
    """The graph job of a staged compile: decompose, store the graphs and send the
    lowering; or, for a graph that cannot be decomposed apart, lower it here. Returns a
    manifest only when the graph was compiled whole here."""
    target = str(routing.target_of(job.request.target))
    options = job.request.options
    ctx.store.update_job(key, stage="decomposing")
    t0 = time.perf_counter()
    try:
        with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
            dec = decompose_graph(
                job.decoded, dynamic=options.dynamic, mode=options.mode,
                inductor_options=job.inductor_options,
            )
    except NotDecomposable as e:
        log.info("job key=%s decomposes in its lowering: %s", keys.short(key), e)
        ctx.store.update_job(key, decomposed=f"in the lowering: {e}"[:300])
        return lower(key, ctx, job.redecoded(), target)
    except CompileFailed as e:
        raise as_job_failure(e, ctx) from e
    record = ctx.store.get_job(key)
    queued = record.started - record.created if record is not None and record.started else 0.0
    stage = stage_record("decompose", job.decode_s + time.perf_counter() - t0, queued, ctx.name)
    fields = {**dec.to_fields(), "stage": json.dumps(stage).encode()}
    StageBoard(ctx.store).put_decomposition(key, fields, ctx.settings.done_ttl_s)
    ctx.store.update_job(key, stage="lowering", decomposed="separately", l_sent=time.time())
    _send(ctx, routing.LOWER_TASK, [key, ctx.store.namespace, target],
          routing.stage_queue(targets.parse(target)))
    log.info(
        "job key=%s decomposed (%s) in %.2fs: %d forward, %d backward nodes; lowering sent",
        keys.short(key), dec.kind, dec.seconds, len(dec.forward.nodes),
        len(dec.backward.nodes) if dec.backward is not None else 0,
    )
    return None


def run_lowering(key: str, ctx: WorkerContext, namespace: str, target: str) -> None:
    """The lowering job of the staged job `key`, from the decomposition its graph job
    stored. Idempotent, like every stage: a redelivery lowers again."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    store, board = ctx.store, StageBoard(ctx.store)
    if store.get_manifest(key) is not None:
        store.update_job(key, state=JobState.SUCCEEDED, stage="done")
        return
    if not _live_job(key, ctx):
        return
    began = time.time()
    try:
        if board.count(key, "lower_attempts") > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS", "the lowering was delivered too often; a worker was lost each time"
            )
        store.update_job(key, l_worker=ctx.name)  # `lower` sets the stage
        job = prepare(key, ctx)
        dec, front = _stored(board, key)
        sent = float(board.job_fields(key).get("l_sent") or began)
        manifest = lower(key, ctx, job, target, dec, front, began - sent)
    except JobFailed as e:
        _fail(key, ctx, e.code, str(e))
        return
    if manifest is not None:  # compiled whole here: no assembly will clear the records
        store.update_job(
            key, state=JobState.SUCCEEDED, stage="done", timings=manifest.timings,
            artifact_bytes=manifest.total_bytes(),
        )
        store.expire_job(key, ctx.settings.done_ttl_s)
        board.clear(key)


def _stored(board: StageBoard, key: str) -> tuple[Decomposition | None, dict[str, Any] | None]:
    """The job's stored decomposition and its stage record, or (None, None)."""
    fields = board.get_decomposition(key)
    if fields is None:
        log.warning("job key=%s: its decomposition left the cache; it decomposes here", keys.short(key))
        return None, None
    try:
        return Decomposition.from_fields(fields), json.loads(fields.get(b"stage", b"null"))
    except (NotDecomposable, ValueError) as e:
        log.warning("job key=%s: %s; it decomposes here", keys.short(key), e)
        return None, None


def lower(
    key: str, ctx: WorkerContext, job: Prepared, target: str,
    dec: Decomposition | None = None, front: dict[str, Any] | None = None, queued: float = 0.0,
) -> Manifest | None:
    """Lowers the graph, from `dec` when there is one, streaming its kernel builds out,
    and fans the rest out (workers/pipeline.py); `front` is the decomposition job's
    stage record. A graph only the whole-graph path can compile is compiled whole here:
    its manifest is returned."""
    ctx.store.update_job(key, stage="lowering")
    stream = KernelStream(key, ctx, target)
    stream.open()
    try:
        try:
            lowered, guards = _lower(key, ctx, job, stream, dec)
        except NotDecomposable as e:  # only a decomposition (`dec`) raises it
            log.warning("job key=%s: its decomposition does not fit; it decomposes here: %s",
                        keys.short(key), e)
            ctx.store.update_job(key, decomposed=f"in the lowering: {e}"[:300])
            job, front, queued = job.redecoded(), None, 0.0
            lowered, guards = _lower(key, ctx, job, stream, None)
    except NeedsWholeGraph as e:
        stream.abandon()  # before the compile: builds it sent must not start an assembly
        log.info("job key=%s compiles whole: %s", keys.short(key), e)
        return compile_whole(key, ctx, job.redecoded())
    except BaseException:
        stream.abandon()
        raise
    fan_out(key, ctx, target, lowered, guards, job.decode_s, stream, front, queued)
    return None


def _lower(
    key: str, ctx: WorkerContext, job: Prepared, stream: KernelStream, dec: Decomposition | None
) -> tuple[LoweredGraph, tuple[Any, ...]]:
    """`lower_graph` of the job's graph, taking `dec`'s graphs when given; the lowered
    graph and the shape guards it rests on."""
    decoded, options = job.decoded, job.request.options
    mark = shape_guards.snapshot(decoded.shape_env)
    used: list[str] = []
    seam = using_decomposition(dec, decoded, used) if dec is not None else None
    try:
        with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
            lowered = lower_graph(
                decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
                dynamic=options.dynamic, mode=options.mode, inductor_options=job.inductor_options,
                on_kernel=stream, aot_seam=seam,
            )
    except CompileFailed as e:
        raise as_job_failure(e, ctx) from e
    guards = added_guards(decoded, mark)
    if dec is not None:
        if not used:
            log.info("job key=%s: AOTAutograd's cache had the graph; its decomposition was not used",
                     keys.short(key))
        seen = {json.dumps(g) for g in guards}
        guards = (*guards, *(g for g in dec.guards if json.dumps(g) not in seen))
    return lowered, guards
