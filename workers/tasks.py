"""Celery tasks: decode the message, call the plain job function, map time limits.

Retries of a lost worker come from `acks_late` + `task_reject_on_worker_lost`
(torchfarm.celeryconf); `run_job` counts deliveries and stops at the cap. Errors of the
compile itself are deterministic and are never retried.
"""

from __future__ import annotations

import functools

from celery.exceptions import SoftTimeLimitExceeded

from sdk.target import local_fingerprint
from torchfarm.routing import COMPILE_TASK
from torchfarm.store import Store
from workers.app import app, settings
from workers.job import WorkerContext, fail_job, run_job


@functools.cache
def _context() -> WorkerContext:
    # Built lazily in each pool process, after the fork.
    return WorkerContext(
        settings=settings,
        store=Store.from_url(settings.cache_url, settings.redis_prefix),
        fingerprint=local_fingerprint(),
        name=settings.worker_name(),
    )


@app.task(name=COMPILE_TASK)
def compile_task(key: str) -> None:
    try:
        run_job(key, _context())
    except SoftTimeLimitExceeded:
        fail_job(key, _context(), "COMPILE_TIMEOUT", "the compile ran past the farm's time limit")
