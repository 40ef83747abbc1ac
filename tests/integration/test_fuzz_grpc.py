"""Fuzzing the real gRPC Submit: mutated CompileRequests, as raw bytes, against a live
coordinator. The only acceptable answers are OK (a valid graph, queued) and a clean
INVALID_ARGUMENT (or FAILED_PRECONDITION NO_WORKER for a valid request whose mutated target no
worker serves); never UNKNOWN or INTERNAL, never a hang past the deadline, and the
server answers health checks after every example. The torch-side decoder has its own
fuzz (tests/unit/test_graph_codec.py); tests/fuzz/atheris_graph.py drives both with
coverage guidance where atheris is installed."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port, start_redis_server
from services.coordinator.settings import CoordinatorSettings
from tests.coordinator_server import running_coordinator
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2, graph_pb2

pytestmark = pytest.mark.integration

SUBMIT = "/torchfarm.v1.CompileFarm/Submit"
DEADLINE_S = 10.0
OK_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}


def _seeds() -> list[bytes]:
    plain = relu_request()
    symbolic = relu_request()
    symbolic.graph.symbols.add(name="s0", hint=4, min=2)
    symbolic.graph.nodes[0].tensor.shape[0].CopyFrom(graph_pb2.SymExpr(expr="s0", hint=4))
    symbolic.graph.nodes.insert(
        0,
        graph_pb2.Node(name="s0_1", op=graph_pb2.Node.PLACEHOLDER, target="s0",
                       symint=graph_pb2.SymExpr(expr="s0", hint=4)),
    )
    with_kwargs = relu_request(options={"max_autotune": "true"})
    add = with_kwargs.graph.nodes[1]
    add.target = "torch.add"
    add.args.append(graph_pb2.Argument(float_value=1.5))
    add.kwargs.add(name="alpha", value=graph_pb2.Argument(int_value=2))
    return [r.SerializeToString() for r in (plain, symbolic, with_kwargs)]


SEEDS = _seeds()
TARGETS = ["torch.relu", "torch.add", "_operator.add", "view", "torch.save", "os.system", "",
           "torch.ops.aten.add.Tensor", "__class__", "builtins.eval"]
EXPRS = ["s0", "s9", "2*s0", "(s0//0)", "Mod(s0, 0)", "s0**64", "9" * 25, "__import__('os')", ""]


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    redis_port = free_port()
    redis = start_redis_server(redis_port, tmp_path_factory.mktemp("fuzz-redis"))
    store = Store.from_url(f"redis://127.0.0.1:{redis_port}/1")
    store.heartbeat("w1", [RELU_QUEUE, "cpu"], "test", ttl_s=3600)
    port = free_port()
    settings_ = CoordinatorSettings(
        listen=f"127.0.0.1:{port}", cache_url=f"redis://127.0.0.1:{redis_port}/1",
        max_jobs_per_tenant=0, grace_s=1,
    )
    recorder = InlineDispatcher()
    with running_coordinator(settings_, recorder):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        submit = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
        health = health_pb2_grpc.HealthStub(channel)
        stats = {"calls": 0, "ok": 0, "invalid": 0, "slowest_s": 0.0}
        yield submit, health, stats
        channel.close()
        print(f"\nfuzz over gRPC: {stats}")
    redis.terminate()
    redis.wait(10)


def _send(farm, data: bytes) -> None:
    submit, health, stats = farm
    t0 = time.monotonic()
    try:
        submit(data, timeout=DEADLINE_S)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        reason = dict(e.trailing_metadata() or ()).get("torchfarm-reason")
        # A well-formed request for a target no worker serves (a mutated ISA, say) is
        # answered FAILED_PRECONDITION NO_WORKER: correct, and not a parsing outcome.
        if (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NO_WORKER"):
            code = grpc.StatusCode.OK
        assert code in OK_CODES, f"{code.name}: {e.details()}"
        assert e.details(), "an error without a message"
    took = time.monotonic() - t0
    stats["calls"] += 1
    stats["ok" if code == grpc.StatusCode.OK else "invalid"] += 1
    stats["slowest_s"] = max(stats["slowest_s"], took)
    assert took < DEADLINE_S
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING


FUZZ = settings(
    max_examples=300, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(data=st.data())
def test_fuzz_submit_with_mutated_bytes(farm, data):
    raw = bytearray(data.draw(st.sampled_from(SEEDS)))
    for _ in range(data.draw(st.integers(1, 4))):
        if not raw:
            break
        pos = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "flip", "flip", "insert", "delete", "truncate"]))
        if action == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif action == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif action == "delete":
            del raw[pos : pos + data.draw(st.integers(1, 16))]
        else:
            del raw[pos:]
    _send(farm, bytes(raw))


@FUZZ
@given(data=st.data())
def test_fuzz_submit_with_structured_mutations(farm, data):
    req = farm_pb2.CompileRequest.FromString(data.draw(st.sampled_from(SEEDS)))
    g = req.graph
    for _ in range(data.draw(st.integers(1, 3))):
        node = g.nodes[data.draw(st.integers(0, len(g.nodes) - 1))]
        action = data.draw(st.sampled_from(
            ["target", "op", "arg", "expr", "rank", "dtype", "device", "option", "mode", "dup", "format"]
        ))
        if action == "target":
            node.target = data.draw(st.sampled_from(TARGETS))
        elif action == "op":
            node.op = data.draw(st.integers(-1, 9))
        elif action == "arg":
            node.args.append(data.draw(st.one_of(
                st.builds(graph_pb2.Argument, int_value=st.integers(-(2**63), 2**63 - 1)),
                st.builds(graph_pb2.Argument, float_value=st.floats()),
                st.builds(graph_pb2.Argument, str_value=st.text(max_size=20)),
                st.builds(graph_pb2.Argument, node=st.sampled_from(["x", "y", "output", "nope", ""])),
                st.builds(graph_pb2.Argument, dtype=st.text(max_size=10)),
            )))
        elif action == "expr" and node.HasField("tensor") and node.tensor.shape:
            node.tensor.shape[0].expr = data.draw(st.sampled_from(EXPRS))
            node.tensor.shape[0].hint = data.draw(st.integers(-5, 2**62))
        elif action == "rank" and node.HasField("tensor"):
            for _ in range(data.draw(st.integers(1, 20))):
                node.tensor.shape.add(expr="1", hint=1)
                node.tensor.stride.add(expr="1", hint=1)
        elif action == "dtype" and node.HasField("tensor"):
            node.tensor.dtype = data.draw(st.sampled_from(["float16", "qint8", "", "float32\x00"]))
        elif action == "device":
            req.target.device = data.draw(st.sampled_from(["cpu", "cuda", "tpu", "", "cpu\n"]))
        elif action == "option":
            req.options.inductor.add(
                name=data.draw(st.sampled_from(["max_autotune", "cpp.cxx", "trace.debug_dir", "", "x" * 300])),
                json_value=data.draw(st.sampled_from(["true", "1", '"a"', "{", "null", "[null, \"/bin/sh\"]"])),
            )
        elif action == "mode":
            req.options.mode = data.draw(st.sampled_from(["", "max-autotune", "evil", "\x00"]))
        elif action == "dup":
            g.nodes.add().CopyFrom(node)
        elif action == "format":
            g.format = data.draw(st.integers(-1, 3))
    _send(farm, req.SerializeToString())
