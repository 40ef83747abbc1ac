"""The coordinator's limits on what one call, and many at once, may hold, on the wire: a real
gRPC coordinator over a real redis-server, Celery replaced by a recorder.

- grpc refuses a message over the farm's request limit while reading it: the receive
  limit was 64 MiB for every method, so a 60 MiB Submit was read and parsed whole before
  the farm compared its size with its 16 MiB limit, and eight at once added ~880 MiB.
- A tenant's FetchArtifact streams open at once are capped (FETCH_LIMIT): stalled ones
  pinned ~5 MiB each, with no cap, until the coordinator was killed at its memory limit.
- The server caps its concurrent calls (`maximum_concurrent_rpcs`)."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from sdk.client import FarmClient
from sdk.errors import FarmUnavailable, RequestTooLarge
from sdk.settings import SDKSettings
from tests.coordinator_server import token_farms
from tests.requests import relu_request
from torchfarm.trust import tokens
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire.manifest import PRECOMPILED, BlobRef, Manifest, blob_digest

pytestmark = pytest.mark.integration

MIB = 1 << 20
KEY = "pc1-" + "c" * 64


@pytest.fixture
def start(store, tmp_path, redis_url):
    """Starts a coordinator for alice with the settings given; yields (address, alice's token)."""
    alice = tokens.new_token("alice")
    with token_farms(store, tmp_path, redis_url) as farms:
        yield lambda **over: (farms(tokens.table_entry(alice, "alice"), **over)[0], alice)


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 30),
                                                  ("grpc.max_receive_message_length", 1 << 30)])


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _refused(fn) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    reason = dict(info.value.trailing_metadata() or ()).get("torchfarm-reason", "")
    return info.value.code(), reason, info.value.details()


def _padded(size: int) -> farm_pb2.CompileRequest:
    """A request of about `size` serialized bytes (an ExportSpec weight)."""
    req = relu_request()
    req.export.weights.add(placeholder="w", fqn="w", dtype="float32", shape=[1], data=b"\x00" * size)
    return req


def _upload(payload: bytes) -> farm_pb2.PrecompiledUpload:
    m = Manifest(key=KEY, fingerprint={"torch": "x"}, payload=BlobRef(blob_digest(payload), len(payload)),
                 tenant="alice", kind=PRECOMPILED, graphs={})
    return farm_pb2.PrecompiledUpload(
        manifest=m.to_json(), blobs=[farm_pb2.PrecompiledBlob(digest=m.payload.digest, data=payload)])


def test_a_request_over_the_farms_limit_is_refused_while_grpc_reads_it(start):
    address, alice = start(max_request_bytes=1 * MIB)
    with _channel(address) as ch:
        stub = farm_pb2_grpc.CompileFarmStub(ch)
        code, reason, details = _refused(lambda: stub.Submit(_padded(4 * MIB), timeout=30, metadata=_md(alice)))
        # grpc's own refusal: the handler never ran (the farm's would carry REQUEST_TOO_LARGE).
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and reason == "", (reason, details)
        assert "larger than max" in details, details
        code, reason, details = _refused(
            lambda: stub.PutPrecompiled(_upload(os.urandom(4 * MIB)), timeout=30, metadata=_md(alice)))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, ""), details
        # Just over the farm's limit, within grpc's margin: the farm's refusal, naming both sizes.
        code, reason, details = _refused(
            lambda: stub.Submit(_padded(MIB + 100), timeout=30, metadata=_md(alice)))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "REQUEST_TOO_LARGE"), details
        assert str(MIB) in details
        # The largest upload the farm accepts still arrives.
        upload = _upload(os.urandom(MIB - 4096))
        assert upload.ByteSize() <= MIB
        assert stub.PutPrecompiled(upload, timeout=30, metadata=_md(alice)).key == KEY


def test_the_sdk_names_the_limit_grpc_refused_a_request_for(start):
    address, alice = start(max_request_bytes=1 * MIB)
    client = FarmClient(address, SDKSettings(token=alice))
    try:
        with pytest.raises(RequestTooLarge) as raised:
            client.submit(_padded(4 * MIB))
    finally:
        client.close()
    assert raised.value.code == "REQUEST_TOO_LARGE" and raised.value.fallback
    assert "TORCHFARM_MAX_REQUEST_BYTES" in str(raised.value)


def test_a_tenants_open_fetches_are_capped_and_the_sdk_waits_for_a_place(start):
    address, alice = start(max_fetches_per_tenant=2)
    payload = os.urandom(12 * MIB)  # more than flow control lets the server send unread
    with _channel(address) as ch:
        stub = farm_pb2_grpc.CompileFarmStub(ch)
        stub.PutPrecompiled(_upload(payload), timeout=30, metadata=_md(alice))
        held = []
        for _ in range(2):  # two stalled streams: the manifest read, no chunk taken
            stream = stub.FetchArtifact(farm_pb2.ArtifactRef(key=KEY), timeout=60, metadata=_md(alice))
            assert next(stream).manifest
            held.append(stream)
        code, reason, details = _refused(
            lambda: next(stub.FetchArtifact(farm_pb2.ArtifactRef(key=KEY), timeout=30, metadata=_md(alice))))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "FETCH_LIMIT"), details
        assert "FetchArtifact" in details

        fetched: list[tuple[bytes, dict[str, bytes]]] = []
        client = FarmClient(address, SDKSettings(token=alice, direct_downloads=False))
        sdk_fetch = threading.Thread(target=lambda: fetched.append(client.fetch(KEY)))
        try:
            sdk_fetch.start()
            time.sleep(1.5)  # refused at least once meanwhile
            assert not fetched
            held.pop().cancel()  # a cancelled stream gives its place back
            sdk_fetch.join(30)
        finally:
            client.close()
        assert fetched and fetched[0][1] == {blob_digest(payload): payload}
        for stream in held:
            stream.cancel()


def test_the_server_caps_its_concurrent_calls(start):
    address, alice = start(max_concurrent_rpcs=2, watch_poll_s=3600.0, poll_interval_s=3600.0)
    with _channel(address) as ch:
        stub = farm_pb2_grpc.CompileFarmStub(ch)
        key = stub.Submit(relu_request(), timeout=30, metadata=_md(alice)).key
        watches = [stub.Watch(farm_pb2.JobRef(key=key), timeout=60, metadata=_md(alice)) for _ in range(2)]
        for watch in watches:
            assert next(watch).state == farm_pb2.QUEUED  # both open: the job never leaves the queue
        code, _, details = _refused(
            lambda: stub.GetFarmStatus(farm_pb2.FarmStatusRequest(), timeout=30, metadata=_md(alice)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        client = FarmClient(address, SDKSettings(token=alice))
        try:
            with pytest.raises(FarmUnavailable):  # the SDK's: busy, not a request too large
                client.status()
        finally:
            client.close()
        for watch in watches:
            watch.cancel()
