"""Prometheus metrics of the coordinator. Label values stay few: never a key or job id.

Three kinds:

- counters and histograms updated on the request path (requests by outcome, RPCs and
  errors by code, how long Submit, Watch and FetchArtifact took, artifact bytes,
  requeued jobs, refusals);
- `FarmCollector`: gauges read from Redis at scrape time (queue depth, jobs in flight
  and live workers per queue, cache memory and evictions), so a coordinator restart or
  a second replica reports the same numbers. Every replica exports the farm-wide
  values: dashboards and alerts aggregate them with `max by (target, kind, build)`,
  never `sum`. A queue is labelled by its target, job kind and build
  (torchfarm/metric_labels.py), the scheme the workers' metrics share;
- `torchfarm_build_info`, constant 1, with the versions as labels.

Metric names are part of the operations contract: ops/grafana, ops/prometheus and
k8s/ query them, and tests/ops checks every query against a real Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchfarm import __version__, metric_labels
from torchfarm.storage.explain import REASONS as MISS_REASONS
from torchfarm.wire.codes import REASONS, Rejection

log = logging.getLogger(__name__)

REQUESTS = Counter(
    "torchfarm_requests_total",
    "Compile submissions by outcome: hit, miss, deduplicated, failed, invalid.",
    ["outcome"],
)
ARTIFACT_BYTES = Histogram(
    "torchfarm_artifact_bytes",
    "Size of artifacts streamed to clients.",
    buckets=[2**i for i in range(12, 31, 2)],
)
RPC_ERRORS = Counter(
    "torchfarm_rpc_errors_total", "gRPC calls that ended in an error, by status code.", ["code"]
)
RPCS = Counter(
    "torchfarm_rpcs_total",
    "gRPC calls handled, by method and status code (OK included): the error ratio's denominator.",
    ["method", "code"],
)
REQUEUED = Counter(
    "torchfarm_jobs_requeued_total",
    "Jobs stuck past the stale limit that a submit deleted and queued again.",
)
AUTH_FAILURES = Counter(
    "torchfarm_auth_failures_total",
    "Calls refused for their credentials, by reason: missing, invalid or expired token "
    "(UNAUTHENTICATED), or throttled (RESOURCE_EXHAUSTED: the peer failed too often).",
    ["reason"],
)
ARTIFACTS_REFUSED = Counter(
    "torchfarm_artifacts_refused_total",
    "Cached artifacts the coordinator would not serve (and recompiles), by reason: "
    "corrupt blob, expired, unsigned, unknown_key, invalid or mismatched signature.",
    ["reason"],
)
MISSES = Counter(
    "torchfarm_misses_total",
    "Submits that queued a compile, by why no artifact matched (torchfarm/storage/explain.py): "
    "the first differing key component, evicted, or new.",
    ["reason"],
)
PRECOMPILED_MISSES = Counter(
    "torchfarm_precompiled_misses_total",
    "Precompiled-package fetches that missed, by why no package matched "
    "(torchfarm/storage/explain.py): the first differing key component, evicted, or new.",
    ["reason"],
)
QUOTA_REFUSALS = Counter(
    "torchfarm_quota_refusals_total",
    "Submits refused RESOURCE_EXHAUSTED because the tenant had its quota of jobs in flight.",
)
STORAGE_REFUSALS = Counter(
    "torchfarm_storage_refusals_total",
    "Precompiled uploads refused RESOURCE_EXHAUSTED: over the tenant's storage quota or "
    "the cache's room (STORAGE_QUOTA), or its upload rate (UPLOAD_RATE).",
    ["reason"],
)
STORAGE_EVICTIONS = Counter(
    "torchfarm_storage_evictions_total",
    "Entries the coordinator evicted to keep their own namespace within its storage quota.",
)
RPC_SECONDS = Histogram(
    "torchfarm_rpc_duration_seconds",
    "How long the calls a client waits on took, from arrival to the last message: Submit, "
    "Watch (open until the job ends: the wait for a compile) and FetchArtifact; by outcome "
    "(ok, or error for any other status).",
    ["method", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200),
)
TIMED_METHODS = ("Submit", "Watch", "FetchArtifact")
"""The methods `torchfarm_rpc_duration_seconds` times: the client's wait, end to end."""
BUILD_INFO = Gauge(
    "torchfarm_build_info",
    "Always 1; the labels say which build of torchfarm runs.",
    ["component", "version", "python", "torch"],
)

# Series that exist from the start read 0 instead of "no data" in graphs and alerts.
for _outcome in ("hit", "miss", "deduplicated", "failed", "invalid"):
    REQUESTS.labels(outcome=_outcome)
for _reason in MISS_REASONS:
    MISSES.labels(reason=_reason)
    PRECOMPILED_MISSES.labels(reason=_reason)
for _code in sorted({info.status for info in REASONS.values()}):
    RPC_ERRORS.labels(code=_code)
for _method in TIMED_METHODS:
    for _ok in ("ok", "error"):
        RPC_SECONDS.labels(method=_method, outcome=_ok)
AUTH_FAILURE_REASONS = ("missing", "invalid", "expired", "throttled")
for _reason in AUTH_FAILURE_REASONS:
    AUTH_FAILURES.labels(reason=_reason)
