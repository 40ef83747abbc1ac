"""A task killed at Celery's hard time limit: its job must end FAILED, not show RUNNING
until its TTL (workers/hard_limits.py). A fake store: no server."""

from __future__ import annotations

from types import SimpleNamespace

from celery import signals
from celery.exceptions import TimeLimitExceeded

from torchfarm.storage.store import JobState
from torchfarm.wire import targets
from torchfarm.wire.routing import COMPILE_TASK, KERNEL_TASK


class FakeStore:
    def __init__(self, state: str):
        self.jobs = {("alice", "k1"): SimpleNamespace(state=state)}
        self.failed: list[tuple] = []
        self.namespace = ""

    def tenant(self, namespace: str) -> FakeStore:
        self.namespace = namespace
        return self

    def get_job(self, key: str):
        return self.jobs.get((self.namespace, key))

    def fail_job(self, key: str, code: str, message: str, ttl_s: int) -> None:
        self.failed.append((self.namespace, key, code, message, ttl_s))


def test_a_job_killed_at_the_hard_limit_ends_failed():
    from workers.hard_limits import fail_killed_job

    store = FakeStore(JobState.RUNNING)
    assert fail_killed_job(store, COMPILE_TASK, ["k1", "alice"], {}, 960, 60)
    (failed,) = store.failed
    assert failed[:3] == ("alice", "k1", "COMPILE_TIMEOUT") and "hard time limit (960s)" in failed[3]

    kernel = FakeStore(JobState.RUNNING)
    assert fail_killed_job(kernel, KERNEL_TASK, [], {"key": "k1", "namespace": "alice"}, 90, 60)
    assert kernel.failed[0][2] == "KERNEL_TIMEOUT"


def test_a_job_that_already_ended_is_left_alone():
    from workers.hard_limits import fail_killed_job

    done = FakeStore(JobState.SUCCEEDED)
    assert not fail_killed_job(done, COMPILE_TASK, ["k1", "alice"], {}, 960, 60)
    assert not done.failed


def test_the_worker_fails_the_job_when_celery_reports_a_hard_time_limit(monkeypatch):
    """What Celery's main process does at the hard limit: `task_failure` with TimeLimitExceeded."""
    from workers.factory import create_app
    from workers.serving import ServingPlan
    from workers.settings import WorkerSettings

    settings = WorkerSettings(broker_url="redis://127.0.0.1:1/0", sandbox="off", failed_ttl_s=60)
    app = create_app(settings, ServingPlan(graph=(), kernel=(targets.parse("cuda:sm_90"),)))
    store = FakeStore(JobState.RUNNING)
    monkeypatch.setattr("workers.hard_limits.main_store", lambda s: store if s is settings else None)
    task = app.tasks[COMPILE_TASK]
    signals.task_failure.send(sender=task, task_id="t", exception=ValueError("x"), args=["k1", "alice"], kwargs={})
    assert not store.failed  # an ordinary failure is the task's own business
    signals.task_failure.send(sender=task, task_id="t", exception=TimeLimitExceeded(960),
                              args=["k1", "alice"], kwargs={})
    assert [f[:3] for f in store.failed] == [("alice", "k1", "COMPILE_TIMEOUT")]
    assert store.failed[0][4] == 60
