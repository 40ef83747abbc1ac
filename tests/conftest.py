"""Shared fixtures: a real redis-server, and the embedded local stack.

Fixtures chain: redis server → Store (flushed before and after each test); local
stack (redis-server + coordinator + Celery workers, free loopback ports) → address.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Every stack a test starts publishes its signing key in the per-user trust directory
# (torchfarm/trust/trustfile.py), and every SDK here reads it: keep both off the real home,
# for this process and every process it starts.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="torchfarm-test-config-")
# The suite's stacks build C++ kernels in the worker process (TORCHFARM_SANDBOX=off): a
# sandboxed build starts a child that imports torch and builds Inductor's precompiled
# header again for every kernel batch, which multiplies the suite's cold compiles.
# tests/integration/test_sandbox.py runs the sandbox itself, and test-deploy's workers
# compile under bubblewrap.
os.environ.setdefault("TORCHFARM_SANDBOX", "off")

from localfarm.stack import (  # noqa: E402
    INDUCTOR_SEED_ENV,
    LocalStack,
    free_port,
    start_redis_server,
)
from torchfarm.storage.store import Store  # noqa: E402

# Every worker of every stack here starts with the vector-ISA probe's test programs in
# its fresh Inductor cache dir, built once for the session by the first stack that
# starts (`seed_isa_probe`), as a worker restarted on its own machine finds them. The
# tests of the probe itself run it in cache dirs of their own.
if INDUCTOR_SEED_ENV not in os.environ:  # pytest-xdist's workers share their controller's
    os.environ[INDUCTOR_SEED_ENV] = tempfile.mkdtemp(prefix="torchfarm-test-isa-probe-")
    atexit.register(shutil.rmtree, os.environ[INDUCTOR_SEED_ENV], ignore_errors=True)


@pytest.fixture
def no_waiting(monkeypatch):
    """An answer "at once" is one that never sleeps: any wait fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the call waited; it should have answered at once")
    monkeypatch.setattr(asyncio, "sleep", refuse)
    monkeypatch.setattr(time, "sleep", refuse)


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
def session_stack(tmp_path_factory):
    """The embedded local stack with one CPU worker, shared by the integration tests.
    Its worker skips the warm-up, as most test stacks' do: on a loaded machine the
    warm-up kept it from registering within the start timeout. The stack of
    tests/faults/test_worker_faults.py warms up, and a test there checks it did. It has
    no custom-op setting: transformers' ops load by default where it is installed."""
    workdir = tmp_path_factory.mktemp("stack")
    with LocalStack(workers=1, workdir=workdir, warmup=False) as s:
        yield s


@pytest.fixture
def stack(session_stack, monkeypatch):
    """The shared stack, with its signing key pinned in this test's environment, so SDK
    calls here and in the processes the test starts verify every artifact's signature.
    Set per test, not for the session: other stacks sign with keys of their own."""
    monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(session_stack.trusted_keys_file))
    return session_stack


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server on a free loopback port, for the whole session; boto3 in this
    process and in the stacks it starts signs with moto's test credentials."""
    pytest.importorskip("boto3")
    from localfarm.s3 import CREDENTIALS, start_moto_server

    port = free_port()
    proc = start_moto_server(port, tmp_path_factory.mktemp("moto") / "moto.log")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in CREDENTIALS.items():
            mp.setenv(name, value)
        yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def s3_blob_url(s3_endpoint):
    """A bucket on the moto server, as the blob URL a farm is configured with."""
    from localfarm.s3 import make_bucket

    make_bucket(s3_endpoint, "torchfarm-test")
    return f"s3://torchfarm-test/farm?endpoint={s3_endpoint}"


@pytest.fixture(scope="session")
def session_s3_stack(tmp_path_factory, s3_blob_url):
    """A local stack that keeps its blobs in S3 (moto), the manifests in its Redis. Its
    worker skips the warm-up, as session_stack's does."""
    workdir = tmp_path_factory.mktemp("s3stack")
    with LocalStack(workers=1, workdir=workdir, blob_url=s3_blob_url, warmup=False) as s:
        yield s


@pytest.fixture(params=["redis", "s3"])
def any_stack(request, monkeypatch):
    """The shared stack, once with blobs in Redis and once with blobs in S3."""
    s = request.getfixturevalue("session_stack" if request.param == "redis" else "session_s3_stack")
    monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(s.trusted_keys_file))
    monkeypatch.setenv("TORCHFARM_BLOB_CACHE_DIR", str(request.getfixturevalue("tmp_path") / "blobs"))
    return s


@pytest.fixture
def compiling_farm(tmp_path, monkeypatch):
    """A farm in this process (localfarm/fakes.py) whose inline worker compiles, with an
    Inductor cache of its own; Dynamo is reset around the test."""
    import torch

    from localfarm.fakes import InProcessFarm

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    farm = InProcessFarm()
    farm.register_worker()
    torch._dynamo.reset()
    yield farm
    torch._dynamo.reset()


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


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_between_modules():
    """Finalizers of a module's gRPC and asyncio objects run here, not in the middle of a
    later `ast.parse` (pytest's assertion rewriting): CPython 3.11.7 raises "AST
    constructor recursion depth mismatch" when a collection runs Python finalizers
    during AST construction."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _no_default_device_left_set():
    """A test that leaves `torch.set_default_device` set (or any torch-function mode on the
    stack) changes the graphs Dynamo records in every later test of its process: under a
    `DeviceContext` `x + y` becomes the method `add`, so a later test's key differs from
    the one it would have alone. The mode is cleared and the test that left it fails."""
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from torch.overrides import _get_current_function_mode_stack

    left = _get_current_function_mode_stack()
    if left:
        torch.set_default_device(None)
        pytest.fail(f"the test left torch-function modes active: {left}", pytrace=False)