REFUSAL_REASONS = (
    Rejection.CORRUPT, Rejection.EXPIRED, Rejection.UNSIGNED, Rejection.UNKNOWN_KEY,
    Rejection.INVALID, Rejection.MISMATCH,
)
"""Why the coordinator refuses a cached artifact (`Farm._refusal`, `Farm.fetch`)."""
for _rejection in REFUSAL_REASONS:
    ARTIFACTS_REFUSED.labels(reason=_rejection.value)

SERVER_ERROR_CODES = ("UNKNOWN", "INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED", "DATA_LOSS")
"""Codes that count against the farm in the error-ratio alert; the rest are the caller's."""


def set_build_info(component: str = "coordinator", torch: str = "") -> None:
    BUILD_INFO.labels(
        component=component, version=__version__, python=platform.python_version(), torch=torch
    ).set(1)


# Gauges read at scrape time.

@dataclass(frozen=True)
class FarmGauges:
    """One reading of the farm's state, per queue (a queue is a device kind)."""

    queued: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    cache_used_bytes: int = 0
    cache_max_bytes: int = 0
    cache_evictions: int = 0


_QUEUE_LABELS = list(metric_labels.QueueLabels._fields)


def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    return {
        "up": GaugeMetricFamily(
            "torchfarm_backend_up",
            "1 when the coordinator could read Redis and the broker for this scrape, else 0.",
        ),
        "queued": GaugeMetricFamily(
            "torchfarm_queue_depth",
            "Jobs waiting in the broker's queue, not yet taken by a worker.",
            labels=_QUEUE_LABELS,
        ),
        "in_flight": GaugeMetricFamily(
            "torchfarm_jobs_in_flight",
            "Jobs a worker has taken and is compiling now.",
            labels=_QUEUE_LABELS,
        ),
        "workers": GaugeMetricFamily(
            "torchfarm_workers",
            "Live workers (heartbeat not expired) serving the queue.",
            labels=_QUEUE_LABELS,
        ),
        "used": GaugeMetricFamily(
            "torchfarm_cache_used_bytes", "Memory used by the Redis that holds the cache."
        ),
        "max": GaugeMetricFamily(
            "torchfarm_cache_max_bytes", "The cache Redis' maxmemory; 0 means no limit."
        ),
        "evictions": CounterMetricFamily(
            "torchfarm_cache_evictions",
            "Keys the cache Redis evicted under memory pressure (its INFO evicted_keys).",
        ),
    }


class FarmCollector(Collector):
    """Reads the farm's gauges when Prometheus scrapes, in the HTTP server's thread.

    A failed read yields `torchfarm_backend_up 0` and nothing else, so a Redis outage
    shows up as an alert instead of a failed scrape.
    """

    def __init__(self, read: Callable[[], FarmGauges]):
        self.read = read

    def describe(self) -> Iterable[Metric]:
        # Lets the registry check names without calling Redis at registration.
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        fam = _families()
        try:
            g = self.read()
        except Exception as e:
            log.warning("metrics: cannot read the farm's state: %s", e)
            fam["up"].add_metric([], 0)
            yield fam["up"]
            return
        fam["up"].add_metric([], 1)
        for name in ("queued", "in_flight", "workers"):
            for queue, n in sorted(getattr(g, name).items()):
                fam[name].add_metric(list(metric_labels.of_queue(queue)), n)
        fam["used"].add_metric([], g.cache_used_bytes)
        fam["max"].add_metric([], g.cache_max_bytes)
        fam["evictions"].add_metric([], g.cache_evictions)
        yield from fam.values()


_installed: FarmCollector | None = None


def install_farm_collector(
    read: Callable[[], FarmGauges], registry: CollectorRegistry = REGISTRY
) -> FarmCollector:
    """Registers the farm collector, replacing one an earlier server in this process left."""
    global _installed
    if _installed is not None:
        try:
            registry.unregister(_installed)
        except KeyError:
            pass
    _installed = FarmCollector(read)
    registry.register(_installed)
    return _installed


# RPC counts, by a server interceptor so every method and every exit path is counted.


def _code_name(code: object) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for c in grpc.StatusCode:
            if c.value[0] == code:
                return c.name
    return "OK"


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts each call of the farm's service in `torchfarm_rpcs_total{method, code}` when
    it ends, and times the calls a client waits on (TIMED_METHODS)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        if handler is None or service.startswith("grpc.health."):
            return handler  # probes are not farm traffic: they would dilute the error ratio
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _count_unary(method, handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _count_stream(method, handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return handler  # the farm has no client-streaming methods


def _ended(
    method: str, context: grpc.aio.ServicerContext[Any, Any], exc: BaseException | None, began: float
) -> None:
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        code = "CANCELLED"
    elif exc is not None and not isinstance(exc, grpc.aio.AbortError):
        code = "UNKNOWN"
    else:
        code = _code_name(context.code())
    RPCS.labels(method=method, code=code).inc()
    if method in TIMED_METHODS:
        outcome = "ok" if code == "OK" else "error"
        RPC_SECONDS.labels(method=method, outcome=outcome).observe(time.monotonic() - began)


# grpc's stubs type a handler's behaviours as synchronous; under grpc.aio they are async.
def _count_unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        began = time.monotonic()
        try:
            response = await behavior(request, context)
        except BaseException as e:
            _ended(method, context, e, began)
            raise
        _ended(method, context, None, began)
        return response

    return call


def _count_stream(method: str, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        began = time.monotonic()
        try:
            async for response in behavior(request, context):
                yield response
        except BaseException as e:
            _ended(method, context, e, began)
            raise
        _ended(method, context, None, began)

    return call
