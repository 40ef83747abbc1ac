"""The staged compile after its decomposition (workers/lowering.py): lowering, then C++
kernel builds on every worker of the target, then assembly. Plain functions, no Celery;
workers/tasks.py wraps them.

    lower_task (stages queue)         build_kernels × N (stages queue)    assemble (stages queue)
    ─────────────────────────         ────────────────────────────────    ───────────────────────
    run_lowering: lower_graph         run_kernel_batch: cache check,      run_assembly: every
    (Inductor on the decomposed       build the specs (in threads, up     binary cached? → sign
    graphs, C++ builds deferred).     to the worker's cores), store the   the manifest, job
    KernelStream sends each       ──▶ binaries, release their keys    ──▶ SUCCEEDED. Missing
    kernel's build as Inductor        from the job's pending set; the     ones → sent again.
    asks for it; fan_out sends the    removal that empties it sends
    rest, writes the plan, releases   the assembly
    the barrier

The forward graph's kernels are built while the backward graph is still lowered: Inductor
asks for a graph's kernels when it loads that graph's wrapper code, and `KernelStream`
sends their builds then. What the compile asks for is not yet what a client will load:
`fan_out` gets the authoritative list from `lower_graph`, sends what is still missing,
and drops any stray that was sent but is not loaded.

No task waits for another: each stage ends by sending the next one, and the barrier is
a Redis set (torchfarm/stages.py) that holds `LOWERING` until the lowering ends, so the
assembly cannot start while kernels are still being discovered. A worker lost mid-stage
is covered by Celery's acks_late redelivery; every stage is idempotent and counts its
deliveries against `max_attempts` on the job record.

Jobs in flight at once build a kernel they share once: the first claims it and sends
its build, the others wait on that build, which releases them all (torchfarm/stages.py,
`StageBoard.claim`, and `_settle` here).

A graph that cannot be decomposed apart is lowered in its graph job, decomposition
included; `fan_out` then times AOTAutograd's part of that lowering as the decompose
stage.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sdk.loader import KernelSpec, kernel_name
from sdk.vecisa import probed_toolchain
from torchfarm import keys, routing, targets
from torchfarm.manifest import KernelRef, Manifest
from torchfarm.stages import (
    BUILD, CACHED, WAIT, Plan, PlannedKernel, StageBoard, kernel_cache_key, parse_waiter,
    waiter_name,
)
from torchfarm.store import JobState, Store
from workers.compiler import CompileFailed, Kernel, LoweredGraph, start_kernel_build
from workers.job import JobFailed, WorkerContext, _fail, _put, as_job_failure
from workers.limits import cpu_time_limit

log = logging.getLogger(__name__)
T = TypeVar("T")

HANDED_ON = frozenset({"lowering", "kernels", "assembling"})
"""Stages of a staged job after its graph job has ended: later jobs finish it."""


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


def _batches(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _send_builds(
    ctx: WorkerContext, key: str, target: str, kernels: list[PlannedKernel]
) -> list[list[str]]:
    """Sends `kernels`' build jobs, `kernel_batch` a job; returns each job's cache keys."""
    batches = _batches(kernels, kernel_batch(ctx))
    for batch in batches:
        refs = [[k.cache_key, k.source.digest] for k in batch]
        _send(ctx, routing.BUILD_KERNELS_TASK, [key, ctx.store.namespace, target, refs], _queue(target))
    return [[k.cache_key for k in batch] for batch in batches]


def _claim(ctx: WorkerContext, key: str, target: str, kernels: list[PlannedKernel]) -> list[int]:
    """The job `key` waits for `kernels` (StageBoard.claim); each one's verdict. Claims
    lapse with the broker's visibility timeout, before the coordinator calls a job that
    waited on an orphaned claim stale and queues it again (`stale_job_s`), so the new
    try claims the kernel itself."""
    return StageBoard(ctx.store).claim(
        key, waiter_name(ctx.store.namespace, key, target), [k.cache_key for k in kernels],
        ctx.settings.done_ttl_s, ctx.settings.visibility_timeout_s,
    )


def _planned(ctx: WorkerContext, target: str, spec: bytes) -> PlannedKernel:
    """A kernel spec as the pipeline knows it: its blob stored, its kernel cache key."""
    return PlannedKernel(
        name=kernel_name(spec),
        kind="cpp" if KernelSpec.from_bytes(spec).is_library() else "cpp-object",
        source=_put(ctx.store, spec),
        cache_key=_kernel_key(ctx, spec, target),
    )


def _kernel_key(ctx: WorkerContext, spec: bytes, target: str) -> str:
    """The spec's kernel cache key for this worker's build, and, with
    `kernel_cache_scope="tenant"`, for the job's tenant alone."""
    tenant = ctx.store.namespace if ctx.settings.kernel_cache_scope == "tenant" else None
    return kernel_cache_key(spec, target, ctx.fingerprint.to_dict(), tenant)


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
        return StageBoard(self.ctx.store)

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
        kernel = self.known[spec] = _planned(self.ctx, self.target, spec)
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
        verdicts = _claim(self.ctx, self.key, self.target, batch)
        build = [k for k, v in zip(batch, verdicts) if v == BUILD]
        pending = [k.cache_key for k, v in zip(batch, verdicts) if v != CACHED]
        self.board.note_waiting(self.key, len(pending), bool(build))
        self.sent.update(pending)
        self.shared += sum(v == WAIT for v in verdicts)
        for batch_keys in _send_builds(self.ctx, self.key, self.target, build):
            self.sends.append([self.since_open(), batch_keys])

    def planned(self, spec: bytes) -> PlannedKernel:
        return self.known.get(spec) or _planned(self.ctx, self.target, spec)


