"""A pool scaled to zero is woken by the job it should take: the coordinator queues a
graph job for a known target (configured, or served by a worker within the window)
even while no worker for it is live, against a real redis-server."""

from __future__ import annotations

import asyncio
import time

import pytest

from cli.main import main
from localfarm.fakes import InlineDispatcher
from services.coordinator.errors import NoWorker
from services.coordinator.farm import Farm, known_queues
from services.coordinator.settings import CoordinatorSettings
from tests.requests import queue_of
from tests.targets.test_farm_routing import fleet, gpu_request  # noqa: F401
from torchfarm.storage.store import JobState
from torchfarm.wire import builds, routing, targets
from torchfarm.wire.codes import Reason
from workers import gpu_probe, serving
from workers.settings import WorkerSettings

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
    assert known_queues(("cuda:sm_90", "cpu:avx512")) == {"cuda.sm_90": frozenset(), "cpu.avx512": frozenset()}
    with pytest.raises(ValueError, match="TORCHFARM_KNOWN_TARGETS"):
        known_queues(("cuda",))


def _of_build(req, torch_version):
    req.build.torch_version = torch_version
    return req


def test_a_made_up_build_of_a_known_target_is_refused(fleet):
    """A tenant's jobs for a build no worker of the target ever ran would wait for a pool
    that cannot take them, and a queue-depth autoscaler summing the target's queues would
    start GPU pods for them: refused, naming the builds the target's workers ran."""
    fleet.forget_worker("h100-1")
    farm = Farm(CoordinatorSettings(known_targets=("cuda:sm_90",)), fleet, InlineDispatcher())
    with pytest.raises(NoWorker, match=r"9\.9\.9-made-up.*b" + builds.digest(builds.of_request(gpu_request("sm_90")))) as e:
        _submit(farm, _of_build(gpu_request("sm_90"), "9.9.9-made-up"))
    assert e.value.reason is Reason.BUILD_NOT_SERVED
    assert farm.dispatcher.sent == []


def test_a_known_target_queues_the_builds_its_workers_ran_beyond_the_window(fleet):
    fleet.forget_worker("h100-1")
    farm = Farm(CoordinatorSettings(known_targets=("cuda:sm_90",), known_target_window_s=0), fleet, InlineDispatcher())
    req = gpu_request("sm_90")
    assert _submit(farm, req).state == JobState.QUEUED
    assert [t.queue for t in farm.dispatcher.sent] == [queue_of(req)]


def test_a_known_target_with_its_builds_named_queues_those_alone(fleet):
    """Before any worker of the target ran, its first job has to wake the pool: a target
    named with its pool's builds queues those builds' jobs and no other."""
    ours = gpu_request("sm_80")
    digest = builds.digest(builds.of_request(ours))
    farm = Farm(CoordinatorSettings(known_targets=(f"cuda:sm_80@b{digest}",)), fleet, InlineDispatcher())
    assert _submit(farm, ours).state == JobState.QUEUED
    with pytest.raises(NoWorker, match="9.9.9-made-up") as e:
        _submit(farm, _of_build(gpu_request("sm_80"), "9.9.9-made-up"))
    assert e.value.reason is Reason.BUILD_NOT_SERVED
    assert [t.queue for t in farm.dispatcher.sent] == [queue_of(ours)]


def test_known_targets_name_builds_by_digest():
    assert known_queues(("cuda:sm_90@3f9c21", "cuda:sm_90@b00aa11", "cpu:avx512")) == {
        "cuda.sm_90": frozenset({"3f9c21", "00aa11"}), "cpu.avx512": frozenset(),
    }
    for bad in ("cuda:sm_90@", "cuda:sm_90@3f9c2", "cuda:sm_90@torch-2.13"):
        with pytest.raises(ValueError, match="TORCHFARM_KNOWN_TARGETS.*digest"):
            known_queues((bad,))


def test_a_known_target_whose_pool_changed_build_queues_the_new_build_alone(fleet, monkeypatch):
    """After the pool's image changed, the old build's clients are answered at once, not
    queued for a pool that will not run their build again."""
    old, new = _of_build(gpu_request("sm_90"), "2.12.0"), gpu_request("sm_90")
    two_hours_ago = time.time() - 7200
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: two_hours_ago)
        fleet.heartbeat("h100-old", [queue_of(old)], "b", 30, targets={"cuda:sm_90": ["graph"]},
                        fingerprint=builds.of_request(old))
    fleet.forget_worker("h100-old")
    fleet.forget_worker("h100-1")
    farm = Farm(CoordinatorSettings(known_targets=("cuda:sm_90",), known_target_window_s=1800), fleet, InlineDispatcher())
    assert _submit(farm, new).state == JobState.QUEUED
    with pytest.raises(NoWorker, match="2.12.0") as e:
        _submit(farm, old)
    assert e.value.reason is Reason.BUILD_NOT_SERVED


def test_a_pools_known_targets_line_names_the_queue_its_workers_serve(monkeypatch, capsys):
    """What an operator names a pool that never ran by: `torchfarm worker --known-targets`
    in its image, on one of its nodes (here a faked sm_90 one)."""
    monkeypatch.setattr(gpu_probe, "accelerator", lambda: targets.parse("cuda:sm_90"))
    monkeypatch.setenv("TORCHFARM_TARGETS", "local")
    assert main(["worker", "--known-targets"]) == 0
    line = capsys.readouterr().out.strip()
    plan = serving.plan_for(WorkerSettings(targets=("local",)))
    assert line == f"cuda:sm_90@b{plan.build}"
    ((target, named),) = known_queues((line,)).items()
    assert routing.queue_name(routing.target_of_queue(target), routing.GRAPH, *named) in plan.queues
