"""The graph job: request → checks → decode → compile → store.

On the staged path (`TORCHFARM_PIPELINE=staged`, the default) this job is the
decomposition stage (workers/jobs/decompose.py): it sends the lowering job, and the
later stage jobs write the artifact and finish the record. Otherwise it compiles the
graph whole (workers/jobs/whole.py).
"""

from __future__ import annotations

import logging
import time

from torchfarm.fx import global_state
from torchfarm.wire import keys
from torchfarm.wire.codes import Stage
from torchfarm.wire.manifest import Manifest
from workers import ranks
from workers.jobs.decompose import decompose_or_lower
from workers.jobs.whole import compile_whole
from workers.runtime import Delivery, WorkerContext, in_tenant, prepare, run_delivery

log = logging.getLogger(__name__)


def run_job(key: str, ctx: WorkerContext, namespace: str = "") -> None:
    """Runs one delivery of the job for `key` in the tenant `namespace`, recording the
    outcome in its job record."""
    ctx = in_tenant(ctx, namespace)
    manifest = run_delivery(
        key, ctx.store, Delivery.of(ctx), lambda store: store.get_manifest(key) is not None,
        lambda store: _compile_and_store(key, ctx),
    )
    if isinstance(manifest, Manifest):
        log.info(
            "job key=%s done in %.2fs: %d kernels, %d bytes",
            keys.short(key), manifest.timings.get("total", 0.0), len(manifest.kernels),
            manifest.total_bytes(),
        )


def _compile_and_store(key: str, ctx: WorkerContext) -> Manifest | None:
    job = prepare(key, ctx)
    ctx.store.update_job(key, stage=Stage.COMPILE)
    if ctx.settings.test_delay_s > 0:  # test hook: a compile in flight that tests can watch
        time.sleep(ctx.settings.test_delay_s)
    with global_state.applied(job.request.options):
        ranks.check_shared(job, ctx.executor)
        if ctx.settings.pipeline == "staged" and ctx.send is not None:
            return decompose_or_lower(key, ctx, job)
        return compile_whole(key, ctx, job)