def fan_out(
    key: str, ctx: WorkerContext, target: str, lowered: LoweredGraph,
    guards: tuple[Any, ...], decode_s: float, stream: KernelStream | None = None,
    decomposed: dict[str, Any] | None = None, lower_queued: float = 0.0,
) -> None:
    """Ends the lowering job: sends the kernel builds the stream has not, records the
    plan, and releases the job's barrier, which sends the assembly at once when every
    kernel is built or cached. `decomposed` is the stage record of the decomposition
    job the lowering took its graphs from (workers/lowering.py), `lower_queued` how long
    the lowering job was queued; without it, the lowering decomposed too and its
    AOTAutograd time is the decompose stage."""
    if stream is None:
        stream = KernelStream(key, ctx, target)
        stream.open()
    store, board = ctx.store, StageBoard(ctx.store)
    t0 = time.perf_counter()
    stream.flush()
    kernels = [stream.planned(spec) for spec in lowered.specs]
    by_key = {k.cache_key: k for k in kernels}
    wanted = list(by_key)
    cached = board.cached_binaries([k for k in wanted if k not in stream.sent])
    missing = [by_key[k] for k in wanted if k not in stream.sent and k not in cached]
    verdicts = _claim(ctx, key, target, missing)  # pending from here on, with the streamed
    build = [k for k, v in zip(missing, verdicts) if v == BUILD]
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
    batches = _batches([k.cache_key for k in build], kernel_batch(ctx))
    sends = [*stream.sends, *([lowered_after, b] for b in batches)]
    plan = Plan(
        payload=_put(store, lowered.payload), kernels=kernels, target=target,
        guards=list(guards), stages=stages, timings=t,
        sends=[send for send in sends if not set(send[1]) <= set(strays)],
        lowered_after=lowered_after,
    )
    ttl = ctx.settings.done_ttl_s
    board.put_plan(key, plan, ttl)
    store.update_job(key, stage="kernels", stages=stages)
    left = board.close_lowering(key, len(wanted), hits, strays, bool(build), ttl)
    jobs = len(_send_builds(ctx, key, target, build))
    if left == 0:
        _send_assembly(store, ctx, key, target)
    log.info(
        "job key=%s lowered: %d kernels, %d in the kernel cache, %d sent while lowering, "
        "%d built by other jobs in flight (waited for), %d build jobs sent now to %s; %d pending",
        keys.short(key), len(wanted), hits, len(stream.sent) - len(strays),
        stream.shared + waits, jobs, _queue(target), left,
    )


