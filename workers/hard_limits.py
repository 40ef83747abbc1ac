"""A job whose task is killed at Celery's hard time limit ends FAILED, as a counted attempt.

At the hard limit the pool kills the process running the task, so nothing in the task
runs again: the job record would show RUNNING until its TTL, and the message is acked
(not redelivered). Celery then fires `task_failure` with `TimeLimitExceeded` in the
worker's main process; `on_task_failure` marks the job there. The attempt was already
counted when the job started (`run_job` and `run_kernel_job` count first).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery.exceptions import TimeLimitExceeded

from torchfarm.storage.store import JobState, Store
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError
from torchfarm.wire.routing import KERNEL_TASK

log = logging.getLogger(__name__)


def fail_killed_job(
    store: Store, task_name: str, args: Sequence[object], kwargs: dict, limit: object, failed_ttl_s: int
) -> bool:
    """Marks the job of a killed task FAILED (COMPILE_TIMEOUT, or KERNEL_TIMEOUT for a
    kernel job) unless it already ended; True if it marked it."""
    key = args[0] if args else kwargs.get("key")
    namespace = args[1] if len(args) > 1 else kwargs.get("namespace", "")
    if not isinstance(key, str) or not isinstance(namespace, str):
        return False
    tenant = store.tenant(namespace)
    job = tenant.get_job(key)
    if job is None or job.state in JobState.TERMINAL:
        return False
    code = JobError.KERNEL_TIMEOUT if task_name == KERNEL_TASK else JobError.COMPILE_TIMEOUT
    log.warning("job key=%s killed at the hard time limit (%ss) in %s", keys.short(key), limit, task_name)
    tenant.fail_job(key, code, f"the job was killed at the farm's hard time limit ({limit}s)", failed_ttl_s)
    return True


def main_store() -> tuple[Store, int]:
    """The main process's store and failed-job TTL, from its own settings: where
    `on_task_failure` marks the job of a killed task, looked up at each call."""
    from workers.app import settings

    return Store.from_url(settings.cache_url, settings.redis_prefix, state_url=settings.state_url), settings.failed_ttl_s


def on_task_failure(sender: object = None, exception: object = None, args: Sequence[object] = (),
                    kwargs: dict | None = None, **_: object) -> None:
    """The `task_failure` receiver: only hard time limits, which leave the job running."""
    if not isinstance(exception, TimeLimitExceeded):
        return
    try:
        store, failed_ttl_s = main_store()
        fail_killed_job(store, getattr(sender, "name", ""), args or (), kwargs or {},
                        exception.args[0] if exception.args else "?", failed_ttl_s)
    except Exception:  # a signal receiver must not break the pool's bookkeeping
        log.exception("could not fail the job of a task killed at the hard time limit")
