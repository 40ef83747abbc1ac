"""How the coordinator makes a blocking call from its event loop.

Redis and Celery clients are synchronous. Every call of theirs that a request makes
goes through one `Runner`, built where the services are built (server.py) and shared
by `Farm`, `KernelService` and `CacheService`: it runs the call in a worker thread, so
the loop that serves gRPC never blocks, and turns a backend's failure (Redis, the
broker, the network) into `BackendUnavailable`, which the servicer answers with
UNAVAILABLE and the SDK retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError

from services.coordinator.errors import BackendUnavailable

T = TypeVar("T")

BACKEND_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OperationalError, OSError)
"""What a store or broker call raises when its backend is down or unreachable."""


class Runner:
    """Runs blocking store and broker calls off the event loop."""

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in a worker thread; BackendUnavailable if its backend failed."""
        try:
            return await asyncio.to_thread(fn, *args)
        except BACKEND_ERRORS as e:
            raise BackendUnavailable(f"farm backend unavailable: {e}") from e
