"""A task that loses its Redis or broker connection (a Sentinel failover longer than the
clients' own retries) runs again instead of dying with its job RUNNING; a compile's own
error is not retried. Celery runs the task in-process (`apply`): no server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from torchfarm.celeryconf import PUBLISH_RETRY_POLICY, make_celery
from torchfarm.wire.routing import COMPILE_TASK, KERNEL_TASK, LOWER_TASK


def _flaky(monkeypatch, error: BaseException | None, failures: int) -> tuple[list, Celery]:
    """A worker app whose job functions fail `failures` times with `error`, and their calls."""
    from workers import tasks
    from workers.serving import ServingPlan
    from workers.settings import WorkerSettings
    from workers.worker import Worker

    calls: list = []

    def in_stack_room(fn, key, ctx, *args):
        calls.append(key)
        if error is not None and len(calls) <= failures:
            raise error

    monkeypatch.setattr(tasks, "in_stack_room", in_stack_room)
    worker = Worker(WorkerSettings(sandbox="off"), ServingPlan(graph=(), kernel=()), "off")
    app = make_celery("redis://127.0.0.1:1/0")
    # Contexts the patched job functions never read: nothing is built, nothing connects.
    tasks.register(app, worker, contexts=SimpleNamespace(graph=None, kernel=None))
    return calls, app


@pytest.mark.parametrize("error", [redis.ConnectionError("primary gone"), OperationalError("broker gone")])
@pytest.mark.parametrize("task_name", [COMPILE_TASK, LOWER_TASK, KERNEL_TASK])
def test_a_task_that_lost_its_connection_runs_again(monkeypatch, error, task_name):
    calls, app = _flaky(monkeypatch, error, failures=2)
    args = ["k1", "", "cpu"] if task_name == LOWER_TASK else ["k1"]
    result = app.tasks[task_name].apply(args=args)
    assert result.successful(), result.traceback
    assert calls == ["k1"] * 3


def test_a_compile_error_is_not_retried(monkeypatch):
    calls, app = _flaky(monkeypatch, ValueError("a bad graph"), failures=1)
    result = app.tasks[COMPILE_TASK].apply(args=["k1"])
    assert result.failed() and isinstance(result.result, ValueError)
    assert calls == ["k1"]


def test_a_lost_connection_that_stays_lost_ends_the_task(monkeypatch):
    calls, app = _flaky(monkeypatch, redis.ConnectionError("primary gone"), failures=100)
    task = app.tasks[COMPILE_TASK]
    result = task.apply(args=["k1"])
    assert result.failed() and isinstance(result.result, redis.ConnectionError)
    assert len(calls) == task.max_retries + 1


def test_sending_a_task_keeps_trying_for_longer_than_a_failover():
    policy = make_celery("redis://127.0.0.1:1/0").conf.task_publish_retry_policy
    assert policy == PUBLISH_RETRY_POLICY
    waits, wait = 0.0, float(policy["interval_start"])
    for _ in range(policy["max_retries"]):
        waits += wait
        wait = min(wait + policy["interval_step"], policy["interval_max"])
    assert waits > 30
