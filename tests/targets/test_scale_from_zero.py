"""A pool scaled to zero is woken by the job it should take: the coordinator queues a
graph job for a known target (configured, or served by a worker within the window)
even while no worker for it is live, against a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InlineDispatcher
from services.coordinator.errors import NoWorker
from services.coordinator.farm import Farm, known_queues
from services.coordinator.settings import CoordinatorSettings
from tests.requests import queue_of
from tests.targets.test_farm_routing import fleet, gpu_request  # noqa: F401
from torchfarm.storage.store import JobState

pytestmark = pytest.mark.integration


def _submit(farm, req):
    return asyncio.run(farm.submit(req, req.ByteSize()))


def test_a_target_whose_pool_went_to_zero_is_queued(fleet):
    """The sm_90 worker scaled away (its registration gone): its target's job is queued,
    for the pool's autoscaler to see, and nothing is refused."""
    fleet.forget_worker("h100-1")
    req = gpu_request("sm_90")
    assert not any(queue_of(req) in w["queues"] for w in fleet.live_workers().values())
    farm = Farm(CoordinatorSettings(), fleet, InlineDispatcher())
    out = _submit(farm, req)
    assert out.state == JobState.QUEUED and not out.cache_hit
    assert [(t.key, t.queue) for t in farm.dispatcher.sent] == [(out.key, queue_of(req))]
    assert fleet.get_job(out.key).queue == queue_of(req)


def test_a_configured_target_no_worker_ever_served_is_queued(fleet):
    farm = Farm(CoordinatorSettings(known_targets=("cuda:sm_80",)), fleet, InlineDispatcher())
    req = gpu_request("sm_80")
    out = _submit(farm, req)
    assert out.state == JobState.QUEUED
    assert [(t.key, t.queue) for t in farm.dispatcher.sent] == [(out.key, queue_of(req))]


def test_a_target_seen_before_the_window_is_unavailable(fleet):
    """Outside the window (here 0: the window is off) a target nobody serves is refused
    at once, so a client falls back instead of waiting on a pool that is not there."""
    fleet.forget_worker("h100-1")
    farm = Farm(CoordinatorSettings(known_target_window_s=0), fleet, InlineDispatcher())
    with pytest.raises(NoWorker, match="cuda:sm_90"):
        _submit(farm, gpu_request("sm_90"))
    assert farm.dispatcher.sent == []


def test_a_target_never_seen_nor_configured_is_still_unavailable(fleet):
    farm = Farm(CoordinatorSettings(known_targets=("cuda:sm_90",)), fleet, InlineDispatcher())
    with pytest.raises(NoWorker, match="cuda:sm_80"):
        _submit(farm, gpu_request("sm_80"))


def test_known_targets_must_be_exact():
    assert known_queues(("cuda:sm_90", "cpu:avx512")) == {"cuda.sm_90", "cpu.avx512"}
    with pytest.raises(ValueError, match="TORCHFARM_KNOWN_TARGETS"):
        known_queues(("cuda",))
