"""A tenant's FetchArtifact streams open at once on one coordinator are capped, as its Watch
streams are: a tenant that opened a couple of hundred fetches of its own 8 MiB package and
read only the first message of each pinned about 5 MiB of the coordinator's memory per
stream, and got it killed at its memory limit. The SDK waits out the refusal and fetches
again, as it does for Watch. And the server's receive limit follows the largest request the
farm accepts, so grpc refuses an oversized message while reading it, not after parsing it."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InlineDispatcher, memory_store
from sdk import client as client_mod
from sdk.client import StubClient
from sdk.errors import QuotaExceeded
from sdk.settings import SDKSettings
from services.coordinator.errors import TenantQueueFull
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.rpc_errors import Exhausted
from torchfarm.trust.tokens import Tenant
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import REASONS, Reason
from torchfarm.wire.manifest import PRECOMPILED, BlobRef, Manifest, blob_digest

ALICE, BOB = Tenant("alice", "alice"), Tenant("bob", "bob")
KEY = "pc1-" + "a" * 64
PAYLOAD = b"x" * 4096


def _farm(**over) -> Farm:
    store = memory_store()
    for tenant in (ALICE, BOB):
        view = store.tenant(tenant.namespace)
        view.put_blob(blob_digest(PAYLOAD), PAYLOAD)
        view.put_manifest(Manifest(
            key=KEY, fingerprint={"torch": "x"}, payload=BlobRef(blob_digest(PAYLOAD), len(PAYLOAD)),
            tenant=tenant.namespace, kind=PRECOMPILED, graphs={},
        ))
    return Farm(CoordinatorSettings(chunk_bytes=1024, **over), store, InlineDispatcher())


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_concurrent_fetches_are_capped_per_tenant():
    farm = _farm(max_fetches_per_tenant=2)

    async def scenario() -> None:
        first, second = farm.fetch(KEY, ALICE), farm.fetch(KEY, ALICE)
        await first.__anext__()  # each stalled after its manifest, as a client that reads no more
        await second.__anext__()
        with pytest.raises(TenantQueueFull) as refused:
            await farm.fetch(KEY, ALICE).__anext__()
        assert refused.value.reason == Reason.FETCH_LIMIT
        assert "FetchArtifact" in str(refused.value) and "(2)" in str(refused.value)
        bob = farm.fetch(KEY, BOB)  # another tenant has its own cap
        await bob.__anext__()
        await first.aclose()  # a stream that ends gives its place back
        third = farm.fetch(KEY, ALICE)
        await third.__anext__()
        for stream in (second, third, bob):
            await stream.aclose()

    _run(scenario())


def test_a_finished_or_failed_fetch_gives_its_place_back():
    farm = _farm(max_fetches_per_tenant=1)

    async def scenario() -> None:
        for _ in range(3):
            assert [p async for p in farm.fetch(KEY, ALICE)]  # read to its end
        with pytest.raises(Exception, match="no artifact"):
            async for _ in farm.fetch("b" * 64, ALICE):
                pass
        await farm.fetch(KEY, ALICE).__anext__()

    _run(scenario())


def test_zero_turns_the_fetch_cap_off():
    farm = _farm(max_fetches_per_tenant=0)

    async def scenario() -> None:
        streams = [farm.fetch(KEY, ALICE) for _ in range(50)]
        for stream in streams:
            await stream.__anext__()
        for stream in streams:
            await stream.aclose()

    _run(scenario())


def test_the_fetch_limit_is_a_retryable_quota_for_the_client():
    info = REASONS[Reason.FETCH_LIMIT]
    assert info.status == "RESOURCE_EXHAUSTED" and info.fallback


class _FetchStub:
    def __init__(self, refusals: list[Exhausted]):
        self.refusals = refusals
        self.calls = 0
        self.timeouts: list[float] = []

    def FetchArtifact(self, ref, timeout, metadata):
        self.calls += 1
        self.timeouts.append(timeout)
        if self.refusals:
            raise self.refusals.pop(0)
        return iter([farm_pb2.ArtifactChunk(manifest=b"{}"),
                     farm_pb2.ArtifactChunk(blob=farm_pb2.BlobChunk(digest="sha256:d", offset=0, data=b"ab"))])


def test_a_fetch_refused_for_the_cap_is_fetched_again(monkeypatch):
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)
    stub = _FetchStub([Exhausted("FETCH_LIMIT"), Exhausted("FETCH_LIMIT")])
    client = StubClient("127.0.0.1:1", SDKSettings(direct_downloads=False), stub)
    assert client.fetch("k" * 64) == (b"{}", {"sha256:d": b"ab"})
    assert stub.calls == 3


def test_a_fetch_refused_for_the_cap_past_the_fetch_deadline_is_a_quota(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: clock[0])
    stub = _FetchStub([Exhausted("FETCH_LIMIT") for _ in range(100)])
    client = StubClient("127.0.0.1:1", SDKSettings(direct_downloads=False, fetch_timeout_s=5), stub)
    with pytest.raises(QuotaExceeded) as raised:
        client.fetch("k" * 64)
    assert raised.value.code == Reason.FETCH_LIMIT and raised.value.fallback
    assert 2 <= stub.calls <= 7


def test_a_fetch_fetched_again_keeps_to_the_first_ones_deadline(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: clock[0])
    stub = _FetchStub([Exhausted("FETCH_LIMIT"), Exhausted("FETCH_LIMIT")])
    client = StubClient("127.0.0.1:1", SDKSettings(direct_downloads=False, fetch_timeout_s=10), stub)
    client.fetch("k" * 64)
    # Each wait counts against the one deadline: the last stream gets what is left.
    assert stub.timeouts[0] == 10 and stub.timeouts[-1] == pytest.approx(10 - clock[0])
    assert clock[0] > 0
