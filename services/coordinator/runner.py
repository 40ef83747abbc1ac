"""How the coordinator makes a blocking call from its event loop.

Redis and Celery clients are synchronous. Every call of theirs that a request makes
goes through one `Runner`, built where the services are built (server.py) and shared
by `Farm`, `KernelService` and `CacheService`: it runs the call in a worker thread, so
the loop that serves gRPC never blocks, and turns a backend's failure (Redis, the
broker, the network) into `BackendUnavailable`, which the servicer answers with
UNAVAILABLE and the SDK retries.

The CPU-bound checks of a request (a graph's validation and key, an upload's digests, a
kernel's source) go through `Runner.compute`, on threads of their own: on the loop, one
tenant's large graph stalled every tenant's calls for seconds, and on the store calls'
threads a few of them would keep those calls waiting. A tenant's checks hold all but one
of those threads at most, so one tenant's stream of large graphs queues behind itself,
not in front of the others' requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError

from services.coordinator.errors import BackendUnavailable

T = TypeVar("T")

BACKEND_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OperationalError, OSError)
"""What a store or broker call raises when its backend is down or unreachable."""

CHECK_THREADS = 2
"""Threads checking requests. Pure Python holds the GIL, so more would not check faster,
and each busy one takes the GIL from the loop at every switch interval
(sys.getswitchinterval, 5 ms): the loop runs slower while large requests are checked,
but it runs (a call's median 4 ms beside a 13 MiB graph's check, measured)."""


class _Share:
    """The check threads one tenant may hold, and how many of its calls use or await them."""

    def __init__(self, threads: int) -> None:
        self.threads = asyncio.Semaphore(threads)
        self.calls = 0


class Runner:
    """Runs blocking store and broker calls, and requests' checks, off the event loop."""

    def __init__(self, check_threads: int = CHECK_THREADS) -> None:
        self._checks = ThreadPoolExecutor(check_threads, thread_name_prefix="check")
        self._per_tenant = max(1, check_threads - 1)
        self._shares: dict[str, _Share] = {}
        """Tenants with checks running or waiting; touched on the event loop only."""

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in a worker thread; BackendUnavailable if its backend failed."""
        try:
            return await asyncio.to_thread(fn, *args)
        except BACKEND_ERRORS as e:
            raise BackendUnavailable(f"farm backend unavailable: {e}") from e

    async def compute(self, fn: Callable[..., T], *args: object, tenant: str = "") -> T:
        """`fn(*args)`, CPU-bound work on a request of `tenant`'s (a namespace), in a check
        thread; its errors (the request's refusals) reach the caller unchanged. The open
        farm's one tenant ("") may use every thread."""
        if not tenant:
            return await self._check(fn, *args)
        share = self._shares.setdefault(tenant, _Share(self._per_tenant))
        share.calls += 1
        try:
            async with share.threads:
                return await self._check(fn, *args)
        finally:
            share.calls -= 1
            if not share.calls:
                del self._shares[tenant]

    async def _check(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._checks, fn, *args)
