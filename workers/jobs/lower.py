"""The staged compile's lowering stage (`lower_task`, on the stages queue): decode the
request, load its stored decomposition, `lower_graph` with AOTAutograd's tracing
replaced by it (Inductor runs on each graph, C++ builds deferred), kernel builds
streamed out while it runs (`KernelStream`), then `fan_out`: send the builds still
missing, write the plan, release the job's barrier.

The forward graph's kernels are built while the backward graph is still lowered:
Inductor asks for a graph's kernels when it loads that graph's wrapper code, and
`KernelStream` sends their builds then. What the compile asks for is not yet what a
client will load: `fan_out` gets the authoritative list from `lower_graph`, sends what
is still missing, and drops any stray that was sent but is not loaded. A decomposition
that is gone or does not fit is logged, and the lowering decomposes in place; a graph
only the whole-graph path can compile is compiled whole here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from typing import Any

from torchfarm.fx import global_state, torch_library
from torchfarm.storage.store import Attempts
from torchfarm.wire import keys
from torchfarm.wire.codes import Stage
from torchfarm.wire.manifest import Manifest
from workers.aot_seam import Decomposition, NotDecomposable
from workers.board import BUILD, CACHED, WAIT, Plan, PlannedKernel, StageBoard
from workers.compiler import LoweredGraph, NeedsWholeGraph
from workers.jobs.sending import (
    claim,
    in_batches,
    kernel_batch,
    planned,
    send_assembly,
    send_builds,
    stage_queue,
    stage_record,
)
from workers.jobs.stage import run_stage
from workers.jobs.whole import compile_whole
from workers.runtime import (
    Prepared,
    WorkerContext,
    in_tenant,
    prepare,
    put_blob,
)

log = logging.getLogger(__name__)


def run_lowering(key: str, ctx: WorkerContext, namespace: str, target: str) -> None:
    """The lowering job of the staged job `key`, from the decomposition its graph job
    stored (`stage.run_stage` runs its delivery)."""
    ctx = in_tenant(ctx, namespace)
    began = time.time()

    def work(board: StageBoard) -> Manifest | None:
        ctx.store.update_job(key, l_worker=ctx.name)  # `lower` sets the stage
        with torch_library.job_scope():  # one tenant's custom ops never reach another's job
            job = prepare(key, ctx)
            dec, front = _stored(board, key)
            sent = float(board.job_fields(key).get("l_sent") or began)
            with global_state.applied(job.request.options):
                return lower(key, ctx, job, target, dec, front, began - sent)

    run_stage(key, ctx, Attempts.LOWERING, "lowering", work)


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
    and fans the rest out (workers/jobs/); `front` is the decomposition job's
    stage record. A graph only the whole-graph path can compile is compiled whole here:
    its manifest is returned."""
    ctx.store.update_job(key, stage=Stage.LOWERING)
    stream = KernelStream(key, ctx, target)
    stream.open()
    try:
        try:
            done: tuple[LoweredGraph, tuple[Any, ...]] | None = _lower(key, ctx, job, stream, dec)
        except NotDecomposable as e:  # only a decomposition (`dec`) raises it
            log.warning("job key=%s: its decomposition does not fit; it decomposes here: %s",
                        keys.short(key), e)
            ctx.store.update_job(key, decomposed=f"in the lowering: {e}"[:300])
            job, front, queued = job.redecoded(), None, 0.0
            done = None
        # Out of the handler, as in decompose_or_lower.
        lowered, guards = done if done is not None else _lower(key, ctx, job, stream, None)
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
    """The executor's lowering of the job's graph, taking `dec`'s graphs when given; the
    lowered graph and the shape guards it rests on."""
    done = ctx.executor.lower(job, stream, dec)
    lowered, guards, used = done.graph, done.guards, done.used_decomposition
    if dec is not None:
        if not used:
            log.info("job key=%s: AOTAutograd's cache had the graph; its decomposition was not used",
                     keys.short(key))
        seen = {json.dumps(g) for g in guards}
        guards = (*guards, *(g for g in dec.guards if json.dumps(g) not in seen))
    return lowered, guards


