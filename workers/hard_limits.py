"""A job whose task is killed at Celery's hard time limit ends FAILED, as a counted attempt.

At the hard limit the pool kills the process running the task, so nothing in the task
runs again: the job record would show RUNNING until its TTL, and the message is acked
(not redelivered). Celery then fires `task_failure` with `TimeLimitExceeded` in the
worker's main process; the app's `receiver` marks the job there. The attempt was already
counted when the job started (`run_job` and `run_kernel_job` count first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from celery import Celery
from celery.exceptions import TimeLimitExceeded

from torchfarm.storage.store import JobState, Store
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError
from torchfarm.wire.routing import KERNEL_TASK
from workers.settings import WorkerSettings

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


def main_store(settings: WorkerSettings) -> Store:
    """The main process's store, where the receiver marks the job of a killed task."""
    return Store.from_url(settings.cache_url, settings.redis_prefix, state_url=settings.state_url)


def receiver(app: Celery, settings: WorkerSettings) -> Callable[..., None]:
    """The `task_failure` receiver for `app`'s tasks: only hard time limits, which leave
    the job running. The store is opened at each call (`main_store`)."""

    def on_task_failure(sender: object = None, exception: object = None, args: Sequence[object] = (),
                        kwargs: dict | None = None, **_: object) -> None:
        if getattr(sender, "app", None) is not app or not isinstance(exception, TimeLimitExceeded):
            return
        try:
            fail_killed_job(main_store(settings), getattr(sender, "name", ""), args or (), kwargs or {},
                            exception.args[0] if exception.args else "?", settings.failed_ttl_s)
        except Exception:  # a signal receiver must not break the pool's bookkeeping
            log.exception("could not fail the job of a task killed at the hard time limit")

    return on_task_failure
