"""Celery settings shared by the coordinator (which only sends) and the workers.

The choices follow what long compile jobs on a Redis broker need:

- `acks_late` with `task_reject_on_worker_lost`: a worker killed mid-compile hands the
  job back instead of losing it; the worker counts attempts and stops at a cap;
- prefetch 1: a worker holds one compile at a time, so idle workers get the next one;
- the hard time limit stays below the broker's visibility timeout, or a slow compile
  would be redelivered and run twice;
- JSON only: a task message is a cache key, never a pickle;
- worker processes are recycled after some jobs, since Inductor caches grow in-process.
"""

from __future__ import annotations

from celery import Celery

SOFT_TIME_LIMIT_S = 540
"""A compile past this gets SoftTimeLimitExceeded and fails with COMPILE_TIMEOUT."""

HARD_TIME_LIMIT_S = 600
"""A compile past this is killed by Celery."""

VISIBILITY_TIMEOUT_S = 900
"""Redis redelivers an unacknowledged job after this; kept above the hard limit."""

MAX_TASKS_PER_CHILD = 50
"""Recycle a worker process after this many compiles."""


def make_celery(broker_url: str, name: str = "torchfarm") -> Celery:
    app = Celery(name, broker=broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=SOFT_TIME_LIMIT_S,
        task_time_limit=HARD_TIME_LIMIT_S,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S},
        broker_connection_retry_on_startup=True,
        worker_max_tasks_per_child=MAX_TASKS_PER_CHILD,
        task_default_queue="cpu",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app
