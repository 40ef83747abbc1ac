"""One delivery of a stage job (the lowering, a kernel-build batch, the assembly), as
`runtime.run_delivery` is one of a graph or export job: the job's artifact already
stored ends it at once, an ended job or one whose record expired drops it, a delivery
past the worker's attempt cap fails the job TOO_MANY_ATTEMPTS (its counter on the job
record: `Attempts`), a `JobFailed` from the work is recorded, and an artifact the work stored ends the job
SUCCEEDED and clears its stage records. Every stage is idempotent: a redelivery does
its work again."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torchfarm.storage.store import JobState
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import Manifest
from workers.board import StageBoard
from workers.runtime import JobFailed, WorkerContext, live_job, record_failure, record_fault

log = logging.getLogger(__name__)


def run_stage(
    key: str, ctx: WorkerContext, attempts: str, what: str, work: Callable[[StageBoard], Manifest | None],
) -> Manifest | None:
    """Runs `work` for one delivery of the stage job `what` of the staged job `key`
    (`ctx` in the job's tenant), its deliveries counted in the job record's `attempts`.
    Returns the manifest `work` stored, or None."""
    store, board = ctx.store, StageBoard(ctx.store, ctx.seal)
    if store.get_manifest(key) is not None:
        store.update_job(key, state=JobState.SUCCEEDED, stage=Stage.DONE)
        board.clear(key)
        return None
    if not live_job(key, ctx):
        return None
    try:
        attempt = board.count(key, attempts)
        if attempt == 0:  # its record expired since `live_job`: no one waits for it
            log.warning("job key=%s: its record expired before this %s; dropped", keys.short(key), what)
            return None
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                JobError.TOO_MANY_ATTEMPTS,
                f"the {what} was delivered {attempt} times; a worker was lost on each earlier try",
            )
        manifest = work(board)
    except JobFailed as e:
        record_failure(key, store, e.code, str(e), ctx.settings.failed_ttl_s)
        return None
    except ctx.runner_errors:
        raise
    except Exception as e:  # noqa: BLE001 - a fault of the farm's own: its client learns now
        record_fault(key, store, e, ctx.settings.failed_ttl_s)
        return None
    if manifest is not None:
        stages = {"stages": list(manifest.stages)} if manifest.stages else {}
        store.update_job(
            key, state=JobState.SUCCEEDED, stage=Stage.DONE, timings=manifest.timings,
            artifact_bytes=manifest.total_bytes(), **stages,
        )
        store.expire_job(key, ctx.settings.done_ttl_s)
        board.clear(key)
    return manifest
