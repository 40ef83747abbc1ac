"""sdk/wake.py: a submit the farm answers NO_WORKER is retried while a pool starts."""

from __future__ import annotations

import logging

import pytest

from sdk import wake
from sdk.errors import FarmUnavailable, NoWorker, Unauthenticated
from sdk.progress import GraphTrack
from sdk.settings import SDKSettings
from torchfarm.wire.codes import Reason


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _submitter(failures: int):
    calls = []

    def submit():
        calls.append(1)
        if len(calls) <= failures:
            raise NoWorker("submit: no live worker compiles graphs for target cpu:avx2", Reason.NO_WORKER)
        return "reply"
    return submit, calls


def test_a_pool_that_starts_within_the_bound_gets_the_graph(caplog):
    clock, (submit, calls) = Clock(), _submitter(failures=4)
    track = GraphTrack(index=1, key="k", started=0.0)
    with caplog.at_level(logging.WARNING, logger="sdk.wake"):
        out = wake.submit_waking(submit, SDKSettings(wake_timeout_s=60), track, clock.sleep, clock)
    assert out == "reply" and len(calls) == 5
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0], "backoff doubles"
    assert track.stage == "waiting for a worker"
    assert len([r for r in caplog.records if "waiting up to" in r.getMessage()]) == 1, "one warning, not one per try"


def test_past_the_bound_the_no_worker_error_stands():
    clock, (submit, calls) = Clock(), _submitter(failures=1000)
    with pytest.raises(FarmUnavailable) as e:
        wake.submit_waking(submit, SDKSettings(wake_timeout_s=20), None, clock.sleep, clock)
    assert isinstance(e.value, NoWorker) and e.value.code == Reason.NO_WORKER
    assert sum(clock.sleeps) <= 20 and len(calls) > 3


def test_a_zero_bound_falls_back_at_once():
    clock, (submit, calls) = Clock(), _submitter(failures=1)
    with pytest.raises(FarmUnavailable):
        wake.submit_waking(submit, SDKSettings(wake_timeout_s=0), None, clock.sleep, clock)
    assert len(calls) == 1 and clock.sleeps == []


@pytest.mark.parametrize("error", [FarmUnavailable("coordinator down", Reason.BACKEND_UNAVAILABLE),
                                   Unauthenticated("bad token", Reason.UNAUTHENTICATED)])
def test_other_errors_are_not_retried_here(error):
    clock, calls = Clock(), []

    def submit():
        calls.append(1)
        raise error
    with pytest.raises(type(error)):
        wake.submit_waking(submit, SDKSettings(wake_timeout_s=60), None, clock.sleep, clock)
    assert len(calls) == 1
