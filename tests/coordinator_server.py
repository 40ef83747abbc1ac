"""A real coordinator gRPC server in a background thread, for tests that need the wire
(auth, limits, fuzzing) but no Celery: pass the shipped InlineDispatcher, which records
what would be queued."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from services.coordinator.farm import Dispatcher
from services.coordinator.server import serve
from services.coordinator.settings import CoordinatorSettings


@contextlib.contextmanager
def running_coordinator(settings: CoordinatorSettings, dispatcher: Dispatcher) -> Iterator[None]:
    loop = asyncio.new_event_loop()
    holder: dict[str, asyncio.Event] = {}
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        holder["stop"] = asyncio.Event()
        try:
            loop.run_until_complete(serve(settings, holder["stop"], dispatcher))
        except BaseException as e:  # surfaced by the wait below
            failure.append(e)

    thread = threading.Thread(target=run, name="coordinator", daemon=True)
    thread.start()
    host, port = settings.listen.rsplit(":", 1)
    deadline = time.monotonic() + 20
    while True:
        if failure:
            raise failure[0]
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError("coordinator did not start") from None
            time.sleep(0.05)
    time.sleep(0.2)  # bound is not yet serving
    try:
        yield
    finally:
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
        loop.close()
