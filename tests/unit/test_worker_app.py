"""A worker's Celery app is built from a settings object (workers/factory.py): two apps
in one process each run their tasks and signal receivers with their own settings and
serving plan. Celery runs the tasks in-process (`apply`): no server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import signals
from celery.exceptions import TimeLimitExceeded

from torchfarm.storage.store import JobState
from torchfarm.wire import targets
from torchfarm.wire.routing import COMPILE_TASK, KERNEL_TASK
from workers.serving import ServingPlan
from workers.settings import WorkerSettings


def _settings(name: str, kernel_limit_s: int) -> WorkerSettings:
    # Nothing here connects: Redis clients connect on their first command.
    return WorkerSettings(
        name=name, broker_url="redis://127.0.0.1:1/0", cache_url="redis://127.0.0.1:1/1",
        sandbox="off", warmup=False, installed_op_modules=(), failed_ttl_s=kernel_limit_s * 10,
        kernel_soft_time_limit_s=kernel_limit_s,
    )


PLANS = {
    "a": ServingPlan(graph=(targets.parse("cpu:avx2"),), kernel=(targets.parse("cuda:sm_80"),), build="aaaaaa"),
    "b": ServingPlan(graph=(targets.parse("cuda:sm_90"),), kernel=(targets.parse("cuda:sm_90"),), build="bbbbbb"),
}


@pytest.fixture(scope="module")
def apps():
    from workers.factory import create_app

    settings = {"a": _settings("a", 60), "b": _settings("b", 90)}
    return {n: create_app(settings[n], PLANS[n]) for n in "ab"}, settings


def test_each_app_has_its_own_tasks_with_its_own_limits(apps):
    built, settings = apps
    a, b = built["a"].tasks, built["b"].tasks
    assert a[COMPILE_TASK] is not b[COMPILE_TASK]
    assert (a[KERNEL_TASK].soft_time_limit, b[KERNEL_TASK].soft_time_limit) == (60, 90)


def test_each_task_runs_with_its_own_settings_and_plan(apps, monkeypatch):
    from workers import tasks

    built, settings = apps
    seen: dict[str, object] = {}

    def in_stack_room(fn, key, ctx, *args):
        seen[key] = ctx

    monkeypatch.setattr(tasks, "in_stack_room", in_stack_room)
    for n in "ab":
        for task in (COMPILE_TASK, KERNEL_TASK):
            result = built[n].tasks[task].apply(args=[f"{n}-{task}"])
            assert result.successful(), result.traceback
    for n in "ab":
        graph, kernel = seen[f"{n}-{COMPILE_TASK}"], seen[f"{n}-{KERNEL_TASK}"]
        assert graph.settings is settings[n] and graph.name == n
        (target,) = PLANS[n].graph
        assert (graph.fingerprint.device, graph.fingerprint.arch) == (target.device, target.arch)
        assert kernel.name == n and kernel.targets == {str(t) for t in PLANS[n].kernel}


def test_each_app_consumes_its_own_plans_queues(apps):
    built, _ = apps
    for n in "ab":
        worker = SimpleNamespace(app=built[n])  # what Celery's worker hands the signal
        signals.celeryd_after_setup.send(sender=f"{n}@host", instance=worker, conf=built[n].conf)
    for n in "ab":
        assert sorted(built[n].amqp.queues.consume_from) == sorted(PLANS[n].queues)


class FakeStore:
    def __init__(self) -> None:
        self.failed: list[tuple] = []

    def tenant(self, namespace: str) -> FakeStore:
        return self

    def get_job(self, key: str):
        return SimpleNamespace(state=JobState.RUNNING)

    def fail_job(self, key: str, code: str, message: str, ttl_s: int) -> None:
        self.failed.append((key, code, ttl_s))


def test_a_task_killed_at_the_hard_limit_fails_its_job_in_its_own_workers_store(apps, monkeypatch):
    built, settings = apps
    stores = {n: FakeStore() for n in "ab"}
    monkeypatch.setattr("workers.hard_limits.main_store", lambda s: stores[s.name])
    signals.task_failure.send(sender=built["b"].tasks[COMPILE_TASK], task_id="t",
                              exception=TimeLimitExceeded(960), args=["k1", ""], kwargs={})
    assert stores["a"].failed == []
    assert stores["b"].failed == [("k1", "COMPILE_TIMEOUT", settings["b"].failed_ttl_s)]
