"""Resource limits around one compile, in the pool process that runs it.

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
from collections.abc import Iterator


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
