"""The SDK's counters are optional: a client without prometheus_client (torch from its
image, then a plain `pip install torchfarm`) compiles, and counts nothing."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

NO_PROMETHEUS = """
import sys
sys.modules["prometheus_client"] = None  # as if not installed: its import fails
from sdk import metrics
from sdk.backend import FarmBackend
metrics.FALLBACKS.labels(error="FarmUnavailable").inc()
metrics.ARTIFACTS_REJECTED.labels(reason="digest").inc()
print("ok")
"""


def test_the_sdk_imports_and_counts_nothing_without_prometheus_client():
    proc = subprocess.run(
        [sys.executable, "-c", NO_PROMETHEUS], env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_with_prometheus_client_the_counters_count():
    from prometheus_client import REGISTRY

    from sdk.metrics import FALLBACKS

    before = REGISTRY.get_sample_value("torchfarm_sdk_fallbacks_total", {"error": "TestOnly"}) or 0.0
    FALLBACKS.labels(error="TestOnly").inc()
    assert REGISTRY.get_sample_value("torchfarm_sdk_fallbacks_total", {"error": "TestOnly"}) == before + 1
