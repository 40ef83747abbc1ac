"""Readiness: the gRPC health service says NOT_SERVING while a Redis the farm needs is
unreachable, and SERVING again once it answers.

A coordinator that cannot reach the state, cache or broker Redis fails every Submit;
taking it out of the Service (the readiness probe reads this status) sends clients to
a replica that can. Checked every `health_check_s`, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from grpc_health.v1 import health, health_pb2

log = logging.getLogger(__name__)

Ping = Callable[[], object]
"""A blocking check that raises when its backend is unreachable (a Redis PING)."""


async def set_status(servicer: health.aio.HealthServicer, names: Sequence[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in names:
        await servicer.set(name, status)


def backends_up(pings: Sequence[Ping]) -> bool:
    """True when every backend answers; logs the first that does not."""
    for ping in pings:
        try:
            ping()
        except Exception as e:
            log.warning("readiness: a backend is unreachable: %s", e)
            return False
    return True


async def watch_backends(
    servicer: health.aio.HealthServicer, names: Sequence[str], pings: Sequence[Ping],
    interval_s: float, stop: asyncio.Event,
) -> None:
    """Sets the health status from the backends every `interval_s` until `stop`."""
    serving: bool | None = None
    while not stop.is_set():
        up = await asyncio.to_thread(backends_up, pings)
        if up != serving and not stop.is_set():
            await set_status(servicer, names, up)
            log.log(logging.INFO if up else logging.WARNING,
                    "readiness: %s", "SERVING" if up else "NOT_SERVING (a Redis is unreachable)")
            serving = up
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


def probe(address: str, service: str = "torchfarm.v1.CompileFarm") -> int:
    """Exit status of a health check: 0 when SERVING (compose's healthcheck runs this)."""
    import grpc
    from grpc_health.v1 import health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as ch:
            # Any: the stub package's HealthStub lacks its generated methods (Check).
            stub: Any = health_pb2_grpc.HealthStub(ch)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
    except grpc.RpcError as e:
        print(f"{address}: {e.code().name}")
        return 1
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    import sys

    sys.exit(probe(sys.argv[1]))
