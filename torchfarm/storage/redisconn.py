"""Redis connections from one URL, a plain Redis or a Sentinel-watched primary.

    redis://host:6379/1                                a single Redis
    redis+sentinel://host1:26379,host2:26379/mymaster/1   the primary that the
        Sentinels at host1 and host2 name for service "mymaster", database 1; an
        optional `password@` before the hosts is the Redis (not Sentinel) password

With Sentinel, each new connection asks the Sentinels for the current primary, and
a command that fails on a connection (the old primary went away, or became a replica
and refuses writes) is retried on a new one, so a failover costs seconds and no job.
The broker takes the same URL: `celery_broker` turns it into Celery's `sentinel://`
form and its `master_name` transport option.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

SCHEME = "redis+sentinel"

FAILOVER_RETRIES = 40
"""Attempts of a command across a failover; with the backoff capped at 0.5 s, about
20 s: longer than Sentinel's default failover with down-after-milliseconds lowered."""


class RedisURLError(ValueError):
    pass


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password else None
    hostlist = parts.netloc.rpartition("@")[2]
    hosts = []
    for item in hostlist.split(","):
        host, _, port = item.partition(":")
        if not host:
            raise RedisURLError(f"{url!r}: empty Sentinel host")
        hosts.append((host, int(port or 26379)))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise RedisURLError(f"{url!r}: name the service, redis+sentinel://hosts/<service>[/<db>]")
    db = int(path[1]) if len(path) > 1 else 0
    return hosts, path[0], db, password


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client for `url`; `kwargs` (timeouts) as for redis.Redis."""
    if not url.startswith(SCHEME + "://"):
        return redis.Redis.from_url(url, **kwargs)
    hosts, service, db, password = _sentinel_parts(url)
    sentinel = Sentinel(hosts, socket_timeout=kwargs.get("socket_timeout", 5))  # type: ignore[no-untyped-call]
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), FAILOVER_RETRIES)
    return cast(redis.Redis, sentinel.master_for(  # type: ignore[no-untyped-call]
        service, db=db, password=password, retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError], **kwargs,
    ))


def celery_broker(url: str) -> tuple[str, dict[str, Any]]:
    """(broker URL, broker transport options) for Celery, from a torchfarm Redis URL."""
    if not url.startswith(SCHEME + "://"):
        return url, {}
    hosts, service, db, password = _sentinel_parts(url)
    auth = f":{password}@" if password else ""
    return ";".join(f"sentinel://{auth}{h}:{p}/{db}" for h, p in hosts), {"master_name": service}
