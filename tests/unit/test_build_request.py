"""sdk/backend.py's `build_request`: what a CPU request adds of the caller's own state."""

from __future__ import annotations

import dataclasses

import torch

from sdk.backend import build_request
from tests.requests import relu_request
from torchfarm.fx.fingerprint import local_fingerprint


def _inductor(request) -> dict[str, str]:
    return {o.name: o.json_value for o in request.options.inductor}


def test_a_cpu_request_carries_this_processs_thread_count(monkeypatch):
    graph, fp = relu_request().graph, local_fingerprint()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 12)
    assert _inductor(build_request(graph, fp, "", {}, "t"))["cpp.threads"] == "12"
    assert _inductor(build_request(graph, fp, "", {"cpp.threads": 3}, "t"))["cpp.threads"] == "3"
    assert "cpp.threads" not in _inductor(build_request(graph, fp, "", {"cpp.dynamic_threads": True}, "t"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4096)
    assert _inductor(build_request(graph, fp, "", {}, "t"))["cpp.threads"] == "1024"  # the farm's bound


def test_a_gpu_requests_cpu_kernels_size_their_buffers_at_run_time():
    fp = dataclasses.replace(local_fingerprint(), device="cuda", arch="sm_90")
    options = _inductor(build_request(relu_request().graph, fp, "", {}, "t"))
    assert options["cpp.dynamic_threads"] == "true" and "cpp.threads" not in options
