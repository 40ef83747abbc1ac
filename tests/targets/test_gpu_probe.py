"""workers/gpu_probe.py: a worker learns its GPU from a spawned child, never by starting
CUDA in the process that forks its pool; and the torch.cuda behaviour that relies on."""

from __future__ import annotations

import sys

import pytest
import torch

from torchfarm.wire import targets
from workers import gpu_probe, serving
from workers.settings import WorkerSettings


def _cuda_must_not_start(monkeypatch):
    """Every torch.cuda call that would start CUDA in this process fails the test."""
    def started(*_a, **_k):
        raise AssertionError("this process started CUDA")

    for name in ("is_available", "device_count", "_lazy_init", "init", "current_device",
                 "get_device_properties", "get_device_capability", "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, started)


def test_the_serving_plan_asks_the_probe_not_torch_cuda(monkeypatch):
    _cuda_must_not_start(monkeypatch)
    monkeypatch.setattr(gpu_probe, "accelerator", lambda: targets.parse("cuda:sm_90"))
    plan = serving.plan_for(WorkerSettings(targets=("local",)))
    assert [str(t) for t in plan.graph] == ["cuda:sm_90"]
    assert str(plan.own_gpu) == "cuda:sm_90"
    assert "kernels.cuda.sm_90" in plan.queues


def test_a_cpu_plan_has_no_own_gpu(monkeypatch):
    _cuda_must_not_start(monkeypatch)
    monkeypatch.setattr(gpu_probe, "accelerator", lambda: None)
    plan = serving.plan_for(WorkerSettings(targets=("local", "cuda:sm_90")))
    assert plan.own_gpu is None and [t.device for t in plan.graph] == ["cpu"]
    assert [str(t) for t in plan.kernel] == ["cuda:sm_90"]  # built without a GPU


def test_the_probe_runs_in_a_new_interpreter_and_answers():
    found = gpu_probe.run_probe()
    assert found.error == ""
    expected = torch.cuda.is_available()  # this test process may start CUDA: it forks no worker
    assert bool(found.accelerator) == expected


def test_a_probe_that_dies_says_why():
    found = gpu_probe.run_probe([sys.executable, "-c", "import sys; sys.exit('no driver here')"])
    assert not found.ready and "no driver here" in found.error


def test_the_check_fails_where_no_gpu_runs():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/targets/test_gpu.py checks the ready path")
    found = gpu_probe.run_probe(gpu_probe.probe_argv(check=True))
    assert not found.ready and found.error


# What workers/gpu_probe.py and workers/app.py rely on in torch/cuda/__init__.py. The
# CPU build has no CUDA, so its compiled-in check is replaced to reach the same code.

def test_is_available_starts_the_driver_unless_the_nvml_check_is_asked(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: calls.append("cudaGetDeviceCount") or 1,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: calls.append("nvml") or 1)
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert torch.cuda.is_available() and calls == ["cudaGetDeviceCount"]
    calls.clear()
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    assert torch.cuda.is_available() and calls == ["nvml"]


def test_device_properties_start_cuda(monkeypatch):
    started: list[bool] = []

    def lazy_init():
        started.append(True)
        raise RuntimeError("stop here")

    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    for ask in (torch.cuda.get_device_properties, torch.cuda.get_device_capability,
                torch.cuda.get_device_name):
        with pytest.raises(RuntimeError, match="stop here"):
            ask(0)
    assert len(started) == 3