@dataclasses.dataclass
class KernelStream:
    """Sends a staged job's kernel builds while its lowering runs (`lower_graph`'s
    `on_kernel`): a kernel the kernel cache lacks is sent once `kernel_batch` of them are
    waiting, so workers with nothing else to do build the forward graph's kernels while
    this one lowers the backward graph. `open` before the lowering; `fan_out` after it."""

    key: str
    ctx: WorkerContext
    target: str
    known: dict[bytes, PlannedKernel] = dataclasses.field(default_factory=dict)
    """Every spec seen, by spec."""
    sent: set[str] = dataclasses.field(default_factory=set)
    """Cache keys the job waits for: sent to be built, by this job or (`shared`) another."""
    shared: int = 0
    """Of `sent`, kernels another job in flight builds."""
    waiting: list[PlannedKernel] = dataclasses.field(default_factory=list)
    sends: list[list[Any]] = dataclasses.field(default_factory=list)
    """Each build job sent: [seconds after `open`, its cache keys] (`Plan.sends`)."""
    opened: float = 0.0

    @functools.cached_property
    def board(self) -> StageBoard:
        return StageBoard(self.ctx.store, self.ctx.seal)

    def open(self) -> None:
        self.opened = time.perf_counter()
        self.board.open_lowering(self.key, self.ctx.settings.done_ttl_s)

    def since_open(self) -> float:
        return round(time.perf_counter() - self.opened, 3)

    def abandon(self) -> None:
        """The lowering failed or gave way to the whole-graph compile: no assembly will
        run. Builds already sent still run, and only fill the kernel cache."""
        self.board.abandon_lowering(self.key, self.ctx.settings.done_ttl_s)

    def __call__(self, spec: bytes) -> None:
        if spec in self.known:  # one spec, one cache key: nothing else can repeat it
            return
        kernel = self.known[spec] = planned(self.ctx, self.target, spec)
        if self.board.cached_binaries([kernel.cache_key]):
            return  # a hit; fan_out counts it
        self.waiting.append(kernel)
        if len(self.waiting) >= kernel_batch(self.ctx):
            self.flush()

    def flush(self) -> None:
        """Sends the kernels waiting for a full batch: the job waits for each, and builds
        those no other job in flight is building."""
        batch, self.waiting = self.waiting, []
        if not batch:
            return
        verdicts = claim(self.ctx, self.key, self.target, batch)
        build = [k for k, v in zip(batch, verdicts, strict=False) if v == BUILD]
        pending = [k.cache_key for k, v in zip(batch, verdicts, strict=False) if v != CACHED]
        self.board.note_waiting(self.key, len(pending), bool(build))
        self.sent.update(pending)
        self.shared += sum(v == WAIT for v in verdicts)
        for batch_keys in send_builds(self.ctx, self.key, self.target, build):
            self.sends.append([self.since_open(), batch_keys])

    def planned(self, spec: bytes) -> PlannedKernel:
        return self.known.get(spec) or planned(self.ctx, self.target, spec)


def fan_out(
    key: str, ctx: WorkerContext, target: str, lowered: LoweredGraph,
    guards: tuple[Any, ...], decode_s: float, stream: KernelStream | None = None,
    decomposed: dict[str, Any] | None = None, lower_queued: float = 0.0,
) -> None:
    """Ends the lowering job: sends the kernel builds the stream has not, records the
    plan, and releases the job's barrier, which sends the assembly at once when every
    kernel is built or cached. `decomposed` is the stage record of the decomposition
    job the lowering took its graphs from (workers/jobs/lower.py), `lower_queued` how long
    the lowering job was queued; without it, the lowering decomposed too and its
    AOTAutograd time is the decompose stage."""
    if stream is None:
        stream = KernelStream(key, ctx, target)
        stream.open()
    store, board = ctx.store, StageBoard(ctx.store, ctx.seal)
    t0 = time.perf_counter()
    stream.flush()
    kernels = [stream.planned(spec) for spec in lowered.specs]
    by_key = {k.cache_key: k for k in kernels}
    wanted = list(by_key)
    cached = board.cached_binaries([k for k in wanted if k not in stream.sent])
    missing = [by_key[k] for k in wanted if k not in stream.sent and k not in cached]
    verdicts = claim(ctx, key, target, missing)  # pending from here on, with the streamed
    build = [k for k, v in zip(missing, verdicts, strict=False) if v == BUILD]
    waits = sum(v == WAIT for v in verdicts)
    hits = len(cached) + sum(v == CACHED for v in verdicts)
    strays = sorted(stream.sent - set(wanted))
    t = {"decode": decode_s, **lowered.timings}
    fan_out_s = time.perf_counter() - t0
    if decomposed is not None:
        # The decomposition job's seconds are the decompose stage; what AOTAutograd
        # still did in the lowering (metadata, wrappers, decoding the graphs) is lowering.
        t["lower"] = t.get("lower", 0.0) + t.get("decompose", 0.0)
        t["decompose"] = float(decomposed["seconds"])
        stages = [
            decomposed,
            stage_record(
                "lower", decode_s + t["compile"] + t["collect"] + fan_out_s, lower_queued, ctx.name
            ),
        ]
    else:
        job = store.get_job(key)
        queued = (job.started - job.created) if job is not None and job.started else 0.0
        stages = [
            stage_record("decompose", decode_s + t.get("decompose", 0.0), queued, ctx.name),
            stage_record(
                "lower", t["compile"] - t.get("decompose", 0.0) + t["collect"] + fan_out_s,
                0.0, ctx.name,
            ),
        ]
    lowered_after = stream.since_open()
    batches = in_batches([k.cache_key for k in build], kernel_batch(ctx))
    sends = [*stream.sends, *([lowered_after, b] for b in batches)]
    plan = Plan(
        payload=put_blob(store, lowered.payload), kernels=kernels, target=target,
        guards=list(guards), stages=stages, timings=t,
        sends=[send for send in sends if not set(send[1]) <= set(strays)],
        lowered_after=lowered_after, autotune=lowered.autotune,
    )
    ttl = ctx.settings.done_ttl_s
    board.put_plan(key, plan, ttl)
    store.update_job(key, stage=Stage.KERNELS, stages=stages)
    left = board.close_lowering(key, len(wanted), hits, strays, bool(build), ttl)
    jobs = len(send_builds(ctx, key, target, build))
    if left == 0:
        send_assembly(store, ctx, key, target)
    log.info(
        "job key=%s lowered: %d kernels, %d in the kernel cache, %d sent while lowering, "
        "%d built by other jobs in flight (waited for), %d build jobs sent now to %s; %d pending",
        keys.short(key), len(wanted), hits, len(stream.sent) - len(strays),
        stream.shared + waits, jobs, stage_queue(target, ctx), left,
    )
