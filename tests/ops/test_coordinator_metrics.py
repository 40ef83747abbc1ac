"""The coordinator's metrics: the farm collector, the gauges it reads from Redis, and
the /metrics endpoint of a real grpc.aio server (Redis on loopback, no workers)."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port
from services.coordinator import metrics
from services.coordinator.gauges import read_gauges
from services.coordinator.metrics import FarmCollector, FarmGauges
from services.coordinator.server import serve
from services.coordinator.settings import CoordinatorSettings
from tests.requests import relu_request
from torchfarm import metric_labels
from torchfarm.storage.store import JobState
from torchfarm.v1 import farm_pb2, farm_pb2_grpc


def _scrape(collector: FarmCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_farm_collector_exports_gauges_per_queue():
    text = _scrape(FarmCollector(lambda: FarmGauges(
        queued={"cpu.avx2.b3f9c21": 3, "cuda.sm_90.b3f9c21": 0, "kernels.cuda.sm_90": 2},
        in_flight={"cpu.avx2.b3f9c21": 1, "cuda.sm_90.b3f9c21": 0, "kernels.cuda.sm_90": 0},
        workers={"cpu.avx2.b3f9c21": 2, "cuda.sm_90.b3f9c21": 0, "kernels.cuda.sm_90": 1},
        cache_used_bytes=1024, cache_max_bytes=4096, cache_evictions=7,
    )))
    assert "torchfarm_backend_up 1.0" in text
    # One label scheme (torchfarm/metric_labels.py): the target as the CLI prints it.
    assert 'torchfarm_queue_depth{build="3f9c21",kind="graph",target="cpu:avx2"} 3.0' in text
    assert 'torchfarm_queue_depth{build="",kind="kernel",target="cuda:sm_90"} 2.0' in text
    assert 'torchfarm_jobs_in_flight{build="3f9c21",kind="graph",target="cpu:avx2"} 1.0' in text
    assert 'torchfarm_workers{build="3f9c21",kind="graph",target="cuda:sm_90"} 0.0' in text
    assert "torchfarm_cache_used_bytes 1024.0" in text
    assert "torchfarm_cache_max_bytes 4096.0" in text
    assert "torchfarm_cache_evictions_total 7.0" in text
    assert "# TYPE torchfarm_cache_evictions_total counter" in text


def test_farm_collector_reports_a_failed_read_as_backend_down():
    def broken() -> FarmGauges:
        raise ConnectionError("redis down")

    text = _scrape(FarmCollector(broken))
    assert "torchfarm_backend_up 0.0" in text
    assert "torchfarm_queue_depth" not in text.replace("# HELP", "").split("backend_up")[-1]


def test_registration_does_not_read_the_farm():
    def never() -> FarmGauges:
        raise AssertionError("read at registration")

    registry = CollectorRegistry()
    registry.register(FarmCollector(never))  # describe() answers, collect() is not called


def test_queue_labels():
    assert metric_labels.of_queue("cpu") == ("cpu", "graph", "")
    assert metric_labels.of_queue("cuda.sm_90.b3f9c21") == ("cuda:sm_90", "graph", "3f9c21")
    assert metric_labels.of_queue("kernels.rocm.gfx942") == ("rocm:gfx942", "kernel", "")
    assert metric_labels.of_queue("stages.cpu.avx2.b3f9c21") == ("cpu:avx2", "stage", "3f9c21")
    assert metric_labels.of_queue("other") == ("unknown", "graph", "")


def test_label_values_stay_few():
    """No metric may carry a key, a job id or a worker name as a label."""
    for m in (metrics.REQUESTS, metrics.RPC_ERRORS, metrics.RPCS, metrics.BUILD_INFO,
              metrics.RPC_SECONDS, metrics.AUTH_FAILURES, metrics.ARTIFACTS_REFUSED, metrics.MISSES):
        assert not set(m._labelnames) & {"key", "job_id", "worker", "label", "queue"}


def test_refusal_and_auth_series_exist_before_any_event():
    """Alerts select these by reason: a series that appears only at the first event
    reads "no data" until then, and an `increase()` over it misses that first event."""
    text = generate_latest().decode()
    for reason in ("corrupt", "invalid", "mismatch", "unsigned"):
        assert f'torchfarm_artifacts_refused_total{{reason="{reason}"}}' in text
    for reason in ("missing", "invalid", "expired", "throttled"):
        assert f'torchfarm_auth_failures_total{{reason="{reason}"}}' in text
    for method in metrics.TIMED_METHODS:
        assert f'torchfarm_rpc_duration_seconds_count{{method="{method}",outcome="ok"}}' in text


def _queued(depths: dict[str, int]) -> InlineDispatcher:
    """A dispatcher holding `depths[queue]` jobs on each queue, run by nobody."""
    dispatcher = InlineDispatcher()
    for queue, depth in depths.items():
        for n in range(depth):
            dispatcher.send(f"job-{n}", queue)
    return dispatcher


@pytest.mark.integration
def test_read_gauges_from_redis(store):
    store.heartbeat("w1", ["cpu"], "b", ttl_s=30)
    store.heartbeat("w2", ["cpu", "cuda"], "b", ttl_s=30)
    for key, queue, state in [("k1", "cpu", JobState.RUNNING), ("k2", "cpu", JobState.QUEUED),
                              ("k3", "cuda", JobState.RUNNING), ("k4", "cpu", JobState.SUCCEEDED),
                              ("k5", "rocm", JobState.QUEUED)]:
        store.create_job(key, queue, "", ttl_s=60)
        store.update_job(key, state=state)
    # Celery's own queues are declared in a real broker too; nothing runs what is sent.
    broker = _queued({"cpu": 5, "rocm": 1, "cpu0@vm.celery.pidbox": 1, "celeryev": 1})
    g = read_gauges(store, broker, window_s=600)
    # Served, or named by a job; Celery's own queues left out.
    assert set(g.queued) == {"cpu", "cuda", "rocm"}
    assert g.queued == {"cpu": 5, "cuda": 0, "rocm": 1}
    assert g.in_flight == {"cpu": 1, "cuda": 1, "rocm": 0}
    # rocm has a job waiting and no worker: what TorchfarmNoWorkerForQueuedJobs catches.
    assert g.workers == {"cpu": 2, "cuda": 1, "rocm": 0}
    assert g.cache_used_bytes > 0
    assert g.cache_evictions >= 0


@pytest.mark.integration
def test_messages_no_worker_will_take_and_no_one_waits_for_are_not_queue_depth(store):
    # A tenant's jobs for a made-up build of a known target: queued for a pool that
    # never serves that build. Their records expire with the tenant's quota; their
    # messages do not. Counted as depth, they would hold the pool's autoscaler up for
    # ever (k8s/keda.yaml sums every build of a target).
    store.heartbeat("w1", ["cuda.sm_90.breal"], "real", ttl_s=30)
    store.create_job("k1", "cuda.sm_90.bmadeup1", "", ttl_s=60)
    broker = _queued({"cuda.sm_90.breal": 2, "cuda.sm_90.bmadeup1": 3, "cuda.sm_90.bmadeup2": 4})
    g = read_gauges(store, broker, window_s=600)
    # The one live record stands for one message; the expired ones' stand for none.
    assert g.queued == {"cuda.sm_90.breal": 2, "cuda.sm_90.bmadeup1": 1}
    # A pool that went away within the window still reports what waits for it.
    store.forget_worker("w1")
    assert read_gauges(store, broker, window_s=600).queued["cuda.sm_90.breal"] == 2




def _value(text: str, sample: str) -> float:
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert m, f"{sample} not in /metrics"
    return float(m.group(1))


@pytest.mark.integration
def test_coordinator_serves_metrics(store, redis_url):
    """A real server: RPC counts by method and code, errors, the farm gauges, build info."""
    store.heartbeat("w1", ["cpu"], "b", ttl_s=30)
    grpc_port, metrics_port = free_port(), free_port()
    settings = CoordinatorSettings(
        listen=f"127.0.0.1:{grpc_port}", cache_url=redis_url, broker_url=redis_url,
        metrics_port=metrics_port, grace_s=0.5,
    )

    async def scenario() -> str:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, stop, dispatcher=_queued({"cpu": 4})))
        async with grpc.aio.insecure_channel(settings.listen) as ch:
            await ch.channel_ready()
            stub = farm_pb2_grpc.CompileFarmStub(ch)
            await stub.GetFarmStatus(farm_pb2.FarmStatusRequest(), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetJob(farm_pb2.JobRef(key="0" * 64), timeout=5)
            bad = relu_request()
            bad.target.device = "tpu"
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Submit(bad, timeout=5)
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read().decode()
        )
        stop.set()
        await server
        return text

    text = asyncio.run(scenario())
    assert _value(text, 'torchfarm_rpcs_total{code="OK",method="GetFarmStatus"}') >= 1
    assert _value(text, 'torchfarm_rpcs_total{code="NOT_FOUND",method="GetJob"}') >= 1
    assert _value(text, 'torchfarm_rpcs_total{code="INVALID_ARGUMENT",method="Submit"}') >= 1
    assert _value(text, 'torchfarm_rpc_errors_total{code="NOT_FOUND"}') >= 1
    assert _value(text, 'torchfarm_requests_total{outcome="invalid"}') >= 1
    assert _value(text, 'torchfarm_requests_total{outcome="hit"}') >= 0
    assert _value(text, "torchfarm_backend_up") == 1
    assert _value(text, 'torchfarm_queue_depth{build="",kind="graph",target="cpu"}') == 4
    assert _value(text, 'torchfarm_workers{build="",kind="graph",target="cpu"}') == 1
    # The client's wait, timed: a refused Submit and a GetJob are not waits on a compile.
    assert _value(text, 'torchfarm_rpc_duration_seconds_count{method="Submit",outcome="error"}') >= 1
    assert 'torchfarm_rpc_duration_seconds_count{method="GetJob"' not in text
    assert re.search(r'^torchfarm_build_info\{component="coordinator",.*version="[^"]+"', text, re.M)
