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

from torchfarm.fx.cpp_kernels import KernelSpec, KernelSpecError
from torchfarm.storage.store import Attempts
from torchfarm.wire import keys, targets
from torchfarm.wire.codes import JobError
from workers.board import StageBoard, parse_waiter, waiter_name
from workers.jobs.sending import build_seal, build_threads, kernel_key, send_assembly, send_build
from workers.jobs.stage import run_stage
from workers.runtime import (
    JobFailed,
    WorkerContext,
    get_verified_blob,
    in_tenant,
)

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
    cache_keys = [k for k, _ in kernels]
    batch = hashlib.sha256(",".join(sorted(cache_keys)).encode()).hexdigest()[:16]
    done: list[tuple[float, int]] = []

    def work(board: StageBoard) -> None:
        board.note_kernel_start(key, ctx.name)
        if ctx.settings.kernel_job_delay_s:
            time.sleep(ctx.settings.kernel_job_delay_s)  # test hook (WorkerSettings)
        done.append(_build_missing(ctx, target, kernels, board))

    run_stage(key, ctx, Attempts.kernel_batch(batch), "kernel-build job", work)
    if not done:
        return
    busy_s, built = done[0]
    hits = len(cache_keys) - built
    _, left = StageBoard(ctx.store, ctx.seal).release(key, cache_keys, hits, busy_s)
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
    specs = [spec for _, spec in todo]

    def store(i: int, binary: bytes, seconds: float) -> None:
        board.put_binary(todo[i][0], binary, ctx.name, seconds)

    ctx.executor.build_kernels(specs, build_threads(), store)
    return time.perf_counter() - t0, len(todo)


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
