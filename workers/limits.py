"""Resource limits around one compile, in the pool process that runs it.

`SOFT_LIMIT` notes whether Celery's soft time limit fired during the task the pool
process runs. The limit raises its exception wherever the compile happens to be. Seen
under load: the limit, then, seconds later, "TypeError: 'NoneType' object is not
callable" with no chain of causes leading back to it, as if torch had caught the
limit's exception where it landed. The note makes such a failure COMPILE_TIMEOUT too.

`cpu_time_limit` bounds the CPU seconds a compile may burn with RLIMIT_CPU: past it the
kernel sends SIGXCPU, whose default action ends the process. That is a real crash of the
compiler process, as a runaway or pathological compile would be in production: Celery's
parent sees the pool process lost, hands the job back (`task_reject_on_worker_lost`),
and `run_job` stops redelivering once the attempt cap is reached. The limit is relative
to what the process has used so far, because a recycled pool process keeps its count.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

SOFT_LIMIT_SIGNAL = signal.SIGUSR1
"""What billiard's pool sends a pool process at the soft time limit (`SIG_SOFT_TIMEOUT`
in billiard/pool.py); its handler there raises `SoftTimeLimitExceeded`."""


class SoftLimitNote:
    """Whether the soft time limit fired since the current task started."""

    def __init__(self) -> None:
        self.fired = False
        self._installed: Callable[[int, FrameType | None], Any] | None = None

    def task_started(self, **_: object) -> None:
        """Celery's `task_prerun`, in the pool process: forgets the last task's limit and
        wraps the pool's handler, which billiard installs after `worker_process_init`."""
        self.fired = False
        if threading.current_thread() is not threading.main_thread():
            return
        handler = signal.getsignal(SOFT_LIMIT_SIGNAL)
        if callable(handler) and handler is not self._installed:
            self._installed = self._noting(handler)
            signal.signal(SOFT_LIMIT_SIGNAL, self._installed)

    def _noting(
        self, handler: Callable[[int, FrameType | None], Any]
    ) -> Callable[[int, FrameType | None], Any]:
        def noting(signum: int, frame: FrameType | None) -> Any:
            self.fired = True
            return handler(signum, frame)

        return noting


SOFT_LIMIT = SoftLimitNote()


@contextlib.contextmanager
def cpu_time_limit(seconds: int) -> Iterator[None]:
    if seconds <= 0:
        yield
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    old = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds
    hard = old[1] if old[1] == resource.RLIM_INFINITY else max(old[1], soft)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, old)
