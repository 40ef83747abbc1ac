"""scripts/gpu_carry.sh packs what a lent GPU machine lacks (docs/gpu.md): the farm's
Python 3.12 dependencies and a redis-server that runs through the links the bench makes
to it. Downloads from PyPI; the GPU run itself is scripts/gpu_run.sh, on the machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server to carry")
def test_the_carry_holds_python_312_packages_and_a_redis_server_that_runs_through_a_link(tmp_path):
    out = tmp_path / "carry"
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_carry.sh"), str(out)], cwd=ROOT,
                          env={**os.environ, "PYTHON": str(ROOT / ".venv" / "bin" / "python")},
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    packed = out / "carry.tgz"
    assert packed.stat().st_size < 64 << 20  # what the device tool carries, in all
    assert os.access(out / "run.sh", os.X_OK)
    with tarfile.open(packed) as tar:
        tar.extractall(tmp_path / "there", filter="tar")
    site = tmp_path / "there" / "site"
    for package in ("celery", "redis", "kombu", "billiard", "cryptography", "grpc", "rich", "pytest"):
        assert (site / package).is_dir(), package
    assert list((site / "grpc" / "_cython").glob("cygrpc.cpython-312-*.so"))
    assert not list(site.rglob("*.pyc"))  # compiled by this machine's Python: useless there
    link = tmp_path / "redis-bin" / "redis-server"  # as bench/gpu_bench.py names it
    link.parent.mkdir()
    link.symlink_to(tmp_path / "there" / "bin" / "redis-server")
    version = subprocess.run([str(link), "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("Redis server"), version.stderr
