"""The worker's Celery app, built from a settings object: `create_app(settings)`.

The one app a worker process runs is built at its entry point (workers/app.py); tests
build theirs from settings they construct, several in one process if they like. The
app's tasks (workers/tasks.py) and its signal receivers (workers/lifecycle.py) read the
`Worker` handed to them, never a global.
"""

from __future__ import annotations

import logging

from celery import Celery

from torchfarm.celeryconf import make_celery
from workers import lifecycle, tasks
from workers import metrics as worker_metrics
from workers.serving import ServingPlan
from workers.settings import WorkerSettings
from workers.worker import Worker

log = logging.getLogger(__name__)


def create_app(settings: WorkerSettings, plan: ServingPlan | None = None) -> Celery:
    """The Celery app of the worker `settings` describe, its tasks registered and its
    receivers connected. Without a `plan`, plans what this machine serves
    (`serving.plan_for`). With a metrics port, call it in the process that forks the pool,
    before anything imports prometheus_client (workers/metrics.py)."""
    worker = Worker.of(settings, plan)
    if settings.metrics_port:
        worker_metrics.install(settings.metrics_port, tuple(worker.plan.queues))
    app = make_celery(
        settings.broker_url,
        name="torchfarm-worker",
        soft_time_limit_s=settings.soft_time_limit_s,
        hard_time_limit_s=settings.hard_time_limit_s,
        visibility_timeout_s=settings.visibility_timeout_s,
    )
    # The queues follow from the targets (lifecycle's `consume_target_queues`).
    app.conf.task_queues = None
    app.conf.task_create_missing_queues = True
    if not settings.signing_key_file:
        log.warning(
            "no TORCHFARM_SIGNING_KEY_FILE: this worker's artifacts are UNSIGNED, and clients "
            "that pin the farm's keys will refuse them"
        )
    jobs = tasks.register(app, worker)
    lifecycle.connect(app, worker, jobs)
    return app
