"""`torchfarm up` and `torchfarm status` as a user runs them, as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.supervisor import descendants
from localfarm.stack import free_port
from torchfarm.trust import trustfile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TORCHFARM = [sys.executable, "-m", "cli"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_up_prints_address_serves_status_and_stops_clean():
    port = free_port()
    proc = subprocess.Popen(
        [*TORCHFARM, "up", "--grpc-port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        # The workers inherit the environment: no warm-up, which this test is not about.
        env={
            **os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "TORCHFARM_WARMUP": "0",
        },
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and "farm ready" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "torchfarm up exited early"
        assert f"farm ready at grpc://127.0.0.1:{port}" in line

        # Its signing key is where an SDK of this user looks for it, for that address only.
        published = trustfile.path_for(f"127.0.0.1:{port}")
        assert f"signing key published in {published}" in proc.stdout.readline()
        assert published.stat().st_mode & 0o777 == 0o600
        assert len(json.loads(published.read_text())) == 1
        # Another user or machine is told which file to copy and pin.
        told = ""
        while "TORCHFARM_TRUSTED_KEYS_FILE" not in told:
            told = proc.stdout.readline()
            assert told, "torchfarm up did not say where its pins are"
        pins = Path(told.split("copy ", 1)[1].split(" and set", 1)[0])
        assert json.loads(pins.read_text()) == json.loads(published.read_text())

        remote = f"grpc://127.0.0.1:{port}"
        out = subprocess.run(
            [*TORCHFARM, "status", "--remote", remote, "--json"],
            capture_output=True, text=True, check=True,
        )
        status = json.loads(out.stdout)
        # The worker serves this machine's own exact target (torchfarm/wire/routing.py).
        assert [w["queue"].split(".")[0] for w in status["workers"]] == ["cpu"]
        assert [t["jobs"] for t in status["workers"][0]["targets"]] == [["graph"]]
        table = subprocess.run(
            [*TORCHFARM, "status", "--remote", remote], capture_output=True, text=True, check=True
        ).stdout
        assert "WORKER" in table and "cpu" in table

        family = descendants(proc.pid)
        assert len(family) >= 3  # redis-server, coordinator, worker (+ its pool)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        time.sleep(0.5)
        assert [p for p in family if alive(p)] == []
        assert not published.exists()  # withdrawn: whoever binds the port next is no one we pinned
    finally:
        if proc.poll() is None:
            proc.kill()


def test_status_of_a_farm_that_is_down_fails_clearly():
    out = subprocess.run(
        [*TORCHFARM, "status", "--remote", f"grpc://127.0.0.1:{free_port()}", "--timeout", "1"],
        capture_output=True, text=True,
    )
    assert out.returncode == 1
    assert "UNAVAILABLE" in out.stderr or "DEADLINE_EXCEEDED" in out.stderr
