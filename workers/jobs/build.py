"""The staged compile's kernel generation (`build_kernels_task`, on the stages queue,
which every graph worker of the target consumes): build the C++ kernels the fleet-wide
kernel cache lacks, as many at once as the worker process has cores, store each binary
(`tf:kbin:<key>`), and release them from the job's pending set; the release that
empties it sends the assembly."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from torchfarm import keys, targets
from torchfarm.codes import JobError
from torchfarm.fx.kernelspec import KernelSpec, KernelSpecError
from workers.board import StageBoard, parse_waiter, waiter_name
from workers.compiler import CompileFailed, Kernel, start_kernel_build
from workers.jobs.sending import build_seal, build_threads, kernel_key, send_assembly, send_build
from workers.limits import cpu_time_limit
from workers.runtime import (
    JobFailed,
    WorkerContext,
    as_job_failure,
    get_verified_blob,
    in_tenant,
    live_job,
    record_failure,
)
from workers.sandbox import Sandbox, SandboxFailed, build_kernels

log = logging.getLogger(__name__)


def run_kernel_batch(
    key: str, ctx: WorkerContext, namespace: str, target: str, kernels: list[list[str]],
    seal: str = "",
) -> None:
    """Builds the kernels of the staged job `key` that the kernel cache does not hold,
    stores them, and sends the assembly if they were the last the job waited for.
    `kernels` holds each kernel's cache key and the digest of its spec's blob. However it
    ends, the jobs that waited for these kernels' builds are then released, or one of
    them builds what this job did not (`_settle`). A message without the seal of this
    farm's workers (`seal`) is dropped: it may name any spec."""
    if ctx.seal is not None and not hmac.compare_digest(seal, build_seal(ctx, key, namespace, target, kernels)):
        log.error("job key=%s: a kernel-build message without a valid seal; dropped", keys.short(key))
        return
    ctx = in_tenant(ctx, namespace)
    try:
        _run_kernel_batch(key, ctx, target, kernels)
    finally:
        _settle(ctx, waiter_name(namespace, key, target), kernels)


def _run_kernel_batch(key: str, ctx: WorkerContext, target: str, kernels: list[list[str]]) -> None:
    board = StageBoard(ctx.store, ctx.seal)
    if not live_job(key, ctx):
        return
    cache_keys = [k for k, _ in kernels]
    batch = hashlib.sha256(",".join(sorted(cache_keys)).encode()).hexdigest()[:16]
    attempt = board.count(key, f"kattempts:{batch}")
    try:
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                JobError.TOO_MANY_ATTEMPTS,
                f"a kernel-build job was delivered {attempt} times; a worker was lost on each try",
            )
        board.note_kernel_start(key, ctx.name)
        if ctx.settings.kernel_job_delay_s:
            time.sleep(ctx.settings.kernel_job_delay_s)  # test hook (WorkerSettings)
        busy_s, built = _build_missing(ctx, target, kernels, board)
    except JobFailed as e:
        record_failure(key, ctx.store, e.code, str(e), ctx.settings.failed_ttl_s)
        return
    hits = len(cache_keys) - built
    _, left = board.release(key, cache_keys, hits, busy_s)
    log.info(
        "job key=%s: %d kernels built, %d found cached in %.2fs; %d still pending",
        keys.short(key), built, hits, busy_s, left,
    )
    if left == 0:
        send_assembly(ctx.store, ctx, key, target)


def _settle(ctx: WorkerContext, owner: str, kernels: list[list[str]]) -> None:
    """After a kernel-build job of the job named `owner`, however it ended: each of its
    kernels now cached releases the jobs that waited for its build; one still missing
    passes its claim to one waiter, whose own build job is sent."""
    board = StageBoard(ctx.store, ctx.seal)
    cached = board.cached_binaries([k for k, _ in kernels])
    for cache_key, digest in kernels:
        if cache_key in cached:
            for waiter in board.settle(cache_key):
                namespace, key, target = parse_waiter(waiter)
                store = ctx.store.tenant(namespace)
                removed, left = StageBoard(store, ctx.seal).release(key, [cache_key], 1, 0.0)
                if removed and left == 0:
                    send_assembly(store, ctx, key, target)
            continue
        heir = board.hand_over(cache_key, owner, ctx.settings.visibility_timeout_s)
        if heir is not None:
            namespace, key, target = parse_waiter(heir)
            log.info("kernel %s was not built; job key=%s builds it",
                     cache_key[:12], keys.short(key))
            send_build(ctx, key, namespace, target, [[cache_key, digest]])


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
        spec = get_verified_blob(ctx.store, digest)
        if spec is None:
            raise JobFailed(JobError.PLAN_EXPIRED, "a kernel's source left the cache before its build")
        _check_flags(spec, target)
        if kernel_key(ctx, spec, target) != cache_key:
            raise JobFailed(
                JobError.BUILD_MISMATCH,
                f"kernel {cache_key[:12]} was keyed for another build or target than this "
                f"worker's ({target})",
            )
        todo.append((cache_key, spec))
    if not todo:
        return 0.0, 0
    t0 = time.perf_counter()
    if ctx.sandbox is not None:
        _build_sandboxed(ctx, ctx.sandbox, todo, board)
        return time.perf_counter() - t0, len(todo)
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


def _build_sandboxed(ctx: WorkerContext, box: Sandbox, todo: list[tuple[str, bytes]], board: StageBoard) -> None:
    """The builds in the sandbox's child, which holds no key; their binaries are stored
    from here once the sandbox checked them (one ELF file per spec, within the bound)."""
    try:
        built = build_kernels(box, [spec for _, spec in todo], build_threads(), ctx.settings.max_artifact_bytes)
    except SandboxFailed as e:
        code = JobError.COMPILE_TIMEOUT if e.kind == "cpu" else JobError.COMPILE_ERROR
        raise JobFailed(code, str(e)) from e
    for (cache_key, _), (binary, seconds) in zip(todo, built, strict=True):
        board.put_binary(cache_key, binary, ctx.name, seconds)


_TORCH_DEVICE = {"rocm": "cuda"}
"""Target devices whose torch device type has another name (ROCm builds say "cuda")."""


def _check_flags(spec: bytes, target: str) -> None:
    """The build's command line is this worker's own Inductor's: a spec may add no
    flags (Inductor adds some only for CUTLASS or CK libraries on GPUs, whose kernels
    are not built from specs) and must be for the target's device."""
    try:
        args = KernelSpec.from_bytes(spec).args
    except KernelSpecError as e:
        raise JobFailed(JobError.INVALID_KERNEL_SPEC, str(e)) from e
    if args["extra_flags"]:
        raise JobFailed(JobError.INVALID_KERNEL_SPEC, "a kernel spec may not carry compiler flags")
    device = targets.parse(target).device
    if args["device_type"].split(":")[0] != _TORCH_DEVICE.get(device, device):
        raise JobFailed(JobError.INVALID_KERNEL_SPEC, f"a kernel spec for {args['device_type']!r} on {target}")


def _timed(build: Callable[[], Kernel]) -> tuple[Kernel, float]:
    t0 = time.perf_counter()
    return build(), time.perf_counter() - t0
