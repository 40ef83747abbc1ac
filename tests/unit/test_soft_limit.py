"""workers/limits.py's `SoftLimitNote`: it wraps the pool's soft-limit handler at a
task's start, notes when the limit fires, and forgets it at the next task's start."""

from __future__ import annotations

import os
import signal

import pytest

from workers.limits import SOFT_LIMIT_SIGNAL, SoftLimitNote


class _Limit(Exception):
    """Stands in for billiard's SoftTimeLimitExceeded."""


def _pool_handler(signum, frame):
    raise _Limit()


@pytest.fixture
def pool_handler():
    """This process's handler for the signal replaced by the pool's, as billiard
    installs it in a pool process, and put back afterwards."""
    old = signal.signal(SOFT_LIMIT_SIGNAL, _pool_handler)
    yield
    signal.signal(SOFT_LIMIT_SIGNAL, old)


def test_the_limit_fired_in_this_task_and_not_in_the_next(pool_handler):
    note = SoftLimitNote()
    note.task_started()
    assert not note.fired
    with pytest.raises(_Limit):  # the pool's handler still raises its exception
        os.kill(os.getpid(), SOFT_LIMIT_SIGNAL)
    assert note.fired
    note.task_started()
    assert not note.fired


def test_the_handler_is_wrapped_once(pool_handler):
    note = SoftLimitNote()
    note.task_started()
    wrapped = signal.getsignal(SOFT_LIMIT_SIGNAL)
    note.task_started()
    assert signal.getsignal(SOFT_LIMIT_SIGNAL) is wrapped is not _pool_handler


def test_a_default_disposition_is_left_alone():
    old = signal.signal(SOFT_LIMIT_SIGNAL, signal.SIG_IGN)
    try:
        SoftLimitNote().task_started()
        assert signal.getsignal(SOFT_LIMIT_SIGNAL) is signal.SIG_IGN
    finally:
        signal.signal(SOFT_LIMIT_SIGNAL, old)
