"""Authentication, tenant isolation and limits, on the wire: a real gRPC coordinator with
a token table over a real redis-server (Celery is replaced by an inline dispatcher that runs nothing)."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port
from sdk.client import FarmClient
from sdk.errors import GraphRejected, QuotaExceeded, RequestTooLarge, Unauthenticated
from sdk.settings import SDKSettings
from services.coordinator.settings import CoordinatorSettings
from tests.coordinator_server import running_coordinator
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.store import JobState
from torchfarm.trust import tokens
from torchfarm.v1 import farm_pb2, farm_pb2_grpc, graph_pb2
from torchfarm.wire import keys
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest

pytestmark = pytest.mark.integration

TENANTS = ("alice", "bob")


@pytest.fixture
def farm(store, tmp_path, redis_url):
    """A coordinator that requires tokens; yields (address, tokens by tenant, recorder, settings)."""
    toks = {t: tokens.new_token(t) for t in TENANTS}
    table: dict = {}
    for t, tok in toks.items():
        table.update(tokens.table_entry(tok, t))
    (tmp_path / "tokens.json").write_text(json.dumps(table))
    port = free_port()
    settings = CoordinatorSettings(
        listen=f"127.0.0.1:{port}", cache_url=redis_url, tokens_file=str(tmp_path / "tokens.json"),
        max_nodes=40, max_rank=4, max_request_bytes=20_000, max_jobs_per_tenant=2,
        poll_interval_s=0.02, grace_s=1,
    )
    store.heartbeat("w1", [RELU_QUEUE, "cpu"], "test", ttl_s=60)
    recorder = InlineDispatcher()
    with running_coordinator(settings, recorder):
        yield f"127.0.0.1:{port}", toks, recorder, settings


def _call(address: str, method: str, request, token: str | None = None):
    with grpc.insecure_channel(address) as ch:
        stub = farm_pb2_grpc.CompileFarmStub(ch)
        md = (("authorization", f"Bearer {token}"),) if token is not None else None
        result = getattr(stub, method)(request, timeout=10, metadata=md)
        return list(result) if method in ("Watch", "FetchArtifact") else result


def _code_and_reason(fn):
    with pytest.raises(grpc.RpcError) as info:
        fn()
    reason = dict(info.value.trailing_metadata() or ()).get("torchfarm-reason")
    return info.value.code(), reason


CALLS = [
    ("Submit", relu_request()),
    ("GetJob", farm_pb2.JobRef(key="0" * 64)),
    ("Watch", farm_pb2.JobRef(key="0" * 64)),
    ("FetchArtifact", farm_pb2.ArtifactRef(key="0" * 64)),
    ("GetFarmStatus", farm_pb2.FarmStatusRequest()),
]


@pytest.mark.parametrize("method, request_", CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("token", [None, "", "tf1.alice." + "A" * 43, "garbage"], ids=["none", "empty", "forged", "garbage"])
def test_every_method_needs_a_valid_token(farm, method, request_, token):
    address, _, recorder, _ = farm
    code, reason = _code_and_reason(lambda: _call(address, method, request_, token))
    assert code == grpc.StatusCode.UNAUTHENTICATED and reason == "UNAUTHENTICATED"
    assert recorder.sent == []


def test_health_is_open(farm):
    address = farm[0]
    with grpc.insecure_channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_tenants_get_separate_keys_jobs_and_artifacts(farm, store):
    address, toks, recorder, _ = farm
    req = relu_request()
    a = _call(address, "Submit", req, toks["alice"])
    b = _call(address, "Submit", req, toks["bob"])
    assert a.key == keys.compute_key(req, "alice") and b.key == keys.compute_key(req, "bob")
    assert a.key != b.key and not b.deduplicated
    assert {(t.key, t.namespace) for t in recorder.sent} == {(a.key, "alice"), (b.key, "bob")}
    assert store.r.exists(f"tf:job:alice:{a.key}") and store.r.exists(f"tf:req:bob:{b.key}")
    # Alice's finished artifact: she can fetch it, Bob cannot, even knowing its key.
    payload = b"compiled"
    ref = BlobRef(blob_digest(payload), len(payload))
    alice = store.tenant("alice")
    alice.put_blob(ref.digest, payload)
    alice.put_manifest(Manifest(key=a.key, fingerprint={}, payload=ref, tenant="alice"))
    alice.update_job(a.key, state=JobState.SUCCEEDED)
    assert len(_call(address, "FetchArtifact", farm_pb2.ArtifactRef(key=a.key), toks["alice"])) == 2
    for method, msg in (("FetchArtifact", farm_pb2.ArtifactRef(key=a.key)), ("GetJob", farm_pb2.JobRef(key=a.key))):
        code, _ = _code_and_reason(lambda method=method, msg=msg: _call(address, method, msg, toks["bob"]))
        assert code == grpc.StatusCode.NOT_FOUND
    status = _call(address, "GetFarmStatus", farm_pb2.FarmStatusRequest(), toks["bob"])
    assert [j.key for j in status.recent_jobs] == [b.key]


def _distinct(i: int) -> farm_pb2.CompileRequest:
    req = relu_request()
    req.graph.nodes[0].tensor.shape[0].expr = str(10 + i)
    req.graph.nodes[0].tensor.shape[0].hint = 10 + i
    return req


def test_quota_of_jobs_in_flight_per_tenant(farm, store):
    address, toks, _, settings = farm
    keys_a = [_call(address, "Submit", _distinct(i), toks["alice"]).key for i in range(2)]
    code, reason = _code_and_reason(lambda: _call(address, "Submit", _distinct(2), toks["alice"]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and reason == "TENANT_QUEUE_FULL"
    # Joining a job in flight, and other tenants, are not limited.
    assert _call(address, "Submit", _distinct(0), toks["alice"]).deduplicated
    assert _call(address, "Submit", _distinct(2), toks["bob"]).state == farm_pb2.QUEUED
    store.tenant("alice").update_job(keys_a[0], state=JobState.SUCCEEDED)
    assert _call(address, "Submit", _distinct(2), toks["alice"]).state == farm_pb2.QUEUED
    # The SDK sees the quota as its own error class, which falls back.
    client = FarmClient(f"grpc://{address}", SDKSettings(token=toks["alice"], connect_timeout_s=5))
    with pytest.raises(QuotaExceeded, match="at most|most the farm allows") as info:
        client.submit(_distinct(3))
    assert info.value.fallback and info.value.code == "TENANT_QUEUE_FULL"


def _chain(n: int) -> farm_pb2.CompileRequest:
    req = relu_request()
    nodes = list(req.graph.nodes)
    body = [nodes[0]]
    prev = "x"
    for i in range(n):
        body.append(graph_pb2.Node(name=f"r{i}", op=graph_pb2.Node.CALL_FUNCTION, target="torch.relu",
                                   args=[graph_pb2.Argument(node=prev)]))
        prev = f"r{i}"
    body.append(graph_pb2.Node(name="output", op=graph_pb2.Node.OUTPUT, target="output",
                               args=[graph_pb2.Argument(tuple=graph_pb2.ArgumentList(items=[graph_pb2.Argument(node=prev)]))]))
    del req.graph.nodes[:]
    req.graph.nodes.extend(body)
    return req


def _rank(r: int) -> farm_pb2.CompileRequest:
    req = relu_request()
    t = req.graph.nodes[0].tensor
    del t.shape[:], t.stride[:]
    for _ in range(r):
        t.shape.add(expr="2", hint=2)
        t.stride.add(expr="1", hint=1)
    return req


def _option(name: str, value: str) -> farm_pb2.CompileRequest:
    req = relu_request()
    req.options.inductor.add(name=name, json_value=value)
    return req


def _autocast(device: str, dtype: str) -> farm_pb2.CompileRequest:
    req = relu_request()
    req.options.autocast.add(device_type=device, dtype=dtype)
    return req


def _big() -> farm_pb2.CompileRequest:
    return relu_request(label="x" * 30_000)


LIMITS = [
    (_chain(50), grpc.StatusCode.INVALID_ARGUMENT, "GRAPH_TOO_LARGE", GraphRejected, "more than 40"),
    (_rank(5), grpc.StatusCode.INVALID_ARGUMENT, "GRAPH_TOO_LARGE", GraphRejected, "rank 5, more than 4"),
    (_big(), grpc.StatusCode.RESOURCE_EXHAUSTED, "REQUEST_TOO_LARGE", RequestTooLarge, "at most 20000"),
    (_option("cpp.cxx", '[null, "/bin/sh"]'), grpc.StatusCode.INVALID_ARGUMENT, "OPTION_NOT_ALLOWED",
     GraphRejected, "cpp.cxx"),
    (_option("max_autotune", '"yes"'), grpc.StatusCode.INVALID_ARGUMENT, "OPTION_NOT_ALLOWED",
     GraphRejected, "not allowed"),
    (_autocast("cpu", "float64"), grpc.StatusCode.INVALID_ARGUMENT, "OPTION_NOT_ALLOWED",
     GraphRejected, "autocast to 'float64'"),
]


@pytest.mark.parametrize("req, code, reason, error, message", LIMITS,
                         ids=["nodes", "rank", "bytes", "option-cxx", "option-type", "autocast"])
def test_limits_have_their_own_code_reason_and_sdk_error(farm, req, code, reason, error, message):
    address, toks, recorder, _ = farm
    got_code, got_reason = _code_and_reason(lambda: _call(address, "Submit", req, toks["alice"]))
    assert (got_code, got_reason) == (code, reason)
    client = FarmClient(f"grpc://{address}", SDKSettings(token=toks["alice"], connect_timeout_s=5))
    with pytest.raises(error, match=message) as info:
        client.submit(req)
    assert info.value.fallback and info.value.code == reason
    assert recorder.sent == []


def test_sdk_without_or_with_a_wrong_token_gets_unauthenticated(farm):
    address = farm[0]
    for token in ("", tokens.new_token("alice")):
        client = FarmClient(f"grpc://{address}", SDKSettings(token=token, connect_timeout_s=5))
        with pytest.raises(Unauthenticated, match="TORCHFARM_TOKEN") as info:
            client.submit(relu_request())
        assert info.value.fallback
