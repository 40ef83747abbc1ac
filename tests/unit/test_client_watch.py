"""The SDK's wait on a farm that caps a tenant's Watch streams: a refusal for the cap
(WATCH_LIMIT) is waited out, since the job goes on; any other RESOURCE_EXHAUSTED is not."""

from __future__ import annotations

import grpc
import pytest

from sdk import client as client_mod
from sdk.client import StubClient
from sdk.errors import FarmUnavailable, QuotaExceeded
from sdk.settings import SDKSettings
from tests.rpc_errors import Exhausted
from torchfarm.v1 import farm_pb2


class _Stub:
    def __init__(self, refusals: list[str]):
        self.refusals = refusals
        self.calls = 0

    def Watch(self, ref, timeout, metadata):
        self.calls += 1
        if self.refusals:
            raise Exhausted(self.refusals.pop(0))
        return iter([farm_pb2.JobStatus(key=ref.key, state=farm_pb2.SUCCEEDED)])


def _client(stub) -> StubClient:
    return StubClient("127.0.0.1:1", SDKSettings(compile_timeout_s=60), stub)


def test_a_watch_refused_for_the_cap_is_retried(monkeypatch):
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    stub = _Stub(["WATCH_LIMIT", "WATCH_LIMIT"])
    assert _client(stub).wait("k" * 64).state == farm_pb2.SUCCEEDED
    assert stub.calls == 3


def test_other_resource_exhaustion_is_raised(monkeypatch):
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    with pytest.raises(QuotaExceeded):
        _client(_Stub(["TENANT_QUEUE_FULL"])).wait("k" * 64)


class _Gone(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "failed to connect to all addresses; Connection refused"


class _DyingStub:
    """The farm answers one status, then stops answering (`gone_for` watches, or for good)."""

    def __init__(self, gone_for: int | None = None):
        self.gone_for = gone_for
        self.calls = 0

    def Watch(self, ref, timeout, metadata):
        self.calls += 1
        if self.calls == 1:
            return self._then_gone(ref)
        if self.gone_for is None or self.calls <= 1 + self.gone_for:
            raise _Gone()
        return iter([farm_pb2.JobStatus(key=ref.key, state=farm_pb2.SUCCEEDED)])

    def _then_gone(self, ref):
        yield farm_pb2.JobStatus(key=ref.key, state=farm_pb2.RUNNING)
        raise _Gone()


def test_a_farm_that_stops_answering_mid_compile_is_given_up_on_after_the_reconnect_wait(monkeypatch, caplog):
    # It was watched until the compile's own deadline (15 min), at INFO, and the error
    # then said the farm went on with the compile.
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    settings = SDKSettings(compile_timeout_s=600, reconnect_timeout_s=0.2)
    with pytest.raises(FarmUnavailable, match=r"stopped answering .* for 0.2s \(TORCHFARM_RECONNECT_TIMEOUT_S\)"):
        StubClient("127.0.0.1:1", settings, _DyingStub()).wait("k" * 64)
    assert "stopped answering" in caplog.text and "WARNING" in caplog.text


def test_a_farm_back_within_the_reconnect_wait_finishes_the_compile(monkeypatch):
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    stub = _DyingStub(gone_for=3)
    settings = SDKSettings(compile_timeout_s=600, reconnect_timeout_s=60)
    assert StubClient("127.0.0.1:1", settings, stub).wait("k" * 64).state == farm_pb2.SUCCEEDED
    assert stub.calls == 5
