"""Workers that die: a pool process killed mid-lowering, a whole worker killed
mid-lowering, a graph whose decomposition is killed every time, and a compile past the
time limit."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from localfarm.stack import LocalStack
from sdk.errors import RemoteCompileError
from tests.faults.farmkit import (
    FIGURES,
    Client,
    compiling,
    deliveries,
    graph_request,
    in_background,
    join_client,
    kill_group,
    pool_child,
    wait_for,
)
from torchfarm.storage.store import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

VISIBILITY_S = 30
"""Broker visibility timeout of these stacks: a job a whole dead worker held comes back
after this. Above the hard time limit, as torchfarm.celeryconf requires."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    env = {
        "TORCHFARM_SOFT_TIME_LIMIT_S": "20",
        "TORCHFARM_HARD_TIME_LIMIT_S": "25",
        "TORCHFARM_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
    }
    # Warmed up, unlike the other test stacks: the first compile here has 20 s, and
    # would otherwise pay Inductor's ISA probe and build hashes inside them.
    # The warm-up comes before the worker registers: on a loaded 2-core machine it took
    # the stack past the default 60 s start timeout.
    s = LocalStack(workers=1, workdir=tmp_path_factory.mktemp("faults-workers"), extra_env=env)
    s.start(timeout_s=240)
    try:
        yield s
    finally:
        s.stop()





def test_the_warmed_up_worker_warmed_up_once_before_it_registered(stack):
    """The one test stack whose worker warms Inductor up: it did, once, in the main
    process before the pool forked, the staged compile included (workers/priming.py)."""
    log = (stack.workdir / "worker0.log").read_text(errors="replace")
    warmed = [line for line in log.splitlines() if "warmed Inductor" in line]
    assert len(warmed) == 1, warmed
    assert "first compile" in warmed[0] and log.index("warmed Inductor") < log.index("registered")


def test_pool_process_killed_mid_compile_completes_once(stack):
    client, store = Client(stack), stack.store()
    request = graph_request(24, label="pool-kill")
    key = client.key(request)
    t0 = time.monotonic()
    t, box = in_background(lambda: client.compile(request))
    wait_for(lambda: compiling(store, key), 120, "the compile")
    os.kill(pool_child(stack), signal.SIGKILL)
    killed = time.monotonic()
    out = join_client(t, box, 300)
    record = store.get_job(key)
    assert out.status is not None and out.status.state == 3  # SUCCEEDED
    assert out.manifest.key == key and out.manifest.signature is not None
    assert record.state == JobState.SUCCEEDED
    assert deliveries(store, key) == (1, 2), "the lowering, and only it, was not redone once"
    assert not out.reply.cache_hit
    FIGURES["worker_pool_process_sigkill"] = {
        "lowering_deliveries": deliveries(store, key)[1],
        "kill_to_artifact_s": round(time.monotonic() - killed, 1),
        "client_total_s": round(out.seconds, 1),
        "since_submit_s": round(time.monotonic() - t0, 1),
    }


def test_whole_worker_killed_mid_compile_is_redelivered_to_a_new_worker(stack):
    client, store = Client(stack), stack.store()
    request = graph_request(28, label="worker-kill")
    key = client.key(request)
    t, box = in_background(lambda: client.compile(request))
    wait_for(lambda: compiling(store, key), 120, "the compile")
    kill_group(stack, "worker0")  # the main process, its pool and compile subprocesses
    killed = time.monotonic()
    stack.start_worker(1)
    wait_for(lambda: deliveries(store, key)[1] >= 2, VISIBILITY_S + 60, "the redelivery",
             every_s=0.2)
    redelivered = time.monotonic() - killed
    out = join_client(t, box, 300)
    record = store.get_job(key)
    assert record.state == JobState.SUCCEEDED and deliveries(store, key) == (1, 2)
    assert out.manifest.key == key and out.manifest.worker == "cpu1"
    FIGURES["worker_whole_sigkill"] = {
        "visibility_timeout_s": VISIBILITY_S,
        "kill_to_redelivery_s": round(redelivered, 1),
        "kill_to_artifact_s": round(time.monotonic() - killed, 1),
        "lowering_deliveries": deliveries(store, key)[1],
    }


