"""Prometheus metrics of a worker, in prometheus-client's multiprocess mode.

Compiles run in Celery's forked pool processes, so each process writes its samples to
files under PROMETHEUS_MULTIPROC_DIR and the worker's main process merges them when
Prometheus scrapes it. That dictates an order, which `install` keeps:

1. when the app is built (workers/factory.py), in the main process and before
   anything imports prometheus_client, PROMETHEUS_MULTIPROC_DIR names a directory (a
   fresh temporary one unless the deployment gives one);
2. on `worker_init`, before the pool forks, the directory is emptied, so a restarted
   container does not resurrect its predecessor's counters;
3. on `worker_ready` the main process serves /metrics on the worker's metrics port;
4. a pool process that exits is marked dead, which drops its live gauges.

The metric objects are built on first use in each process, after step 1.

Every metric names its target as the coordinator's do (torchfarm/metric_labels.py):
`target="cpu:avx512"`, not the queue's name; a worker serves one build, which
`torchfarm_build_info` names.

A job's numbers are read from its job record after each delivery (`record_job`): the
record is the source of truth the coordinator and `torchfarm status` read too, and the
job path itself stays free of metrics code.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchfarm import __version__, metric_labels
from torchfarm.storage.store import JobRecord, JobState, Store

log = logging.getLogger(__name__)

ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's own variable: where every process of the worker writes samples."""

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
"""Seconds; compiles run from milliseconds (a decode) to the 600 s hard time limit."""

_STAGE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_CODE = re.compile(r"^[A-Z][A-Z0-9_]{0,47}$")


@dataclass(frozen=True)
class _Metrics:
    compile_seconds: Any
    queue_wait_seconds: Any
    jobs: Any
    redeliveries: Any
    retries: Any
    build_info: Any


@functools.cache
def _metrics() -> _Metrics:
    from prometheus_client import Counter, Gauge, Histogram

    return _Metrics(
        compile_seconds=Histogram(
            "torchfarm_compile_duration_seconds",
            "Time a worker spent in each stage of a compile (decode, compile, store, total...).",
            ["stage", "target"],
            buckets=DURATION_BUCKETS,
        ),
        queue_wait_seconds=Histogram(
            "torchfarm_job_queue_wait_seconds",
            "Time from a job's creation to a worker starting it.",
            ["target"],
            buckets=DURATION_BUCKETS,
        ),
        jobs=Counter(
            "torchfarm_worker_jobs_total",
            "Deliveries a worker finished, by outcome (succeeded, cached, failed, error) "
            "and error code ('' when none).",
            ["target", "outcome", "code"],
        ),
        redeliveries=Counter(
            "torchfarm_job_redeliveries_total",
            "Deliveries of a job that an earlier delivery had already started (a worker lost).",
            ["target"],
        ),
        retries=Counter(
            "torchfarm_job_retries_total", "Celery task retries of compile jobs.", ["target"]
        ),
        build_info=Gauge(
            "torchfarm_build_info",
            "Always 1; the labels say which build of torchfarm runs.",
            ["component", "version", "python", "torch"],
            multiprocess_mode="livemax",
        ),
    )


# What a delivery did, from its job record.


def observe_job(job: JobRecord, began: float) -> None:
    """Counts one delivery of `job`, which began (wall clock) at `began`."""
    m = _metrics()
    target = metric_labels.target_of_queue(job.queue)
    ran_here = job.started >= began  # False when an earlier delivery had finished it
    if job.attempts > 1:
        m.redeliveries.labels(target=target).inc()
    code = ""
    if job.state == JobState.SUCCEEDED:
        outcome = "succeeded" if ran_here else "cached"
    elif job.state == JobState.FAILED:
        outcome = "failed"
        code = job.error_code if _CODE.match(job.error_code) else "OTHER"
    else:  # an exception escaped the job path: the record was left behind
        outcome = "error"
    m.jobs.labels(target=target, outcome=outcome, code=code).inc()
    if not ran_here:
        return
    if job.created:
        m.queue_wait_seconds.labels(target=target).observe(max(0.0, job.started - job.created))
    if outcome == "succeeded":
        for stage, seconds in job.timings.items():
            if _STAGE.match(stage):  # stage names come from code, never from users
                m.compile_seconds.labels(stage=stage, target=target).observe(float(seconds))


def record_job(store: Store, key: str, began: float) -> None:
    """Reads the job record after a delivery and counts it; never raises."""
    try:
        job = store.get_job(key)
        if job is not None:
            observe_job(job, began)
    except Exception as e:  # metrics must never fail a compile
        log.warning("metrics: cannot record job key=%s: %s", key[:12], e)


def record_retry(queue: str) -> None:
    _metrics().retries.labels(target=metric_labels.target_of_queue(queue)).inc()


# The multiprocess directory and the main process's /metrics endpoint.


def use_dir() -> Path:
    """Makes sure PROMETHEUS_MULTIPROC_DIR names a directory; call before prometheus_client loads."""
    path = os.environ.get(ENV)
    if not path:
        if "prometheus_client" in sys.modules:
            raise RuntimeError(
                f"prometheus_client was imported before {ENV} was set: the pool processes' "
                "metrics would be lost. Set it in the worker's environment."
            )
        path = tempfile.mkdtemp(prefix="torchfarm-metrics-")
        os.environ[ENV] = path
        atexit.register(_remove_dir, os.getpid(), path)
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


def _remove_dir(owner: int, path: str) -> None:
    if os.getpid() == owner:  # forked pool processes inherit atexit hooks
        shutil.rmtree(path, ignore_errors=True)


def reset_dir() -> None:
    """Deletes the samples of earlier runs; only before the pool forks."""
    for f in use_dir().glob("*.db"):
        f.unlink(missing_ok=True)


def serve(port: int, queues: tuple[str, ...] = (), torch_version: str = "") -> None:
    """Serves the merged samples of every process of this worker on `port`."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    m = _metrics()
    m.build_info.labels(
        component="worker", version=__version__, python=platform.python_version(),
        torch=torch_version,
    ).set(1)
    # Series that exist from the start read 0, not "no data".
    for target in dict.fromkeys(metric_labels.target_of_queue(q) for q in queues):
        m.jobs.labels(target=target, outcome="succeeded", code="")
        m.redeliveries.labels(target=target)
        m.retries.labels(target=target)
    start_http_server(port, addr="0.0.0.0", registry=registry)
    log.info("worker metrics on :%d/metrics (samples in %s)", port, os.environ[ENV])


# Celery wiring: module-level receivers, since Celery keeps weak references by default.


def _on_init(**_: object) -> None:
    reset_dir()


def _on_ready(port: int, queues: tuple[str, ...], **_: object) -> None:
    import torch

    serve(port, queues, torch.__version__)


def _on_process_shutdown(pid: int | None = None, **_: object) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid or os.getpid())


def _on_retry(request: Any = None, **_: object) -> None:
    info = getattr(request, "delivery_info", None) or {}
    record_retry(str(info.get("routing_key", "")))


def install(port: int, queues: tuple[str, ...]) -> None:
    """Turns the worker's metrics on; call as the Celery app is built, in the main process."""
    from celery import signals

    use_dir()
    signals.worker_init.connect(_on_init, weak=False)
    signals.worker_ready.connect(functools.partial(_on_ready, port, queues), weak=False)
    signals.worker_process_shutdown.connect(_on_process_shutdown, weak=False)
    signals.task_retry.connect(_on_retry, weak=False)
