"""The SDK's wait on a farm that caps a tenant's Watch streams: a refusal for the cap
(WATCH_LIMIT) is waited out, since the job goes on; any other RESOURCE_EXHAUSTED is not."""

from __future__ import annotations

import grpc
import pytest

from sdk import client as client_mod
from sdk.client import StubClient
from sdk.errors import QuotaExceeded
from sdk.settings import SDKSettings
from torchfarm.v1 import farm_pb2


class _Refused(grpc.RpcError):
    def __init__(self, reason: str):
        self.reason = reason

    def code(self):
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self):
        return "too many"

    def trailing_metadata(self):
        return (("torchfarm-reason", self.reason),)


class _Stub:
    def __init__(self, refusals: list[str]):
        self.refusals = refusals
        self.calls = 0

    def Watch(self, ref, timeout, metadata):
        self.calls += 1
        if self.refusals:
            raise _Refused(self.refusals.pop(0))
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
