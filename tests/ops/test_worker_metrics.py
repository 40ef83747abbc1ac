"""A worker's metrics in prometheus-client's multiprocess mode, with real forked processes.

Multiprocess mode is fixed when prometheus_client is first imported, and this pytest
process has imported it already, so each test runs in a fresh interpreter.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_python

_FORKED_JOBS = textwrap.dedent(
    """
    import os, sys, time, urllib.request
    from workers import metrics as wm
    QUEUES = ("cpu.avx512.b3f9c21", "stages.cpu.avx512.b3f9c21", "kernels.cuda.sm_90")
    wm.install(port={port}, queues=QUEUES)  # sets the multiprocess dir first
    wm.reset_dir()
    from torchfarm.storage.store import JobRecord

    def job(i, **kw):
        base = dict(key=str(i), state="SUCCEEDED", queue="cpu.avx512.b3f9c21", attempts=1, created=100.0,
                    started=200.0, timings={{"decode": 0.02, "compile": 3.0, "total": 3.5}})
        return JobRecord(**{{**base, **kw}})

    pids = []
    for i in range(2):  # two forked "pool processes", as Celery's prefork pool
        pid = os.fork()
        if pid == 0:
            wm.observe_job(job(i), began=150.0)
            wm.observe_job(job(i, state="FAILED", error_code="BUILD_MISMATCH", timings={{}}), 150.0)
            wm.observe_job(job(i, attempts=2, started=100.0), began=150.0)  # finished earlier
            wm.record_retry("stages.cpu.avx512.b3f9c21")
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
        wm._on_process_shutdown(pid=pid)
    wm.serve({port}, queues=QUEUES, torch_version="test")
    print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    """
)


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in:\n{text}")


def test_pool_processes_are_merged_by_the_main_process(tmp_path):
    from localfarm.stack import free_port

    port = free_port()
    out = run_python(
        _FORKED_JOBS.format(port=port),
        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp")},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # Both children's samples, summed; the target labelled as the coordinator and the CLI
    # label it (torchfarm/metric_labels.py), not by the queue's name.
    assert _value(text, 'torchfarm_worker_jobs_total{code="",outcome="succeeded",target="cpu:avx512"}') == 2
    assert _value(text, 'torchfarm_worker_jobs_total{code="",outcome="cached",target="cpu:avx512"}') == 2
    assert _value(
        text, 'torchfarm_worker_jobs_total{code="BUILD_MISMATCH",outcome="failed",target="cpu:avx512"}'
    ) == 2
    assert _value(text, 'torchfarm_job_redeliveries_total{target="cpu:avx512"}') == 2
    assert _value(text, 'torchfarm_job_retries_total{target="cpu:avx512"}') == 2
    # Only the deliveries that ran the compile observe stage times.
    assert _value(text, 'torchfarm_compile_duration_seconds_count{stage="compile",target="cpu:avx512"}') == 2
    assert _value(text, 'torchfarm_compile_duration_seconds_sum{stage="total",target="cpu:avx512"}') == 7.0
    assert _value(
        text, 'torchfarm_compile_duration_seconds_bucket{le="5.0",stage="compile",target="cpu:avx512"}'
    ) == 2
    # Queue wait counts every delivery that started the job, failed ones too: 4 × 100 s.
    assert _value(text, 'torchfarm_job_queue_wait_seconds_count{target="cpu:avx512"}') == 4
    assert _value(text, 'torchfarm_job_queue_wait_seconds_sum{target="cpu:avx512"}') == 400.0
    # Queues the worker serves exist from the start, at zero.
    assert _value(text, 'torchfarm_job_redeliveries_total{target="cuda:sm_90"}') == 0
    assert 'target="cpu.avx512.b3f9c21"' not in text and 'target="stages.' not in text
    assert 'torchfarm_build_info{component="worker"' in text
    assert 'torch="test"' in text


def test_install_refuses_a_late_multiprocess_dir():
    """Setting the directory after prometheus_client loaded would lose the pool's samples."""
    out = run_python(
        "import os\n"
        "os.environ.pop('PROMETHEUS_MULTIPROC_DIR', None)\n"
        "import prometheus_client\n"
        "from workers import metrics as wm\n"
        "try:\n"
        "    wm.use_dir()\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n",
        {},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout


def test_reset_dir_removes_earlier_samples(tmp_path):
    d = tmp_path / "mp"
    d.mkdir()
    (d / "counter_123.db").write_bytes(b"stale")
    (d / "keep.txt").write_text("not a sample file")
    out = run_python(
        "from workers import metrics as wm\nwm.reset_dir()\n",
        {"PROMETHEUS_MULTIPROC_DIR": str(d)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in d.iterdir()) == ["keep.txt"]


_STAGED_END = textwrap.dedent(
    """
    import time, urllib.request
    from workers import metrics as wm
    wm.install(port={port}, queues=("cpu",))
    wm.reset_dir()
    from torchfarm.storage.store import JobState, Store
    from workers import tasks

    store = Store.from_url("{redis_url}", "tf-{port}")
    store.create_job("k1", "cpu", "", 60)
    store.update_job("k1", state=JobState.SUCCEEDED, stage="done", started=time.time())
    tasks.record(store, "k1", "", None)  # the assembly ends the staged job
    tasks.record(store, "k1", "", None)  # its lowering task returns after that
    wm.serve({port}, queues=("cpu",), torch_version="test")
    print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    """
)


@pytest.mark.integration  # a redis-server and a worker process
@pytest.mark.slow
def test_a_staged_job_ended_before_its_lowering_returns_counts_once(tmp_path, redis_url):
    from localfarm.stack import free_port

    port = free_port()
    out = run_python(
        _STAGED_END.format(port=port, redis_url=redis_url),
        {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp")},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert _value(out.stdout, 'torchfarm_worker_jobs_total{code="",outcome="succeeded",target="cpu"}') == 1
