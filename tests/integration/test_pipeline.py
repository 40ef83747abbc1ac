"""The staged compile (workers/jobs/lower.py, workers/jobs/) with real parts:
redis-server, the gRPC coordinator, and Celery workers that split each graph into
decomposition, lowering, kernel-build and assembly jobs.

- training through the staged path matches eager, and matches the whole-graph path
  (TORCHFARM_PIPELINE=whole), on the MLP, the CNN and the tiny GPT, each decomposed in
  a job of its own;
- a second model built from the same blocks reuses the first one's kernels from the
  kernel cache and builds fewer;
- two such models compiled at the same time build each kernel they share once;
- a farm of one worker completes a staged compile (nothing waits on anything);
- a worker killed (SIGKILL, whole process group) in the middle of a kernel-build job
  loses nothing: the job is redelivered and the compile completes correctly.

Tolerances against eager (and between the two paths) as tests/integration/
test_end_to_end.py: loss within 1e-5, gradients within 1e-4 (absolute or relative).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import grpc
import pytest

from examples.models import TINY_GPT, GPTConfig, make_cnn, make_gpt, make_mlp
from localfarm.stack import LocalStack
from tests.conftest import ROOT
from tests.faults.farmkit import kill_group, wait_for
from tests.integration.test_end_to_end import assert_matches_eager, train_step
from torchfarm.storage.store import JobState
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from workers.board import StageBoard

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

MODELS = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "gpt": lambda: make_gpt(TINY_GPT, batch=4),
}
STAGES = ["decompose", "lower", "kernels", "assemble"]
STAGED: dict[str, tuple] = {}
"""Each model's (loss, grads) through the staged path, for the whole-graph comparison."""


def _kbin_count(stack: LocalStack) -> int:
    return sum(1 for _ in stack.store().r.scan_iter(match="tf:kbin:*", count=1000))


def _latest_job(stack: LocalStack):
    jobs = stack.store().recent_jobs()
    assert jobs, "no job was recorded"
    return jobs[0]


def _job_status(stack: LocalStack, key: str) -> farm_pb2.JobStatus:
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        return farm_pb2_grpc.CompileFarmStub(channel).GetJob(farm_pb2.JobRef(key=key), timeout=10)


class TestTwoWorkers:
    @pytest.fixture(scope="class")
    def farm(self, tmp_path_factory):
        # Caches of their own: a graph another stack compiled would be an AOTAutograd
        # cache hit, and these tests check the decomposition that a cold compile runs.
        with LocalStack(workers=2, workdir=tmp_path_factory.mktemp("pipeline"), warmup=False) as s:
            yield s

    @pytest.fixture
    def client(self, farm, monkeypatch, tmp_path):
        monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(farm.trusted_keys_file))
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "client-inductor"))
        return farm

    @pytest.mark.parametrize("name", sorted(MODELS))
    def test_staged_training_matches_eager(self, name, client, caplog):
        caplog.set_level(logging.INFO, logger="sdk")
        model, inputs = MODELS[name]()
        got, ref = train_step(model, inputs, remote=client.address, fallback="error")
        assert_matches_eager(got, ref)
        STAGED[name] = got
        job = _latest_job(client)
        assert job.state == JobState.SUCCEEDED
        assert [s["stage"] for s in job.stages] == STAGES, job.stages
        kernels = job.stages[2]
        assert kernels["kernels"] == job.kernels_total > 0
        assert job.kernels_done == job.kernels_total
        manifest = client.store().get_manifest(job.key)
        assert [s["stage"] for s in manifest.stages] == STAGES
        assert len(manifest.kernels) == job.kernels_total
        lines = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
        assert any("kernels " in line and " hit" in line for line in lines), lines
        fields = StageBoard(client.store()).job_fields(job.key)
        assert fields.get("decomposed") == "separately", fields.get("decomposed")
        assert job.stages[1]["worker"] == fields["l_worker"]
        assert not list(client.store().r.scan_iter(match="tf:decomp:*")), "decomposition left behind"

    def test_a_second_model_from_the_same_blocks_reuses_kernels(self, client):
        cfg = GPTConfig(vocab=96, block=16, layers=1, heads=2, width=32)
        model, inputs = make_gpt(cfg, batch=2)
        assert_matches_eager(*train_step(model, inputs, remote=client.address, fallback="error"))
        first = _latest_job(client)
        assert first.kernels_hit == 0, "the first model's kernels were cached before it ran"
        before = _kbin_count(client)

        deeper = GPTConfig(vocab=96, block=16, layers=2, heads=2, width=32)
        model, inputs = make_gpt(deeper, batch=2)
        assert_matches_eager(*train_step(model, inputs, remote=client.address, fallback="error"))
        second = _latest_job(client)
        assert second.key != first.key
        built = _kbin_count(client) - before
        assert second.kernels_hit > 0, "no kernel of the second model came from the cache"
        assert built == second.kernels_total - second.kernels_hit < second.kernels_total
        status = _job_status(client, second.key)
        assert (status.kernels_total, status.kernels_hit) == (second.kernels_total, second.kernels_hit)
        stage = next(t for t in status.timings if t.stage == "kernels")
        assert stage.kernels == second.kernels_total and stage.kernels_hit == second.kernels_hit

    def test_models_compiled_at_once_build_each_kernel_once(self, client, tmp_path):
        """Two clients compile GPTs of the same blocks at the same time, one graph on
        each worker: a kernel both need is built by one job, and the other job counts
        it as a hit, whether it waited for that build or found it done."""
        before = _kbin_count(client)
        procs = [_train(client, tmp_path, f"gpt:{layers}") for layers in (1, 2)]
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0 and "TRAINED-OK" in out, err[-4000:]
        jobs = client.store().recent_jobs()[:2]
        assert all(j.state == JobState.SUCCEEDED for j in jobs)
        built = _kbin_count(client) - before
        assert sum(j.kernels_hit for j in jobs) > 0, "the two models shared no kernel"
        assert built == sum(j.kernels_total - j.kernels_hit for j in jobs), [
            (j.kernels_total, j.kernels_hit) for j in jobs
        ]

    def test_the_whole_graph_path_gives_the_same_training(self, client):
        assert set(STAGED) == set(MODELS), "the staged runs above did not all finish"
        for name in ("worker0", "worker1"):
            client.stop_process(name)
        client.extra_env["TORCHFARM_PIPELINE"] = "whole"
        for i in range(2):
            client.start_worker(i)
        store = client.store()
        wait_for(lambda: len(store.live_workers()) == 2, 120, "the restarted workers")
        for key in store.artifact_keys():
            store.delete_artifact(key)
        for name in sorted(MODELS):
            model, inputs = MODELS[name]()
            got, ref = train_step(model, inputs, remote=client.address, fallback="error")
            assert_matches_eager(got, ref)
            assert_matches_eager(got, STAGED[name])
            job = _latest_job(client)
            assert job.state == JobState.SUCCEEDED and job.stages == [] and "compile" in job.timings


