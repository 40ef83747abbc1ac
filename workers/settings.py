"""A worker's settings, read once from TORCHFARM_* variables when the worker starts."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSettings:
    broker_url: str = "redis://127.0.0.1:6379/0"
    """Celery's broker; the same one the coordinator sends to."""
    cache_url: str = "redis://127.0.0.1:6379/1"
    """The Redis that holds artifacts, requests and job records."""
    redis_prefix: str = "tf"
    """Prefix of every key the farm writes in the cache Redis."""
    queues: tuple[str, ...] = ("cpu",)
    """Celery queues this worker consumes: the device kinds it compiles for."""
    name: str = ""
    """The name it registers under; defaults to host and process id."""
    heartbeat_s: float = 5.0
    """How often the worker renews its registration."""
    worker_ttl_s: int = 15
    """A registration not renewed for this long expires: the worker counts as gone."""
    max_attempts: int = 3
    """Deliveries of one job (a worker lost mid-compile redelivers it) before it fails."""
    failed_ttl_s: int = 60
    """A failed job's record is kept this long; submits meanwhile get the failure at once."""
    done_ttl_s: int = 3600
    """A finished job's record is kept this long; the artifact itself stays in the cache."""

    def worker_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"
