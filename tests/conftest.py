"""Shared fixtures: a real redis-server, and the embedded local stack.

Fixtures chain: redis server → Store (flushed before and after each test); local
stack (redis-server + coordinator + Celery workers, free loopback ports) → address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchfarm.stack import LocalStack, free_port, _redis_server  # noqa: E402
from torchfarm.store import Store  # noqa: E402


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free loopback port, for the whole session."""
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/1"
    store = Store.from_url(url)
    for _ in range(200):
        try:
            store.r.ping()
            break
        except Exception:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def store(redis_url):
    s = Store.from_url(redis_url)
    s.r.flushall()
    yield s
    s.r.flushall()


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The embedded local stack with one CPU worker, shared by the integration tests."""
    workdir = tmp_path_factory.mktemp("stack")
    with LocalStack(workers=1, workdir=workdir) as s:
        # SDK calls in this process and in the processes tests start pin the stack's
        # signing key, so every end-to-end load verifies a signature.
        saved = os.environ.get("TORCHFARM_TRUSTED_KEYS_FILE")
        os.environ["TORCHFARM_TRUSTED_KEYS_FILE"] = str(s.trusted_keys_file)
        try:
            yield s
        finally:
            if saved is None:
                os.environ.pop("TORCHFARM_TRUSTED_KEYS_FILE", None)
            else:
                os.environ["TORCHFARM_TRUSTED_KEYS_FILE"] = saved


@pytest.fixture
def client_cache_dir(tmp_path, monkeypatch):
    """An empty Inductor cache dir for this test's client process."""
    d = tmp_path / "client-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(d))
    return d


def run_python(code: str, env: dict[str, str], python: str = sys.executable, timeout: float = 600):
    """Runs `code` in a fresh interpreter with ROOT on sys.path; returns the completed process."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [python, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where torch sees a CUDA (or ROCm) device; elsewhere
    they are skipped with the reason, before any fixture starts."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
