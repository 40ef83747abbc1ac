"""A fleet of two builds of one target, on the real local stack: two Celery workers on
cpu, the second reporting another torch build (TORCHFARM_REPORTED_BUILD, a test hook;
workers/identity.py). Each client's compile reaches only the worker of its own build,
and a build no worker runs is refused at submit time, by name, with nothing queued."""

from __future__ import annotations

import json

import pytest

from localfarm.stack import LocalStack
from sdk.client import FarmClient
from sdk.errors import FarmUnavailable
from sdk.settings import SDKSettings
from tests.requests import relu_request
from torchfarm.v1 import farm_pb2
from torchfarm.wire import builds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

OTHER = {"torch_version": "2.12.0+cpu", "torch_git": "simulated0other0build"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    env = {"TORCHFARM_WARMUP": "0", "TORCHFARM_PIPELINE": "whole"}
    other = {"TORCHFARM_REPORTED_BUILD": json.dumps(OTHER)}
    with LocalStack(
        workers=2, workdir=tmp_path_factory.mktemp("builds"), extra_env=env, worker_env={1: other},
    ) as s:
        yield s


@pytest.fixture
def client(stack):
    c = FarmClient(stack.address, SDKSettings(connect_timeout_s=10, compile_timeout_s=300))
    yield c
    c.close()


def request_of(fingerprint: dict[str, str], label: str) -> farm_pb2.CompileRequest:
    """A relu compile from a client of exactly the worker's build."""
    req = relu_request(isa=fingerprint["isa"])
    req.target.compiler = fingerprint["compiler"]
    req.build.CopyFrom(farm_pb2.Build(**{
        k: fingerprint[k] for k in ("torch_version", "torch_git", "triton_version", "python", "platform")
    }))
    req.label = label
    return req


def test_each_build_reaches_only_its_own_worker(stack, client):
    workers = stack.store().live_workers()
    assert workers["cpu1"]["fingerprint"]["torch_git"] == OTHER["torch_git"]
    assert workers["cpu0"]["fingerprint"]["torch_git"] != OTHER["torch_git"]
    for name in ("cpu0", "cpu1"):
        for attempt in range(3):  # another label: the same key; each compile is one job
            req = request_of(workers[name]["fingerprint"], f"{name}-{attempt}")
            req.graph.nodes[0].tensor.shape[0].expr = str(4 + attempt)  # a new key each time
            req.graph.nodes[0].tensor.shape[0].hint = 4 + attempt
            reply = client.submit(req)
            done = client.wait(reply.key)
            assert done.worker == name, f"a client of {name}'s build reached {done.worker}"


def test_an_unserved_build_is_refused_at_submit_time_by_name(stack, client):
    fp = dict(stack.store().live_workers()["cpu0"]["fingerprint"])
    req = request_of({**fp, "torch_version": "2.11.0+cpu"}, "unserved")
    before = {j.key for j in stack.store().tenant("").recent_jobs()}
    with pytest.raises(FarmUnavailable) as e:
        client.submit(req)
    assert e.value.code == "BUILD_NOT_SERVED"
    message = str(e.value)
    assert "with build torch 2.11.0+cpu" in message
    for name in ("cpu0", "cpu1"):
        served = builds.of_worker(stack.store().live_workers()[name])
        assert builds.label(served) in message  # both builds served are listed
    assert {j.key for j in stack.store().tenant("").recent_jobs()} == before  # nothing queued
