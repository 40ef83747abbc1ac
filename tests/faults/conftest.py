"""Fault tests run real processes on loopback (redis-server, the coordinator, Celery
workers), break them on purpose, and record what they measured (printed with -s)."""

from __future__ import annotations

import json

import pytest

from tests.faults.farmkit import FIGURES


@pytest.fixture(scope="session", autouse=True)
def _report_figures():
    yield
    if FIGURES:
        print("\nfault test figures:\n" + json.dumps(FIGURES, indent=2, sort_keys=True))
