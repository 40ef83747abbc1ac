"""`Store.create_job` is one step: a coordinator killed anywhere inside it leaves either
no job or a whole one (request, record with its TTL), never a key that answers
"queued" forever with nothing queued (issue 16, item 5). And a job's request record
goes when the job ends."""

from __future__ import annotations

import asyncio

import pytest
import redis

from localfarm.fakes import InlineDispatcher
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.requests import RELU_QUEUE, relu_request
from torchfarm.storage.store import Attempts, JobState
from torchfarm.wire import keys
from workers.board import StageBoard

pytestmark = pytest.mark.integration


class Killed(BaseException):
    """The process dies here: nothing after it runs, no except clause catches it."""


@pytest.fixture
def farm(store):
    store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
    return Farm(CoordinatorSettings(), store, InlineDispatcher())


def _kill_after(monkeypatch, steps: int) -> list[int]:
    """Every round trip to Redis (a command, or a pipeline's execute) counts one step;
    the one after `steps` dies before it reaches Redis."""
    done = [0]
    real_command = redis.Redis.execute_command
    real_execute = redis.client.Pipeline.execute

    def step() -> None:
        if done[0] >= steps:
            raise Killed()
        done[0] += 1

    def command(self, *args, **kwargs):
        step()
        return real_command(self, *args, **kwargs)

    def execute(self, *args, **kwargs):
        step()
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", command)
    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    return done


def _create(store, key: str, req) -> bool:
    """create_job, as a coordinator that may die inside it; True when it was killed."""
    try:
        store.create_job(
            key, "cpu.avx512", req.label, ttl_s=60,
            request=req.SerializeToString(),
        )
    except Killed:
        return True
    return False


def _steps_of_create_job(store, monkeypatch) -> int:
    done = _kill_after(monkeypatch, 10**6)
    store.create_job("probe", "cpu.avx512", "", ttl_s=60, request=b"r")
    monkeypatch.undo()
    store.r.flushall()
    return done[0]


def test_a_kill_anywhere_inside_create_job_leaves_no_job_or_a_whole_one(farm, store, monkeypatch):
    req = relu_request()
    key = keys.compute_key(req)
    steps = _steps_of_create_job(store, monkeypatch)
    assert steps >= 1
    for n in range(steps):
        store.r.flushall()
        store.heartbeat("w1", [RELU_QUEUE], "test", ttl_s=30)
        _kill_after(monkeypatch, n)
        _create(store, key, req)  # killed, or done (Redis had the script cached)
        monkeypatch.undo()
        raw = store.r.hgetall(f"tf:job:{key}")
        if raw:  # all of it, or the submit below would join a job nobody queued
            assert store.get_job(key).state == JobState.QUEUED
            assert store.r.ttl(f"tf:job:{key}") > 0
            assert store.get_request(key) == req.SerializeToString()
        # The coordinator restarts; the client submits again and must not wait forever.
        farm.dispatcher.sent.clear()
        reply = asyncio.run(farm.submit(req, req.ByteSize()))
        if raw:
            assert reply.deduplicated  # the job did exist, whole (its send was lost: stale_job_s)
        else:
            assert not reply.deduplicated and [t.key for t in farm.dispatcher.sent] == [key], f"killed after step {n}"
        assert store.get_request(key) == req.SerializeToString()


def test_a_kill_between_the_old_two_steps_would_have_left_a_stuck_key(farm, store, monkeypatch):
    """The case the issue names: the job's lease taken, its state never written."""
    req = relu_request()
    key = keys.compute_key(req)
    _kill_after(monkeypatch, 1)
    _create(store, key, req)
    monkeypatch.undo()
    reply = asyncio.run(farm.submit(req, req.ByteSize()))
    if reply.deduplicated:  # it joined a job: that job must be whole, and expire
        assert store.r.hget(f"tf:job:{key}", "state") == b"QUEUED"
        assert store.r.ttl(f"tf:job:{key}") > 0
        assert store.get_request(key) == req.SerializeToString()
    else:
        assert [t.key for t in farm.dispatcher.sent] == [key]


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED])
def test_the_request_record_is_deleted_when_its_job_ends(farm, store, state):
    req = relu_request()
    key = keys.compute_key(req)
    asyncio.run(farm.submit(req, req.ByteSize()))
    assert store.get_request(key) is not None
    store.update_job(key, state=JobState.RUNNING)
    assert store.get_request(key) is not None  # a running job still reads it
    if state == JobState.FAILED:
        store.fail_job(key, "COMPILE_FAILED", "boom", ttl_s=60)
    else:
        store.update_job(key, state=JobState.SUCCEEDED, stage="done")
    assert store.get_request(key) is None
    assert store.get_job(key).state == state


def test_a_kernel_request_record_is_deleted_when_its_job_ends(store):
    store.create_job("k1", "kernels.cpu", "", ttl_s=60, request=b"kreq", kind="kreq")
    assert store.get_kernel_request("k1") == b"kreq"
    store.fail_job("k1", "INVALID_KERNEL", "no", ttl_s=60)
    assert store.get_kernel_request("k1") is None


def test_a_job_that_moves_on_keeps_its_record_and_request_for_another_ttl(store):
    # A job queued or compiling longer than its record's TTL lost the record and the
    # request mid-run: its watcher saw it vanish, and a later stage found no request.
    store.create_job("k1", "cpu", "", ttl_s=600, request=b"r")
    for name in ("tf:job:k1", "tf:req:k1"):
        store.r.expire(name, 5)  # most of its TTL spent waiting in the queue
    store.update_job("k1", state=JobState.RUNNING, stage="decode")
    assert store.r.ttl("tf:job:k1") > 500 and store.r.ttl("tf:req:k1") > 500


def test_a_record_that_expired_is_not_written_again(store):
    # HSET on a gone record made one with no TTL, in the Redis that never evicts.
    store.create_job("k1", "cpu", "", ttl_s=600, request=b"r")
    store.r.delete("tf:job:k1", "tf:req:k1")  # what its expiry does
    store.incr_attempts("k1")
    store.update_job("k1", state=JobState.RUNNING, stage="lowering")
    assert not store.r.exists("tf:job:k1")
    store.fail_job("k1", "COMPILE_FAILED", "gone", ttl_s=60)
    assert not store.r.exists("tf:job:k1")


def test_a_staged_job_whose_record_expired_is_not_written_again(store):
    # The lowering's and the kernel builds' notes on the record made it again with no TTL.
    board = StageBoard(store)
    store.create_job("k1", "cpu", "", ttl_s=600, request=b"r")
    store.r.delete("tf:job:k1", "tf:req:k1")  # what its expiry does, mid-stage
    assert board.count("k1", Attempts.LOWERING) == 0
    board.open_lowering("k1", ttl_s=60)
    board.note_waiting("k1", 2, sent=True)
    board.note_kernel_start("k1", "w1")
    board.close_lowering("k1", total=2, hits=0, strays=[], sends_builds=True, ttl_s=60)
    board.release("k1", ["c1"], hits=0, busy_s=0.1)
    assert not store.r.exists("tf:job:k1")
