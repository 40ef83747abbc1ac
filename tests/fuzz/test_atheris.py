"""Runs the atheris harness for a bounded time where atheris is installed (skipped
elsewhere: it is an optional extra, `pip install -e '.[fuzz]'`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HARNESS = Path(__file__).with_name("atheris_graph.py")


def test_atheris_finds_nothing_in_30_seconds(tmp_path):
    pytest.importorskip("atheris")
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "-max_total_time=30", "-rss_limit_mb=4096", str(tmp_path / "corpus")],
        capture_output=True, text=True, timeout=300,
    )
    tail = proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert "Done" in tail, tail
