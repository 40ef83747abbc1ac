"""Celery settings shared by the coordinator (which only sends) and the workers.

The choices follow what long compile jobs on a Redis broker need:

- `acks_late` with `task_reject_on_worker_lost`: a worker killed mid-compile hands the
  job back instead of losing it; the worker counts attempts and stops at a cap;
- prefetch 1: a worker holds one compile at a time, so idle workers get the next one;
- the hard time limit stays below the broker's visibility timeout, or a slow compile
  would be redelivered and run twice;
- JSON only: a task message is a cache key, never a pickle;
- worker processes are recycled after some jobs, since Inductor caches grow in-process;
- a Redis failover (Sentinel) is ridden out, not fatal: a message sent while the primary
  is gone is retried until the new one answers (`PUBLISH_RETRY_POLICY`), and a task that
  hits a lost connection anyway is retried whole (`TRANSIENT_RETRY`), as a new delivery
  that the worker runtime counts against its attempt cap.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from torchfarm.storage.redisconn import celery_broker

SOFT_TIME_LIMIT_S = 540
"""A compile past this gets SoftTimeLimitExceeded and fails with COMPILE_TIMEOUT."""

HARD_TIME_LIMIT_S = 600
"""A compile past this is killed by Celery."""

VISIBILITY_TIMEOUT_S = 900
"""Redis redelivers an unacknowledged job after this; kept above the hard limit."""

MAX_TASKS_PER_CHILD = 300
"""Recycle a worker process after this many tasks. A staged compile is one lowering
task, one task per kernel batch and one assembly (about a dozen for the GPT example),
and a new process pays the torch import, the ISA probe and the header build again."""

PUBLISH_RETRY_POLICY = {"max_retries": 40, "interval_start": 0, "interval_step": 0.25, "interval_max": 1}
"""How long sending a task keeps trying a broker that went away: about 35 s, longer than a
Sentinel failover. Celery's default (3 tries in 0.6 s) lost a stage job sent while the
primary was down, and its compile stayed RUNNING."""

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, OperationalError,
)
"""A lost Redis or broker connection: worth running the task again, unlike a compile error."""

TRANSIENT_RETRY: dict[str, Any] = {
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": 2,
    "retry_backoff_max": 30,
    "max_retries": 5,
}
"""Task options that retry a task which lost its connection (a failover longer than the
clients' own retries), 2, 4, 8... s later, instead of dropping it with its job RUNNING."""


RESTORE_INTERVAL_S = 10
"""How often a worker sweeps for unacknowledged jobs past the visibility timeout (kombu's
default), when the timeout is long; a short timeout gets a sweep as often as a tenth of it."""


def make_celery(
    broker_url: str,
    name: str = "torchfarm",
    *,
    soft_time_limit_s: int = SOFT_TIME_LIMIT_S,
    hard_time_limit_s: int = HARD_TIME_LIMIT_S,
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S,
) -> Celery:
    """The Celery app. A worker passes its own limits; the coordinator only sends."""
    if not soft_time_limit_s < hard_time_limit_s < visibility_timeout_s:
        raise ValueError(
            "want soft time limit < hard time limit < visibility timeout, got "
            f"{soft_time_limit_s} / {hard_time_limit_s} / {visibility_timeout_s}: a job "
            "running past the visibility timeout is delivered twice"
        )
    restore_s = max(1, min(RESTORE_INTERVAL_S, visibility_timeout_s // 10))
    # A redis+sentinel:// URL becomes Celery's sentinel:// and its master_name.
    broker_url, sentinel_options = celery_broker(broker_url)
    app = Celery(name, broker=broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=soft_time_limit_s,
        task_time_limit=hard_time_limit_s,
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s,
            # A job whose worker died whole (no pool parent left to hand it back) waits
            # for the timeout, then for the next sweep of a live worker.
            "unacked_restore_interval": restore_s,
            "unacked_restore_throttle": 1 if restore_s < RESTORE_INTERVAL_S else 10,
            **sentinel_options,
        },
        broker_connection_retry_on_startup=True,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        worker_max_tasks_per_child=MAX_TASKS_PER_CHILD,
        task_default_queue="cpu",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app
