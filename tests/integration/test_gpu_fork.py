"""A GPU worker, started as the shipped one starts (Celery's prefork pool, the default
sandbox, warm-up on), on a machine without a GPU: a stand-in for torch.cuda
(tests/shims/fake_cuda) reports one sm_90 device and records which processes start
CUDA. On a real GPU, CUDA started in a process that then forks makes every job in the
forked pool fail "Cannot re-initialize CUDA in forked subprocess"; here that shows as a
`fork-after-init` line in the stand-in's log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localfarm.stack import LocalStack
from sdk.client import FarmClient
from sdk.settings import SDKSettings
from workers import sandbox

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

SHIM = Path(__file__).resolve().parents[1] / "shims" / "fake_cuda"


def fake_gpu_env(log: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
    # The shipped default sandbox, not the suite's "off" (tests/conftest.py).
    return {"PYTHONPATH": path, "TORCHFARM_TEST_FAKE_CUDA": str(log),
            "TORCHFARM_TARGETS": "local", "TORCHFARM_SANDBOX": "auto", **extra}


def test_a_gpu_worker_starts_no_cuda_in_a_process_that_forks(tmp_path):
    log = tmp_path / "cuda.log"
    # No GPU check: the stand-in cannot run a Triton kernel (see the test below).
    env = fake_gpu_env(log, TORCHFARM_GPU_CHECK="0")
    with LocalStack(workers=1, workdir=tmp_path / "stack", extra_env=env) as stack:
        workers = stack.store().live_workers()
        (record,) = workers.values()
        assert record["targets"] == {"cuda:sm_90": ["graph", "kernel"]}
        worker_log = (stack.root / "worker0.log").read_text(errors="replace")
        client = FarmClient(stack.address, SDKSettings(connect_timeout_s=10))
        try:
            (shown,) = client.status().workers
        finally:
            client.close()
        assert shown.sandbox == ("bwrap" if sandbox.bwrap_works()[0] else "process")  # torchfarm status
    lines = log.read_text().splitlines() if log.exists() else []
    assert lines, "the stand-in saw no process ask for the device: is it on PYTHONPATH?"
    assert not [line for line in lines if line.startswith("fork-after-init")], (lines, worker_log[-3000:])
    assert "vector ISA" not in worker_log or "not probed" in worker_log  # the GPU worker's warm-up


def test_a_gpu_worker_whose_gpu_path_fails_does_not_register(tmp_path):
    # The stand-in reports a device, but nothing runs on it: the check's Triton kernel fails.
    env = fake_gpu_env(tmp_path / "cuda.log")
    with LocalStack(workers=0, workdir=tmp_path / "stack", extra_env=env) as stack:
        stack.start_worker(0)
        worker_log = stack.root / "worker0.log"
        deadline = time.monotonic() + 180
        while "does not register" not in worker_log.read_text(errors="replace"):
            assert time.monotonic() < deadline, worker_log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        time.sleep(1.0)
        assert stack.store().live_workers() == {}
