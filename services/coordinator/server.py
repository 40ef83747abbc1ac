"""The coordinator's entry point: a grpc.aio server with health, metrics and a graceful stop.

    python -m services.coordinator.server     (or: torchfarm coordinator)

The health service reports NOT_SERVING while a Redis is unreachable (readiness.py),
also on `health_port`, a plaintext port for probes. On SIGTERM or SIGINT it reports
NOT_SERVING first, so load balancers
stop sending new calls, then in-flight calls get `grace_s` to finish.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from prometheus_client import start_http_server

from services.coordinator import auth, metrics, readiness
from services.coordinator.farm import CeleryDispatcher, Dispatcher, Farm
from services.coordinator.gauges import read_gauges
from services.coordinator.jobevents import JobEvents
from services.coordinator.servicer import CompileFarmServicer
from services.coordinator.settings import CoordinatorSettings
from torchfarm.settings import from_env
from torchfarm.storage import redisconn
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2, farm_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = farm_pb2.DESCRIPTOR.services_by_name["CompileFarm"].full_name


RECEIVE_MARGIN_BYTES = 64 * 1024
"""What the receive limit allows past max_request_bytes: a request a little over the farm's
limit still reaches it, to be refused with the farm's own reason and numbers."""


def grpc_options(settings: CoordinatorSettings) -> list[tuple[str, int]]:
    """The server's channel options. grpc reads and parses a whole request before its
    handler runs, so the receive limit is what the farm accepts (every request it takes:
    Submit, PutPrecompiled, CompileKernel, is held to max_request_bytes; the others are
    small), not the send limit: at 64 MiB, each refused-anyway 60 MiB Submit cost the
    process ~110 MiB while it was read and parsed."""
    receive = min(settings.max_message_bytes, settings.max_request_bytes + RECEIVE_MARGIN_BYTES)
    return [
        ("grpc.max_receive_message_length", receive),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def max_concurrent_rpcs(settings: CoordinatorSettings) -> int | None:
    """The server's cap on calls in flight, all tenants together (None: no cap)."""
    return settings.max_concurrent_rpcs or None


async def serve(
    settings: CoordinatorSettings,
    stop: asyncio.Event,
    dispatcher: Dispatcher | None = None,
) -> None:
    """Serves until `stop` is set, then drains and returns."""
    store = Store.from_url(settings.cache_url, settings.redis_prefix, settings.blob_url, settings.state_url)
    # Before serving: a state Redis that may evict loses jobs in flight to a flood.
    store.check_state_redis()
    # Watch is woken by the pub/sub of the Redis that holds the job records. The asyncio
    # client takes no Sentinel URL: behind Sentinel, Watch polls (watch_poll_s).
    state_url = settings.state_url or settings.cache_url
    sentinel = state_url.startswith(redisconn.SCHEME + "://")
    events = None if sentinel else JobEvents(state_url)
    farm = Farm(settings, store, dispatcher or CeleryDispatcher(settings.broker_url), events)
    server = grpc.aio.server(
        options=grpc_options(settings),
        maximum_concurrent_rpcs=max_concurrent_rpcs(settings),
        interceptors=[
            metrics.RpcMetricsInterceptor(),
            auth.AuthInterceptor(
                auth.load_tokens(settings), auth.failure_limiter(settings), auth.trusted_proxies(settings)
            ),
        ],
    )
    farm_pb2_grpc.add_CompileFarmServicer_to_server(CompileFarmServicer(farm, settings), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    credentials = auth.server_credentials(settings)
    if credentials is None:
        bound = server.add_insecure_port(settings.listen)
    else:
        bound = server.add_secure_port(settings.listen, credentials)
    if bound == 0:
        raise OSError(f"cannot bind {settings.listen}")
    http = None
    if settings.metrics_port:
        metrics.set_build_info()
        metrics.install_farm_collector(
            functools.partial(read_gauges, store, farm.dispatcher, settings.known_target_window_s)
        )
        http, _ = start_http_server(settings.metrics_port, addr="0.0.0.0")
    names = ("", SERVICE_NAME)
    # Not ready until the first check of the backends says so.
    await readiness.set_status(health_servicer, names, serving=False)
    probe_server = None
    if settings.health_port:
        probe_server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probe_server)
        if probe_server.add_insecure_port(f"0.0.0.0:{settings.health_port}") == 0:
            raise OSError(f"cannot bind the health port {settings.health_port}")
        await probe_server.start()
    await server.start()
    checking = asyncio.Event()
    pings = [store.r.ping, store.c.ping, *_broker_ping(farm.dispatcher)]
    watcher = asyncio.create_task(readiness.watch_backends(
        health_servicer, names, pings, settings.health_check_s, checking))
    log.info("coordinator serving on %s (%s)", settings.listen, "TLS" if credentials else "plaintext")
    await stop.wait()
    log.info("coordinator stopping; draining for up to %.0fs", settings.grace_s)
    checking.set()
    await watcher
    await readiness.set_status(health_servicer, names, serving=False)
    await server.stop(settings.grace_s)
    if probe_server is not None:
        await probe_server.stop(0)
    if events is not None:
        await events.close()
    if http is not None:
        http.shutdown()
        http.server_close()
    log.info("coordinator stopped")


def _broker_ping(dispatcher: Dispatcher) -> list[readiness.Ping]:
    broker = getattr(dispatcher, "broker", None)  # CeleryDispatcher's Redis; fakes have none
    return [broker.ping] if broker is not None else []


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = from_env(CoordinatorSettings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