@pytest.fixture(scope="module")
def crashing_stack(tmp_path_factory):
    # One CPU second per compile: the kernel kills the pool process (SIGXCPU) on each try.
    env = {"TORCHFARM_COMPILE_CPU_LIMIT_S": "1", "TORCHFARM_MAX_ATTEMPTS": "3"}
    with LocalStack(
        workers=1, workdir=tmp_path_factory.mktemp("faults-crash"), extra_env=env, warmup=False
    ) as s:
        yield s


def test_compile_that_crashes_every_time_fails_after_the_attempt_cap(crashing_stack):
    stack = crashing_stack
    client, store = Client(stack), stack.store()
    # Deep enough that its decomposition alone, the graph job's stage, needs well over
    # the CPU budget however warm the worker is and however fast its CPU. The budget is
    # one to two seconds (workers/limits.py rounds what the process has used up); on an
    # AVX-512 machine depth 200 took 1.8 s cold and 0.75 s warm, and once got through
    # to the lowering; depth 800 took 4.1 s cold and 3.2 s warm.
    request = graph_request(32, depth=800, label="crash")
    key = client.key(request)
    t0 = time.monotonic()
    with pytest.raises(RemoteCompileError) as info:
        client.compile(request)
    took = time.monotonic() - t0
    assert info.value.code == "TOO_MANY_ATTEMPTS" and info.value.fallback
    record = store.get_job(key)
    assert record.state == JobState.FAILED and record.attempts == 4  # 3 crashes + the refusal
    assert deliveries(store, key) == (4, 0), "the lowering job ran"
    # No redelivery loop: nothing left queued or unacknowledged, the count stays put.
    time.sleep(5)
    b = redis.Redis.from_url(stack.broker_url)
    assert b.llen(record.queue) == 0 and b.hlen("unacked") == 0
    assert store.get_job(key).attempts == 4
    # A resubmit inside the failure TTL gets the failure at once, without compiling again.
    t1 = time.monotonic()
    with pytest.raises(RemoteCompileError):
        client.compile(request)
    assert time.monotonic() - t1 < 5 and store.get_job(key).attempts == 4
    log = (stack.workdir / "worker0.log").read_text(errors="replace")
    assert "signal 24 (SIGXCPU)" in log  # killed by the kernel, not a Python exception
    FIGURES["compile_crashes_every_time"] = {
        "attempts": record.attempts,
        "pool_processes_killed": record.attempts - 1,
        "submit_to_failed_s": round(took, 1),
    }


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory):
    env = {
        "TORCHFARM_SOFT_TIME_LIMIT_S": "1",
        "TORCHFARM_HARD_TIME_LIMIT_S": "60",
        "TORCHFARM_VISIBILITY_TIMEOUT_S": "120",
    }
    with LocalStack(
        workers=1, workdir=tmp_path_factory.mktemp("faults-slow"), extra_env=env, warmup=False
    ) as s:
        yield s


def test_compile_past_the_soft_time_limit_fails_compile_timeout(slow_stack):
    client, store = Client(slow_stack), slow_stack.store()
    request = graph_request(20, depth=60, label="slow")  # its lowering alone takes seconds
    t0 = time.monotonic()
    with pytest.raises(RemoteCompileError) as info:
        client.compile(request)
    assert info.value.code == "COMPILE_TIMEOUT" and info.value.fallback
    record = store.get_job(client.key(request))
    assert record.state == JobState.FAILED and record.attempts == 1
    FIGURES["compile_timeout"] = {"soft_limit_s": 1, "submit_to_failed_s": round(time.monotonic() - t0, 1)}