def _live_job(key: str, ctx: WorkerContext) -> bool:
    job = ctx.store.get_job(key)
    if job is None or job.state in JobState.TERMINAL:
        log.info("job key=%s is %s; stage job dropped", keys.short(key), job.state if job else "gone")
        return False
    return True


def run_kernel_batch(
    key: str, ctx: WorkerContext, namespace: str, target: str, kernels: list[list[str]]
) -> None:
    """Builds the kernels of the staged job `key` that the kernel cache does not hold,
    stores them, and sends the assembly if they were the last the job waited for.
    `kernels` holds each kernel's cache key and the digest of its spec's blob. However it
    ends, the jobs that waited for these kernels' builds are then released, or one of
    them builds what this job did not (`_settle`)."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    try:
        _run_kernel_batch(key, ctx, target, kernels)
    finally:
        _settle(ctx, waiter_name(namespace, key, target), kernels)


def _run_kernel_batch(key: str, ctx: WorkerContext, target: str, kernels: list[list[str]]) -> None:
    board = StageBoard(ctx.store)
    if not _live_job(key, ctx):
        return
    cache_keys = [k for k, _ in kernels]
    batch = hashlib.sha256(",".join(sorted(cache_keys)).encode()).hexdigest()[:16]
    attempt = board.count(key, f"kattempts:{batch}")
    try:
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS",
                f"a kernel-build job was delivered {attempt} times; a worker was lost on each try",
            )
        board.note_kernel_start(key, ctx.name)
        if ctx.settings.kernel_job_delay_s:
            time.sleep(ctx.settings.kernel_job_delay_s)  # test hook (WorkerSettings)
        busy_s, built = _build_missing(ctx, target, kernels, board)
    except JobFailed as e:
        _fail(key, ctx, e.code, str(e))
        return
    hits = len(cache_keys) - built
    _, left = board.release(key, cache_keys, hits, busy_s)
    log.info(
        "job key=%s: %d kernels built, %d found cached in %.2fs; %d still pending",
        keys.short(key), built, hits, busy_s, left,
    )
    if left == 0:
        _send_assembly(ctx.store, ctx, key, target)


def _send_assembly(store: Store, ctx: WorkerContext, key: str, target: str) -> None:
    store.update_job(key, stage="assembling", a_sent=time.time())
    _send(ctx, routing.ASSEMBLE_TASK, [key, store.namespace], _queue(target))


def _settle(ctx: WorkerContext, owner: str, kernels: list[list[str]]) -> None:
    """After a kernel-build job of the job named `owner`, however it ended: each of its
    kernels now cached releases the jobs that waited for its build; one still missing
    passes its claim to one waiter, whose own build job is sent."""
    board = StageBoard(ctx.store)
    cached = board.cached_binaries([k for k, _ in kernels])
    for cache_key, digest in kernels:
        if cache_key in cached:
            for waiter in board.settle(cache_key):
                namespace, key, target = parse_waiter(waiter)
                store = ctx.store.tenant(namespace)
                removed, left = StageBoard(store).release(key, [cache_key], 1, 0.0)
                if removed and left == 0:
                    _send_assembly(store, ctx, key, target)
            continue
        heir = board.hand_over(cache_key, owner, ctx.settings.visibility_timeout_s)
        if heir is not None:
            namespace, key, target = parse_waiter(heir)
            log.info("kernel %s was not built; job key=%s builds it",
                     cache_key[:12], keys.short(key))
            _send(ctx, routing.BUILD_KERNELS_TASK, [key, namespace, target, [[cache_key, digest]]],
                  _queue(target))


def build_threads() -> int:
    """How many kernels a kernel-build job builds at once: the cores this worker process
    may run on (one, for a worker pinned to a core)."""
    return max(len(os.sched_getaffinity(0)), 1)


def kernel_batch(ctx: WorkerContext) -> int:
    """Kernels per build job this worker sends: `TORCHFARM_KERNEL_BATCH`, or by default
    what one job builds at once here. The workers of one target are taken to be alike."""
    return ctx.settings.kernel_batch or build_threads()


def _build_missing(
    ctx: WorkerContext, target: str, kernels: list[list[str]], board: StageBoard
) -> tuple[float, int]:
    """(build seconds, kernels built) for the batch's kernels not yet cached. Each
    spec must hash to its cache key with this worker's build (and scope): a worker of
    another build must not store its binary under that key."""
    cached = board.cached_binaries([k for k, _ in kernels])
    todo = []
    for cache_key, digest in kernels:
        if cache_key in cached:
            continue
        spec = ctx.store.get_blob(digest)
        if spec is None:
            raise JobFailed("PLAN_EXPIRED", "a kernel's source left the cache before its build")
        if _kernel_key(ctx, spec, target) != cache_key:
            raise JobFailed(
                "BUILD_MISMATCH",
                f"kernel {cache_key[:12]} was keyed for another build or target than this "
                f"worker's ({target})",
            )
        todo.append((cache_key, spec))
    if not todo:
        return 0.0, 0
    t0 = time.perf_counter()
    try:
        with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
            builds = [(cache_key, start_kernel_build(spec)) for cache_key, spec in todo]
            with ThreadPoolExecutor(min(len(builds), build_threads())) as pool:
                running = [(cache_key, pool.submit(_timed, b)) for cache_key, b in builds]
                for cache_key, future in running:
                    kernel, seconds = future.result()
                    board.put_binary(cache_key, kernel.binary, ctx.name, seconds)
    except CompileFailed as e:
        raise as_job_failure(e, ctx) from e
    return time.perf_counter() - t0, len(todo)


def _timed(build: Callable[[], Kernel]) -> tuple[Kernel, float]:
    t0 = time.perf_counter()
    return build(), time.perf_counter() - t0


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
    cached = board.cached_kernels(wanted)
    binaries = {k: ref for k, (ref, _) in cached.items()}
    missing = [k for k in wanted if k not in binaries]
    if missing:
        if board.count(key, "kernel_resends") > ctx.settings.max_attempts:
            raise JobFailed("KERNELS_LOST", f"{len(missing)} kernel binaries left the cache again")
        log.warning("job key=%s: %d kernel binaries missing at assembly; building them again",
                    keys.short(key), len(missing))
        board.forget_binaries(missing)  # a record whose blob is gone would read as cached
        ctx.store.update_job(key, stage="kernels")
        by_key = {k.cache_key: k for k in plan.kernels}
        again = [by_key[k] for k in missing]
        verdicts = _claim(ctx, key, plan.target, again)
        _send_builds(ctx, key, plan.target, [k for k, v in zip(again, verdicts) if v == BUILD])
        if all(v == CACHED for v in verdicts):  # built meanwhile: nothing will send it
            _send_assembly(ctx.store, ctx, key, plan.target)
        return None
    kernels = tuple(
        KernelRef(name=k.name, kind=k.kind, source=k.source, binary=binaries[k.cache_key])
        for k in plan.kernels
    )
    manifest = Manifest(
        key=key, fingerprint=ctx.fingerprint.to_dict(), payload=plan.payload, kernels=kernels,
        worker=ctx.name, created=time.time(), tenant=ctx.store.namespace,
        guards=tuple(plan.guards), toolchain=probed_toolchain(),
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
