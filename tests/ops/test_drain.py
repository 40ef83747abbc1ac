"""Safe worker drain, with real processes: SIGTERM to a Celery worker's main process in
the middle of a compile.

Celery's warm shutdown must let the running compile finish (the client gets a correct
artifact, from the first delivery), take no new job (one submitted during the drain
stays in the broker), and the job left behind must not be lost: the next worker runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from localfarm.stack import LocalStack
from tests.conftest import ROOT
from tests.ops.farm import MLP_COMPILE_SCRIPT, queue_foreign_build_job, wait_for
from torchfarm.storage.store import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]



def test_sigterm_mid_compile_drains_the_worker(tmp_path):
    # The whole-graph path: a staged compile's drained worker would finish its lowering
    # and leave the kernel builds to the next worker (tests/integration/test_pipeline.py).
    env = {"TORCHFARM_PIPELINE": "whole"}
    with LocalStack(warmup=False, workers=1, workdir=tmp_path / "stack", extra_env=env) as stack:
        store = stack.store()
        client = subprocess.Popen(
            [sys.executable, "-c", MLP_COMPILE_SCRIPT.format(address=stack.address)],
            env={**os.environ, **stack.client_env(), "PYTHONPATH": str(ROOT),
                 "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "client-inductor")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            job = wait_for(
                "the compile to start",
                lambda: next((j for j in store.recent_jobs()
                              if j.state == JobState.RUNNING and j.stage == "compile"), None),
                timeout_s=300,
            )
            worker = stack.procs["worker0"]
            os.kill(worker.pid, signal.SIGTERM)  # the main process only, as Kubernetes does

            # A job queued during the drain: the draining worker must leave it queued.
            late = queue_foreign_build_job(store, stack.broker_url, "late", job.queue)

            out, err = client.communicate(timeout=600)
        finally:
            if client.poll() is None:
                client.kill()
                client.communicate()
        assert client.returncode == 0 and "COMPILED-OK" in out, err[-4000:]

        assert worker.wait(timeout=120) == 0, "the worker did not stop by itself after its job"
        log = (stack.workdir / "worker0.log").read_text(errors="replace")
        assert "Warm shutdown" in log
        done = store.get_job(job.key)
        assert done.state == JobState.SUCCEEDED
        assert done.attempts == 1, "the compile was redelivered instead of finished by the drain"
        assert done.worker == "cpu0"

        # The late job was never taken, and is still in the broker for the next worker.
        assert store.get_job(late).state == JobState.QUEUED
        assert store.get_job(late).attempts == 0
        queue = store.get_job(late).queue
        assert redis.Redis.from_url(stack.broker_url).llen(queue) == 1

        stack.start_worker(1)
        finished = wait_for(
            "the next worker to run the late job",
            lambda: (j := store.get_job(late)) and j.state in JobState.TERMINAL and j,
            timeout_s=120,
        )
        assert finished.worker == "cpu1" and finished.attempts == 1
        # The late request asks for another torch build, which the worker refuses at once.
        assert finished.error_code == "BUILD_MISMATCH"
