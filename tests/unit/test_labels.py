"""A request's label is the client's free text: the coordinator logs it and keeps it
beside the job and the artifact. It is refused past MAX_LABEL_CHARS or with characters a
log line must not hold, and the SDK never sends such a label."""

from __future__ import annotations

import asyncio
import logging

import pytest

from localfarm.fakes import InlineDispatcher, memory_store
from services.coordinator.errors import InvalidRequest
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, labels
from torchfarm.wire.codes import Reason
from torchfarm.wire.labels import MAX_LABEL_CHARS, clip_label

FORGED = "x\n2026-01-01 00:00:00,000 WARNING services.coordinator.auth: tenant 'bob' token REVOKED"


def _farm():
    store = memory_store()
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    return store, Farm(CoordinatorSettings(poll_interval_s=0.01), store, InlineDispatcher())


@pytest.mark.parametrize("label", [FORGED, "a" * (MAX_LABEL_CHARS + 1), "A" * (8 << 20), "tab\there", "\x1b[2J"])
def test_a_label_a_log_line_cannot_hold_is_refused_and_stored_nowhere(label, caplog):
    store, farm = _farm()
    request = relu_request(label=label)
    with caplog.at_level(logging.INFO), pytest.raises(InvalidRequest, match="label") as refused:
        asyncio.run(farm.submit(request, request.ByteSize()))
    assert refused.value.reason == Reason.INVALID_REQUEST
    assert "REVOKED" not in caplog.text
    assert store.get_job(keys.compute_key(request)) is None
    assert farm.dispatcher.sent == []


def test_a_kernel_requests_label_is_refused_the_same_way():
    _, farm = _farm()
    service = KernelService(farm, farm.runner)
    request = farm_pb2.KernelRequest(label=FORGED)
    with pytest.raises(InvalidRequest, match="label") as refused:
        asyncio.run(service.compile(request, request.ByteSize()))
    assert refused.value.reason == Reason.INVALID_REQUEST


def test_a_plain_label_of_the_longest_length_is_accepted():
    _, farm = _farm()
    request = relu_request(label="résumé-model graph 3 from host-1 " + "x" * (MAX_LABEL_CHARS - 33))
    assert len(request.label) == MAX_LABEL_CHARS
    asyncio.run(farm.submit(request, request.ByteSize()))
    assert len(farm.dispatcher.sent) == 1


def test_the_sdk_clips_what_it_sends():
    clipped = clip_label("My\nModel " + "y" * 1000)
    assert len(clipped) == MAX_LABEL_CHARS and clipped.startswith("My Model y")
    assert clip_label("plain") == "plain"


def test_the_request_builders_clip_the_label():
    from sdk.backend import build_request
    from torchfarm.fx.fingerprint import local_fingerprint
    from torchfarm.kernels import triton_request

    request = build_request(relu_request().graph, local_fingerprint(), "default", {}, "Model\n" * 100)
    labels.check_label(request.label)
    kernel = triton_request.build_kernel_request(
        "import triton\n@triton.jit\ndef k(x):\n    pass\n", "k", target="cuda:sm_90", signature="*fp32",
        label="Model\n" * 100,
    )
    labels.check_label(kernel.label)
