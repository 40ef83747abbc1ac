"""Wake-ups for the coordinator's watchers: Redis pub/sub on each job's channel.

The store publishes on `tf:jobev:<key>` whenever it writes a job record
(torchfarm/storage/store.py `Store.job_channel`). Watch and CompileKernel's wait read the record
when woken, and otherwise only every `watch_poll_s` as a safety net: for changes no one
announces (the staged compile's kernel counts, written by Lua scripts), a message lost
while the connection was down, or a Redis that refuses SUBSCRIBE.

One pub/sub connection serves the whole process. A channel is subscribed while at least
one watcher waits on it, and a reader task sets each waiter's event when a message
arrives. The connection is opened on first use and, if it breaks, opened again with
every channel in use subscribed again; until then the watchers poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import redis
import redis.asyncio

log = logging.getLogger(__name__)

RECONNECT_S = 1.0
"""Pause before the reader opens a broken pub/sub connection again."""


class JobEvents:
    def __init__(self, url: str):
        self.url = url
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._pubsub: redis.asyncio.client.PubSub | None = None
        self._client: redis.asyncio.Redis | None = None
        self._reader: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def watching(self, channel: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever a message arrives on `channel`, while the block runs."""
        event = asyncio.Event()
        waiters = self._waiters.setdefault(channel, set())
        waiters.add(event)
        try:
            if len(waiters) == 1:
                await self._subscribe(channel)
            yield event
        finally:
            waiters.discard(event)
            if not waiters:
                del self._waiters[channel]
                await self._unsubscribe(channel)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        await self._drop()

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _open(self) -> None:
        """A new connection, subscribed to every channel in use."""
        self._client = redis.asyncio.Redis.from_url(self.url, socket_connect_timeout=5)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(*self._waiters)

    async def _subscribe(self, channel: str) -> None:
        try:
            if self._pubsub is None:
                await self._open()  # this channel included
            else:
                await self._pubsub.subscribe(channel)
        except (redis.RedisError, OSError) as e:
            log.warning("cannot subscribe to %s (%s); its watchers poll", channel, e)
            await self._drop()
        self._ensure_reader()

    async def _unsubscribe(self, channel: str) -> None:
        if self._pubsub is None:
            return
        try:
            await self._pubsub.unsubscribe(channel)
        except (redis.RedisError, OSError) as e:
            log.debug("unsubscribe %s: %s", channel, e)

    async def _read(self) -> None:
        while True:
            pubsub = self._pubsub
            try:
                if pubsub is None:  # lost: open it again while anyone waits
                    await asyncio.sleep(RECONNECT_S)
                    await self._reopen()
                    continue
                if not pubsub.subscribed:  # nobody waits right now
                    await asyncio.sleep(0.05)
                    continue
                message = await pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as e:
                log.warning("job event connection lost (%s); watchers poll until it is back", e)
                await self._drop()
                continue
            if message and message.get("type") == "message":
                channel = message["channel"]
                name = channel.decode() if isinstance(channel, bytes) else str(channel)
                for event in self._waiters.get(name, ()):
                    event.set()

    async def _reopen(self) -> None:
        if not self._waiters:
            return
        try:
            await self._open()
        except (redis.RedisError, OSError) as e:
            log.warning("job events: cannot reconnect (%s)", e)
            await self._drop()
            return
        for waiters in self._waiters.values():  # anything may have changed meanwhile
            for event in waiters:
                event.set()

    async def _drop(self) -> None:
        pubsub, client = self._pubsub, self._client
        self._pubsub = self._client = None
        with contextlib.suppress(Exception):
            if pubsub is not None:
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            if client is not None:
                await client.aclose()


async def wait_for_change(event: asyncio.Event, poll_s: float) -> None:
    """Returns when `event` is set, or after `poll_s` (the safety net), and clears it."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), poll_s)
    event.clear()
