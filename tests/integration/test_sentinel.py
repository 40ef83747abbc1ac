"""Redis HA: the farm's Redis clients follow a Sentinel failover (a real redis-sentinel
with a primary and a replica; the primary is killed)."""

from __future__ import annotations

import pytest

from torchfarm.redisconn import celery_broker, connect
from torchfarm.store import JobState, Store
from torchfarm.testing.sentinel import SentinelGroup

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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


def test_sentinel_urls_for_celery_and_clear_errors():
    assert celery_broker("redis+sentinel://a:26379,b:26380/svc/2") == (
        "sentinel://a:26379/2;sentinel://b:26380/2", {"master_name": "svc"})
    assert celery_broker("redis://h:6379/0") == ("redis://h:6379/0", {})
    with pytest.raises(ValueError):
        connect("redis+sentinel://a:26379")
