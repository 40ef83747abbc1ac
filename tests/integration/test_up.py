"""`torchfarm up` as a product, through the real command and its real children: it
restarts a child that dies, stops loudly past the bound, and with --data-dir keeps
Redis's data, the logs and the signing key across runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cli.supervisor import TAIL_LINES
from localfarm.stack import free_port
from tests.integration.test_cli import alive, descendants

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TORCHFARM = [os.path.join(os.path.dirname(sys.executable), "torchfarm")]


def start_up(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*TORCHFARM, "up", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TORCHFARM_WARMUP": "0"},  # the workers' warm-up is not tested here
    )
    deadline = time.monotonic() + 180
    line = ""
    while "farm ready" not in line:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "torchfarm up exited early"
        assert time.monotonic() < deadline, "torchfarm up not ready"
    return proc


def child_pid(up: subprocess.Popen, needle: str) -> int:
    """The child of `up` (not a grandchild: a Celery pool process has its worker's command)."""
    for pid in descendants(up.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == up.pid and needle in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
        except OSError:
            pass
    raise AssertionError(f"no child running {needle}")


def read_until(proc: subprocess.Popen, text: str, timeout_s: float = 60) -> str:
    seen = ""
    deadline = time.monotonic() + timeout_s
    while text not in seen:
        line = proc.stdout.readline()
        assert line, f"output ended before {text!r}:\n{seen}"
        seen += line
        assert time.monotonic() < deadline, seen
    return seen


def status_ok(port: int) -> bool:
    out = subprocess.run([*TORCHFARM, "status", "--remote", f"grpc://127.0.0.1:{port}", "--timeout", "3"],
                         capture_output=True, text=True, timeout=60)
    return out.returncode == 0


def test_up_restarts_a_dead_coordinator_and_keeps_its_data_dir(tmp_path):
    data, port, redis_port = tmp_path / "farm", free_port(), free_port()
    up = start_up("--grpc-port", str(port), "--redis-port", str(redis_port), "--data-dir", str(data))
    try:
        password = (data / "keys" / "redis.password").read_text().strip()
        db = redis.Redis(port=redis_port, db=1, username="farm", password=password)
        db.set("tf:test:kept", b"across runs")
        with pytest.raises(redis.exceptions.NoPermissionError):  # another local user has no password
            redis.Redis(port=redis_port, db=1).get("tf:test:kept")
        pins = (data / "keys" / "trusted-keys.json").read_text()

        coordinator = child_pid(up, "services.coordinator.server")
        os.kill(coordinator, signal.SIGKILL)
        said = read_until(up, "restarting it")
        assert "coordinator was killed by signal 9; restarting it (1 of 3)" in said
        assert not alive(coordinator)  # reaped, not a zombie
        deadline = time.monotonic() + 60
        while not status_ok(port):
            assert time.monotonic() < deadline, "the restarted coordinator does not answer"
            time.sleep(1)

        family = descendants(up.pid)
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0
        assert [p for p in family if alive(p)] == []
    finally:
        if up.poll() is None:
            up.kill()
    assert (data / "logs" / "coordinator.log").read_text().count("coordinator serving on") == 2

    up = start_up("--grpc-port", str(port), "--redis-port", str(redis_port), "--data-dir", str(data))
    try:
        # The password was kept with the data: the same one opens the kept Redis.
        db = redis.Redis(port=redis_port, db=1, username="farm", password=password)
        assert db.get("tf:test:kept") == b"across runs"
        assert (data / "keys" / "trusted-keys.json").read_text() == pins  # kept artifacts verify
        up.send_signal(signal.SIGTERM)
        assert up.wait(90) == 0
    finally:
        if up.poll() is None:
            up.kill()


def test_up_stops_loudly_when_a_child_dies_past_the_bound(tmp_path):
    port, data = free_port(), tmp_path / "farm"
    up = start_up("--grpc-port", str(port), "--max-restarts", "0", "--data-dir", str(data))
    try:
        family = descendants(up.pid)
        os.kill(child_pid(up, "workers.app"), signal.SIGKILL)
        rest = up.communicate(timeout=120)[0]
        assert up.returncode == 1
        said, tail = rest.split("Last lines of ", 1)
        assert "torchfarm up: worker0 was killed by signal 9 (0 restarts in the last 300s); the farm stops" in said
        assert "Traceback" not in said
        # The worker's own log, to its end: what the dead worker left in its group (its
        # pool process) was stopped with it and wrote nothing after.
        logfile = data / "logs" / "worker0.log"
        assert tail.startswith(f"{logfile}:")
        assert "\n".join(logfile.read_text().splitlines()[-TAIL_LINES:]) in tail
        assert "cpu0@" in logfile.read_text()
        time.sleep(0.5)
        assert [p for p in family if alive(p)] == []
    finally:
        if up.poll() is None:
            up.kill()
