"""The staged compile's decomposition stage, in the graph job: AOTAutograd up to its
partition (the executor's `decompose`: workers/executor.py), the forward
and backward graphs stored in the graph format, then the lowering job sent to the
stages queue. A graph whose decomposition cannot leave its job (`NotDecomposable`) is
lowered here, decomposition included."""

from __future__ import annotations

import json
import logging
import time

from torchfarm.wire import keys, routing
from torchfarm.wire.codes import Stage
from torchfarm.wire.manifest import Manifest
from workers.aot_seam import Decomposition, NotDecomposable
from workers.board import StageBoard
from workers.jobs.lower import lower
from workers.jobs.sending import send_stage, stage_queue, stage_record
from workers.runtime import Prepared, WorkerContext

log = logging.getLogger(__name__)


def decompose_or_lower(key: str, ctx: WorkerContext, job: Prepared) -> Manifest | None:
    """The graph job of a staged compile: decompose, store the graphs and send the
    lowering; or, for a graph that cannot be decomposed apart, lower it here. Returns a
    manifest only when the graph was compiled whole here."""
    target = str(routing.target_of(job.request.target))
    ctx.store.update_job(key, stage=Stage.DECOMPOSING)
    t0 = time.perf_counter()
    dec: Decomposition | None
    try:
        dec = ctx.executor.decompose(job)
    except NotDecomposable as e:
        log.info("job key=%s decomposes in its lowering: %s", keys.short(key), e)
        ctx.store.update_job(key, decomposed=f"in the lowering: {e}"[:300])
        dec = None
    if dec is None:
        # Out of the handler: an error of the lowering raised inside it would carry this
        # refusal as its context, and read as the lowering's own (compiler.wrong_path).
        return lower(key, ctx, job.redecoded(), target)
    record = ctx.store.get_job(key)
    queued = record.started - record.created if record is not None and record.started else 0.0
    stage = stage_record("decompose", job.decode_s + time.perf_counter() - t0, queued, ctx.name)
    fields = {**dec.to_fields(), "stage": json.dumps(stage).encode()}
    StageBoard(ctx.store, ctx.seal).put_decomposition(key, fields, ctx.settings.done_ttl_s)
    ctx.store.update_job(key, stage=Stage.LOWERING, decomposed="separately", l_sent=time.time())
    send_stage(ctx, routing.LOWER_TASK, [key, ctx.store.namespace, target], stage_queue(target, ctx))
    log.info(
        "job key=%s decomposed (%s) in %.2fs: %d forward, %d backward nodes; lowering sent",
        keys.short(key), dec.kind, dec.seconds, len(dec.forward.nodes),
        len(dec.backward.nodes) if dec.backward is not None else 0,
    )
    return None