TRAIN_SCRIPT = textwrap.dedent(
    """
    import sys
    from examples.models import GPTConfig, make_gpt, make_mlp
    from tests.integration.test_end_to_end import assert_matches_eager, train_step
    kind, size = sys.argv[2].split(":")
    if kind == "mlp":
        model, inputs = make_mlp(batch=int(size))
    else:
        cfg = GPTConfig(vocab=80, block=12, layers=int(size), heads=2, width=24)
        model, inputs = make_gpt(cfg, batch=2)
    assert_matches_eager(*train_step(model, inputs, remote=sys.argv[1], fallback="error"))
    print("TRAINED-OK")
    """
)
"""A client process: one training step through the farm, checked against eager, of the
MLP ("mlp:<batch>") or a small GPT ("gpt:<layers>", the same blocks at any depth)."""


def _train(stack: LocalStack, tmp_path, model: str) -> subprocess.Popen:
    env = {
        **os.environ, **stack.client_env(), "PYTHONPATH": str(ROOT),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"client-{model.replace(':', '-')}"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN_SCRIPT, stack.address, model],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_one_worker_farm_completes_a_staged_compile(tmp_path):
    with LocalStack(
        workers=1, workdir=tmp_path / "stack", warmup=False
    ) as stack:
        client = _train(stack, tmp_path, "mlp:3")
        out, err = client.communicate(timeout=900)
        assert client.returncode == 0 and "TRAINED-OK" in out, err[-4000:]
        job = _latest_job(stack)
        assert job.state == JobState.SUCCEEDED
        assert [s["stage"] for s in job.stages] == STAGES
        assert job.kernels_total > job.kernels_hit  # kernels were built, on the one worker
        assert {s["worker"] for s in job.stages} == {"cpu0"}


def test_a_worker_killed_mid_kernel_build_loses_nothing(tmp_path):
    env = {
        "TORCHFARM_KERNEL_JOB_DELAY_S": "5",  # test hook: each kernel job sleeps first
        "TORCHFARM_KERNEL_BATCH": "1",
        # The killed worker's job comes back after the visibility timeout, which this
        # test waits out: as short as the limits beneath it allow. The MLP's lowering,
        # the longest job here, took 12 s on the 2-core machine under the suite's load.
        "TORCHFARM_SOFT_TIME_LIMIT_S": "30",
        "TORCHFARM_HARD_TIME_LIMIT_S": "35",
        "TORCHFARM_VISIBILITY_TIMEOUT_S": "40",
    }
    with LocalStack(
        workers=2, workdir=tmp_path / "stack", extra_env=env, warmup=False
    ) as stack:
        store = stack.store()
        client = _train(stack, tmp_path, "mlp:5")
        try:
            def building():
                jobs = store.recent_jobs()
                if not jobs or jobs[0].stage != "kernels":
                    return None
                fields = {k.decode(): v for k, v in store.r.hgetall(f"tf:job:{jobs[0].key}").items()}
                names = [f.removeprefix("kworker:") for f in fields if f.startswith("kworker:")]
                return (jobs[0].key, names[0]) if names else None

            key, victim = wait_for(building, 600, "a kernel-build job", every_s=0.05)
            kill_group(stack, "worker" + victim.removeprefix("cpu"))  # inside its 5 s sleep
            out, err = client.communicate(timeout=900)
        finally:
            if client.poll() is None:
                client.kill()
                client.communicate()
        assert client.returncode == 0 and "TRAINED-OK" in out, err[-4000:]
        job = store.get_job(key)
        assert job.state == JobState.SUCCEEDED and job.kernels_done == job.kernels_total
        fields = {k.decode(): v.decode() for k, v in store.r.hgetall(f"tf:job:{key}").items()}
        redelivered = [f for f, v in fields.items() if f.startswith("kattempts:") and int(v) >= 2]
        assert redelivered, f"no kernel-build job was delivered twice: {fields}"
        assert len(store.get_manifest(key).kernels) == job.kernels_total
