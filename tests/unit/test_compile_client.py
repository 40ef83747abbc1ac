"""The SDK's one seam to a farm (sdk/client.py's `CompileClient`): the gRPC client and the
in-process one implement it alike, and `FarmBackend` takes whichever it is given."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from localfarm.fakes import InProcessClient, InProcessFarm
from sdk import client as client_mod
from sdk.client import CompileClient, FarmClient, StubClient
from sdk.settings import SDKSettings

_CALLS = [
    name for name, member in inspect.getmembers(CompileClient)
    if inspect.isfunction(member) and not name.startswith("_")
]


def test_the_protocol_names_every_call_the_sdk_makes():
    assert set(_CALLS) == {
        "connect", "close", "submit", "wait", "submit_and_wait", "fetch",
        "put_precompiled", "explain_precompiled", "compile_kernel", "status",
    }


@pytest.mark.parametrize("implementation", [FarmClient, InProcessClient])
def test_each_client_implements_every_call_with_its_signature(implementation):
    for name in _CALLS:
        wanted = inspect.signature(getattr(CompileClient, name))
        assert inspect.signature(getattr(implementation, name)) == wanted, name


def test_the_in_process_client_runs_its_constructor_and_opens_no_channel(monkeypatch):
    def no_channel(*args, **kwargs):
        raise AssertionError("a channel was opened")

    monkeypatch.setattr(client_mod, "make_channel", no_channel)
    farm = InProcessFarm()
    client = farm.client()
    assert isinstance(client, StubClient)
    assert client.address == InProcessClient.ADDRESS
    assert client.settings.remote == farm.REMOTE
    client.connect()  # nothing to wait for
    assert client.status().workers == []


def test_a_stub_client_carries_the_metadata_it_is_given():
    seen = []

    class Stub:
        def GetFarmStatus(self, request, timeout, metadata):
            seen.append(metadata)
            from torchfarm.v1 import farm_pb2

            return farm_pb2.FarmStatus()

    StubClient("h:1", SDKSettings(), Stub(), (("authorization", "Bearer t"),)).status()
    assert seen == [(("authorization", "Bearer t"),)]


def test_the_backend_uses_the_client_it_is_given(monkeypatch):
    from sdk.backend import FarmBackend

    def no_channel(*args, **kwargs):
        raise AssertionError("a channel was opened")

    monkeypatch.setattr(client_mod, "make_channel", no_channel)
    farm = InProcessFarm()
    client = farm.client()
    backend = FarmBackend(farm.sdk_settings(), client=client)
    assert backend.client is client
    assert backend.trust is not None and backend.trust.loads_anything  # the worker's key, pinned


def test_the_backend_builds_a_grpc_client_for_a_remote_and_none_without():
    from sdk.backend import FarmBackend

    remote = FarmBackend(SDKSettings(remote="grpc://127.0.0.1:1", trust_unsigned="127.0.0.1:1"))
    try:
        assert isinstance(remote.client, FarmClient) and remote.client.address == "127.0.0.1:1"
    finally:
        remote.client.close()
    assert FarmBackend(SDKSettings(remote="")).client is None


def test_backends_of_one_farm_share_one_channel_in_a_process(monkeypatch):
    # Each sdk.compile opened its own channel: a model compiled block by block held one
    # connection, and waited for one to come up, per block.
    from sdk.backend import FarmBackend

    opened = []
    real = client_mod.make_channel
    monkeypatch.setattr(client_mod, "make_channel", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    settings = SDKSettings(remote="grpc://127.0.0.1:1", trust_unsigned="127.0.0.1:1")
    first, second = FarmBackend(settings, name="a"), FarmBackend(settings, name="b")
    assert first.client is second.client and opened == ["grpc://127.0.0.1:1"]
    other = FarmBackend(dataclasses.replace(settings, connect_timeout_s=settings.connect_timeout_s + 1))
    assert other.client is not first.client  # other settings get a channel of their own
    first.client.close()
    assert FarmBackend(settings).client is not first.client  # a closed one is not handed out
    assert len(opened) == 3
