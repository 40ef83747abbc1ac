"""The Celery app a worker runs: `celery -A workers.app worker -Q cpu` (or `torchfarm worker`).

Settings come from TORCHFARM_* variables, read here, at the entry point. The main
worker process registers the worker in Redis and keeps a heartbeat, so the coordinator
can answer UNAVAILABLE at once when no live worker serves a target. Each pool process
builds its own Redis connection after the fork.
"""

from __future__ import annotations

import logging
import threading

from celery import signals

from torchfarm.celeryconf import make_celery
from torchfarm.settings import from_env
from torchfarm.store import Store
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

settings = from_env(WorkerSettings)
app = make_celery(settings.broker_url, name="torchfarm-worker")
app.conf.include = ["workers.tasks"]
app.conf.task_queues = None
app.conf.task_create_missing_queues = True

_stop_heartbeat = threading.Event()


def _build_label() -> str:
    import torch

    return f"torch {torch.__version__}"


def _heartbeat(store: Store, name: str, build: str) -> None:
    while not _stop_heartbeat.is_set():
        try:
            store.heartbeat(name, list(settings.queues), build, settings.worker_ttl_s)
        except Exception as e:  # keep beating through a Redis restart
            log.warning("heartbeat failed: %s", e)
        _stop_heartbeat.wait(settings.heartbeat_s)


@signals.worker_ready.connect
def _register(sender, **_: object) -> None:
    store = Store.from_url(settings.cache_url, settings.redis_prefix)
    name = settings.name or sender.hostname
    threading.Thread(
        target=_heartbeat, args=(store, name, _build_label()), name="heartbeat", daemon=True
    ).start()
    log.info("worker %s registered for queues %s", name, ",".join(settings.queues))


@signals.worker_shutdown.connect
def _unregister(sender, **_: object) -> None:
    _stop_heartbeat.set()
    store = Store.from_url(settings.cache_url, settings.redis_prefix)
    try:
        store.forget_worker(settings.name or sender.hostname)
    except Exception as e:
        log.warning("could not unregister: %s", e)
