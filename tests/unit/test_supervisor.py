"""`torchfarm up`'s supervisor (cli/supervisor.py) with real child processes:
a child that dies is reaped and restarted within the bound, and past it the farm stops
with the child's exit status and last log lines."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from cli import launch
from cli.supervisor import ChildFailed, Supervisor, descendants


def child(tmp_path: Path, script: str):
    log = tmp_path / "child.log"
    return (lambda: launch.spawn(["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, log)), log


def test_a_dead_child_is_restarted_then_the_farm_stops_with_its_log(tmp_path):
    start, log = child(tmp_path, "echo started; echo 'the cause'; exit 3")
    out = io.StringIO()
    sup = Supervisor(max_restarts=2, window_s=60, out=out)
    sup.start("coordinator", start, log)
    with pytest.raises(ChildFailed) as failed:
        sup.run(threading.Event(), poll_s=0.05)
    assert out.getvalue().count("coordinator exited with status 3; restarting it") == 2
    message = str(failed.value)
    assert message.startswith("coordinator exited with status 3 (2 restarts in the last 60s)")
    assert message.rstrip().endswith("the cause") and log.read_text().count("started") == 3
    assert sup.children["coordinator"].proc.returncode == 3  # reaped: no zombie


def test_restarts_older_than_the_window_do_not_count(tmp_path):
    start, log = child(tmp_path, "exit 1")
    sup = Supervisor(max_restarts=1, window_s=0.0, out=io.StringIO())
    sup.start("worker0", start, log)
    for _ in range(4):  # each death is alone in its window: restarted every time
        sup.children["worker0"].proc.wait()
        sup.check()


def test_a_child_killed_while_the_farm_starts_is_not_restarted(tmp_path):
    start, log = child(tmp_path, "sleep 30")
    sup = Supervisor(out=io.StringIO())
    sup.start("redis", start, log)
    sup.alive()
    sup.children["redis"].proc.kill()
    sup.children["redis"].proc.wait()
    with pytest.raises(ChildFailed, match="redis was killed by signal 9 while the farm started"):
        sup.alive()


def test_what_a_dead_child_left_in_its_group_ends_with_it(tmp_path):
    # A killed Celery worker leaves its pool process, which wrote tracebacks into the
    # log the farm's error quotes, and ran on with nothing to serve.
    start, log = child(tmp_path, "(while :; do echo left over; sleep 0.05; done) & echo 'the cause'; exit 3")
    sup = Supervisor(max_restarts=0, out=io.StringIO())
    sup.start("worker0", start, log)
    group = sup.children["worker0"].proc.pid
    try:
        with pytest.raises(ChildFailed):
            sup.run(threading.Event(), poll_s=0.05)
        size = log.stat().st_size
        time.sleep(0.3)
        assert log.stat().st_size == size, "something the dead child started still writes its log"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def test_stop_ends_what_a_child_left_outside_its_group(tmp_path):
    # setsid: a grandchild in a session of its own, as a worker's sandbox server is.
    start, log = child(tmp_path, "setsid sleep 60 & wait")
    sup = Supervisor(out=io.StringIO(), left_over_grace_s=0.2)
    sup.start("worker0", start, log)
    proc = sup.children["worker0"].proc
    for _ in range(100):
        if family := descendants(proc.pid):
            break
        threading.Event().wait(0.05)
    assert family
    sup.stop(["worker0"], timeout_s=5)
    for _ in range(100):
        if not [pid for pid in family if _running(pid)]:
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"{[pid for pid in family if _running(pid)]} outlived the stop")


def test_stop_waits_for_what_ends_on_its_own_before_calling_it_left_over(tmp_path, caplog):
    # A sandbox server ends when its worker's pipe closes, a moment after the worker:
    # a normal stop, which must not read as something gone wrong.
    start, log = child(tmp_path, "setsid sleep 0.5 & wait")
    sup = Supervisor(out=io.StringIO())
    sup.start("worker0", start, log)
    proc = sup.children["worker0"].proc
    for _ in range(100):
        if descendants(proc.pid):
            break
        threading.Event().wait(0.05)
    with caplog.at_level("WARNING", logger="cli.supervisor"):
        sup.stop(["worker0"], timeout_s=5)
    assert "outlived" not in caplog.text


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
