"""A real coordinator gRPC server in a background thread, for tests that need the wire
(auth, limits, fuzzing) but no Celery: pass the shipped InlineDispatcher, which records
what would be queued."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port
from services.coordinator.farm import Dispatcher
from services.coordinator.server import serve
from services.coordinator.settings import CoordinatorSettings
from tests.requests import RELU_QUEUE
from torchfarm.storage.store import Store


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


def write_token_table(path: Path, entries: dict[str, Any]) -> None:
    """The token table, replaced whole, as an operator's edit lands."""
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, path)


@contextlib.contextmanager
def token_farms(
    store: Store, tmp_path: Path, redis_url: str
) -> Iterator[Callable[..., tuple[str, Path]]]:
    """`start(entries, **settings)`: a coordinator with that token table, the relu graph's
    queue served; returns (address, tokens file). All stop when the block ends."""
    stack = contextlib.ExitStack()

    def start(entries: dict[str, Any], **over: Any) -> tuple[str, Path]:
        path = tmp_path / "tokens.json"
        write_token_table(path, entries)
        port = free_port()
        settings = CoordinatorSettings(
            listen=f"127.0.0.1:{port}", cache_url=redis_url, tokens_file=str(path),
            **{"tokens_check_s": 0.0, "poll_interval_s": 0.02, "grace_s": 1, **over},
        )
        store.heartbeat("w1", [RELU_QUEUE, "cpu"], "test", ttl_s=60)
        stack.enter_context(running_coordinator(settings, InlineDispatcher()))
        return f"127.0.0.1:{port}", path

    with stack:
        yield start
