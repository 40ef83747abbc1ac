"""Redis HA: the farm's Redis clients follow a Sentinel failover (a real redis-sentinel
with a primary and a replica; the primary is killed)."""

from __future__ import annotations

import time

import pytest

from localfarm.sentinel import SentinelGroup
from localfarm.stack import LocalStack
from torchfarm.storage.redisconn import celery_broker, connect
from torchfarm.storage.store import JobState, Store

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def group(tmp_path):
    g = SentinelGroup(tmp_path).start()
    yield g
    g.stop()


def test_a_job_record_written_before_a_failover_is_finished_after_it(group):
    store = Store.from_url(group.url(1))
    assert store.create_job("k" * 64, "cpu", "label", ttl_s=600)
    store.update_job("k" * 64, state=JobState.RUNNING)
    store.r.wait(1, 5000)  # the replica has it: what a failover keeps
    new_primary = group.kill_primary()
    group.wait_primary(new_primary)
    # The same Store object, no reconnect by hand: the next commands reach the new primary.
    store.update_job("k" * 64, state=JobState.SUCCEEDED)
    assert store.get_job("k" * 64).state == JobState.SUCCEEDED


def test_a_task_sent_while_the_primary_is_down_reaches_the_new_one(group):
    """What a worker does mid-compile when it hands on a stage job: the send outlasts the
    failover (Celery's default retry policy gave up after 0.6 s and the job hung)."""
    import redis

    from torchfarm.celeryconf import make_celery

    app = make_celery(group.url(0))
    new_primary = group.kill_primary()
    app.send_task("torchfarm.test.noop", args=["k"], queue="failover-test")
    assert redis.Redis(port=new_primary, db=0).llen("failover-test") == 1


def test_sentinel_urls_for_celery_and_clear_errors():
    assert celery_broker("redis+sentinel://a:26379,b:26380/svc/2") == (
        "sentinel://a:26379/2;sentinel://b:26380/2", {"master_name": "svc"})
    assert celery_broker("redis://h:6379/0") == ("redis://h:6379/0", {})
    with pytest.raises(ValueError):
        connect("redis+sentinel://a:26379")


class SentinelStack(LocalStack):
    """The local stack with its broker and cache on a Sentinel group, not its own Redis."""

    group: SentinelGroup | None = None

    @property
    def broker_url(self) -> str:
        return self.group.url(0)

    @property
    def cache_url(self) -> str:
        return self.group.url(1)

    def start_redis(self) -> None:
        pass


@pytest.mark.failover
def test_a_compile_in_flight_completes_through_a_failover(tmp_path, monkeypatch, client_cache_dir):
    import threading

    import torch

    import sdk
    from examples.models import make_mlp

    group = SentinelGroup(tmp_path / "redis").start()
    stack = SentinelStack(workers=1, workdir=tmp_path / "stack", extra_env={"TORCHFARM_WARMUP": "0"})
    stack.group = group
    try:
        with stack:
            monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(stack.trusted_keys_file))
            model, inputs = make_mlp()
            torch._dynamo.reset()
            compiled = sdk.compile(model, remote=stack.address, fallback="error")
            result: dict = {}

            def run():
                try:
                    result["out"] = compiled(*inputs)
                except BaseException as e:  # reported below
                    result["error"] = e

            thread = threading.Thread(target=run)
            thread.start()
            store = stack.store()
            while not any(state == JobState.RUNNING for _, state in store.job_states()):
                assert thread.is_alive(), result
                time.sleep(0.05)
            group.kill_primary()
            group.wait_primary(group.ports["replica"])
            # No timed assertion: the bound is only there to report a hang as a failure.
            thread.join(480)
            assert not thread.is_alive(), f"the compile hung; jobs: {list(store.job_states())}"
            assert "error" not in result, result.get("error")
            torch.testing.assert_close(result["out"], model(*inputs), atol=1e-5, rtol=1e-5)
    finally:
        group.stop()
