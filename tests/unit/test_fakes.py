"""The farm in process (localfarm/fakes.py): the in-memory store, the inline
dispatcher and the in-process client behave as the real pieces do, with no process."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localfarm.fakes import (
    InlineDispatcher,
    InProcessFarm,
    UnknownTask,
    job_function,
    memory_store,
)
from localfarm.inline import JOBS
from sdk.errors import FarmUnavailable, GraphRejected, NoWorker, RemoteCompileError
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.store import JobState
from torchfarm.wire import keys, routing

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def test_memory_stores_are_apart_and_tenant_views_share_one():
    a, b = memory_store(), memory_store()
    a.put_blob("sha256:x", b"abc")
    assert a.get_blob("sha256:x") == b"abc" and b.get_blob("sha256:x") is None
    alice = a.tenant("alice")
    alice.create_job("k", "cpu.avx512", "", 60)
    assert a.r.exists("tf:job:alice:k") and a.get_job("k") is None
    assert a.cache_bytes() == 3


def test_every_task_name_has_a_job_function_that_takes_key_and_context():
    sent = {routing.COMPILE_TASK, routing.EXPORT_TASK, routing.KERNEL_TASK,
            routing.LOWER_TASK, routing.BUILD_KERNELS_TASK, routing.ASSEMBLE_TASK}
    assert set(JOBS) == sent
    for task in sent:
        params = list(inspect.signature(job_function(task)).parameters)
        assert params[:2] == ["key", "ctx"], task


def test_an_unknown_task_is_refused_when_sent():
    with pytest.raises(UnknownTask, match="torchfarm.nope"):
        InlineDispatcher().send_stage("torchfarm.nope", ["k"], "q")


def test_the_dispatcher_runs_jobs_in_order_with_the_jobs_they_send(monkeypatch):
    dispatcher = InlineDispatcher()
    calls = []

    def run_job(key, ctx, namespace=""):
        calls.append(("compile", key, namespace))
        dispatcher.send_stage(routing.ASSEMBLE_TASK, [key, namespace], "stages.cpu.avx512")

    def run_assembly(key, ctx, namespace):
        calls.append(("assemble", key, namespace))

    fns = {routing.COMPILE_TASK: run_job, routing.ASSEMBLE_TASK: run_assembly}
    monkeypatch.setattr("localfarm.inline.job_function", fns.__getitem__)
    dispatcher.send("k1", "cpu.avx512", "alice")
    dispatcher.send("k2", "cpu.avx512")
    assert dispatcher.depth("cpu.avx512") == 2
    assert dispatcher.run(context=object()) == 4
    assert calls == [
        ("compile", "k1", "alice"), ("compile", "k2", ""),
        ("assemble", "k1", "alice"), ("assemble", "k2", ""),
    ]
    assert dispatcher.depth("cpu.avx512") == 0
    assert {t.queue for t in dispatcher.sent} == {"cpu.avx512", "stages.cpu.avx512"}


def test_the_dispatcher_records_every_task_sent_run_or_not(monkeypatch):
    dispatcher = InlineDispatcher()
    monkeypatch.setattr("localfarm.inline.job_function", lambda task: lambda *a, **k: None)
    dispatcher.send("k1", "cpu.avx512", "alice")
    dispatcher.run(context=object())
    dispatcher.send_export("k2", "cpu.avx512")
    assert [(t.name, t.key, t.queue, t.namespace) for t in dispatcher.sent] == [
        (routing.COMPILE_TASK, "k1", "cpu.avx512", "alice"),
        (routing.EXPORT_TASK, "k2", "cpu.avx512", ""),
    ]
    assert [t.key for t in dispatcher.ran] == ["k1"] and [t.key for t in dispatcher.pending] == ["k2"]


def test_a_dispatcher_whose_broker_is_down_raises_and_queues_nothing():
    from kombu.exceptions import OperationalError

    dispatcher = InlineDispatcher(down=OperationalError("broker down"))
    for send in (dispatcher.send, dispatcher.send_kernel, dispatcher.send_export):
        with pytest.raises(OperationalError, match="broker down"):
            send("k", "cpu.avx512")
    assert dispatcher.sent == [] and not dispatcher.pending


def test_a_kernel_job_runs_as_it_is_sent_given_a_kernel_context(monkeypatch):
    import threading

    ran = threading.Event()
    seen = []

    def run_kernel_job(key, ctx, namespace=""):
        seen.append((key, ctx, namespace, threading.current_thread() is threading.main_thread()))
        ran.set()

    monkeypatch.setattr("localfarm.inline.job_function", {routing.KERNEL_TASK: run_kernel_job}.__getitem__)
    context = object()
    dispatcher = InlineDispatcher(kernel_context=context)
    dispatcher.send_kernel("k", "kernels.cuda.sm_90", "alice")
    assert ran.wait(10)
    assert seen == [("k", context, "alice", False)]
    assert not dispatcher.pending and [t.key for t in dispatcher.sent] == ["k"]


def test_a_job_without_its_context_stays_pending():
    dispatcher = InlineDispatcher()
    dispatcher.send_kernel("k", "kernels.cuda.sm_90")
    with pytest.raises(ValueError, match="kernel_context"):
        dispatcher.run(context=object())
    assert dispatcher.depth("kernels.cuda.sm_90") == 1


def test_the_in_process_client_maps_the_coordinators_errors_as_over_grpc():
    farm = InProcessFarm()
    client = farm.client(run_jobs=False)
    with pytest.raises(FarmUnavailable) as unserved:
        client.submit(relu_request())
    assert unserved.value.code == "NO_WORKER"
    with pytest.raises(GraphRejected) as bad:
        client.submit(relu_request(options={"no_such_option": "1"}))
    assert bad.value.code == "OPTION_NOT_ALLOWED"
    unknown_sdpa = relu_request()
    unknown_sdpa.options.sdpa_backends.append("FAST")
    with pytest.raises(GraphRejected, match="'FAST'") as sdpa:
        client.submit(unknown_sdpa)
    assert sdpa.value.code == "OPTION_NOT_ALLOWED"
    with pytest.raises(RemoteCompileError) as missing:
        client.fetch("0" * 64)
    assert missing.value.code == "NOT_FOUND"


def test_the_in_process_client_queues_and_watches_a_job():
    farm = InProcessFarm()
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    client = farm.client(run_jobs=False)
    request = relu_request()
    reply = client.submit(request)
    assert reply.key == keys.compute_key(request) and not reply.cache_hit
    assert [t.name for t in farm.dispatcher.pending] == [routing.COMPILE_TASK]
    assert client.status().queues[0].queued == 1
    farm.store.update_job(reply.key, state=JobState.FAILED, error_code="X", message="no")
    with pytest.raises(RemoteCompileError, match="no") as failed:
        client.wait(reply.key)
    assert failed.value.code == "X"


def test_a_job_whose_record_expired_in_the_queue_is_dropped_unrun(caplog):
    farm = InProcessFarm()
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    key = farm.client(run_jobs=False).submit(relu_request()).key
    farm.store.r.delete(f"tf:job:{key}")  # what its expiry does
    assert farm.run_jobs() == 1
    assert farm.store.get_job(key) is None and not farm.store.r.exists(f"tf:job:{key}")
    assert "its record expired before this delivery" in caplog.text


def test_a_watch_of_a_job_nobody_runs_ends_at_its_deadline():
    farm = InProcessFarm()
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    client = farm.client(farm.sdk_settings(compile_timeout_s=0.2), run_jobs=False)
    key = client.submit(relu_request()).key
    with pytest.raises(FarmUnavailable, match=r"within 0.2s \(TORCHFARM_COMPILE_TIMEOUT_S\); the farm goes on") as late:
        client.wait(key)
    assert late.value.code == "DEADLINE_EXCEEDED"


def test_a_job_no_live_worker_serves_ends_its_wait_at_the_wake_timeout():
    """The farm's only worker is gone (crashed, hung, its pool scaled to zero): the job
    waits queued. Before, the client waited silently for the whole compile timeout
    (900 s); now for TORCHFARM_WAKE_TIMEOUT_S, as for a target no worker serves, and
    then falls back. The job stays queued, for a worker that comes later."""
    farm = InProcessFarm()
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    client = farm.client(farm.sdk_settings(compile_timeout_s=60, wake_timeout_s=0.3), run_jobs=False)
    key = client.submit(relu_request()).key
    farm.store.r.delete("tf:worker:w1")  # its heartbeat expired
    seen = []
    t0 = time.monotonic()
    with pytest.raises(NoWorker, match=r"no live worker took the job \w+ within 0.3s \(TORCHFARM_WAKE_TIMEOUT_S\)"):
        client.wait(key, seen.append)
    assert time.monotonic() - t0 < 30
    assert seen and all(s.unserved for s in seen)
    assert farm.store.get_job(key).state == "QUEUED"


def test_a_job_waits_on_while_a_worker_serves_its_queue():
    farm = InProcessFarm()
    farm.store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    client = farm.client(farm.sdk_settings(compile_timeout_s=0.5, wake_timeout_s=0.1), run_jobs=False)
    key = client.submit(relu_request()).key
    seen = []
    with pytest.raises(FarmUnavailable, match="did not finish within 0.5s") as late:
        client.wait(key, seen.append)
    assert not isinstance(late.value, NoWorker) and seen and not any(s.unserved for s in seen)


def test_the_fakes_load_without_torch():
    code = "import sys, localfarm.fakes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_a_graph_compiles_in_process_through_the_sdk_backend(tmp_path, monkeypatch):
    """The whole staged compile, inline: decompose, lower, kernel builds, assembly; the
    SDK verifies the inline worker's signature and loads the artifact."""
    import torch

    from sdk.backend import FarmBackend

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    farm = InProcessFarm()
    farm.register_worker()
    backend = FarmBackend(farm.sdk_settings(fallback="error"), client=farm.client())
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    try:
        out = torch.compile(model, backend=backend)(x)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, model(x))
    assert [t.name for t in farm.dispatcher.ran][0] == routing.COMPILE_TASK
    assert farm.dispatcher.ran[-1].name == routing.ASSEMBLE_TASK
    (job,) = farm.store.recent_jobs()
    assert job.state == JobState.SUCCEEDED and job.worker == "inline"
