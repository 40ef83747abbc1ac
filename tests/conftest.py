"""Shared fixtures: a real redis-server, and the embedded local stack.

Fixtures chain: redis server → Store (flushed before and after each test); local
stack (redis-server + coordinator + Celery workers, free loopback ports) → address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Every stack a test starts publishes its signing key in the per-user trust directory
# (torchfarm/trustfile.py), and every SDK here reads it: keep both off the real home,
# for this process and every process it starts.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="torchfarm-test-config-")

from torchfarm.testing.stack import LocalStack, free_port, start_redis_server  # noqa: E402
from torchfarm.store import Store  # noqa: E402


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free loopback port, for the whole session."""
    port = free_port()
    proc = start_redis_server(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/1"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def store(redis_url):
    s = Store.from_url(redis_url)
    s.r.flushall()
    yield s
    s.r.flushall()


@pytest.fixture(scope="session")
def worker_caches(tmp_path_factory):
    """One root for the Inductor caches of the stacks whose tests compile the same
    models and are not about a cold worker cache (LocalStack.cache_root): worker i of
    each finds the kernels worker i of an earlier one built. Two workers of one stack
    still never share a cache."""
    return tmp_path_factory.mktemp("worker-caches")


@pytest.fixture(scope="session")
def session_stack(tmp_path_factory, worker_caches):
    """The embedded local stack with one CPU worker, shared by the integration tests.
    Its worker skips the warm-up, as most test stacks' do: on a loaded machine the
    warm-up kept it from registering within the start timeout. The stack of
    tests/faults/test_worker_faults.py warms up, and a test there checks it did."""
    workdir = tmp_path_factory.mktemp("stack")
    with LocalStack(workers=1, workdir=workdir, cache_root=worker_caches, warmup=False) as s:
        yield s


@pytest.fixture
def stack(session_stack, monkeypatch):
    """The shared stack, with its signing key pinned in this test's environment, so SDK
    calls here and in the processes the test starts verify every artifact's signature.
    Set per test, not for the session: other stacks sign with keys of their own."""
    monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(session_stack.trusted_keys_file))
    return session_stack


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
