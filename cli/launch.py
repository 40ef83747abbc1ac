"""How the farm's processes start on one machine: `torchfarm up`, and the test stack
(localfarm/stack.py), which starts them through these functions so that a test
farm runs exactly what `up` runs.

The commands are those of the shipped images (docker/*.Dockerfile): redis-server, the
coordinator as `python -m services.coordinator.server`, a Celery worker of
`workers.app`. Each child runs in its own session (process group), so that stopping it
also stops Celery's pool processes and Inductor's compile workers, and gets SIGTERM if
its parent dies, even by SIGKILL: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from torchfarm.files import write_atomic

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0
"""How long each process gets to exit after SIGTERM before it is killed."""


def die_with_parent(cmd: list[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM if the process that started it dies.

    util-linux's setpriv sets the parent-death signal and execs the command in place
    (same pid). Doing it in a preexec_fn instead is unsafe: the parent has gRPC threads,
    and Python code between fork and exec can then crash the child."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:`port` (a bind would fail)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def redis_server() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(path):
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    return path


@functools.cache  # `up` asks at its checks and again for the ACL file: one process
def redis_version() -> tuple[int, int]:
    """The installed redis-server's (major, minor), from `redis-server --version`
    ("Redis server v=7.0.15 ..."); (0, 0) where it says none."""
    out = subprocess.run([redis_server(), "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"\bv=(\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def redis_command(port: int, workdir: Path, *extra: str) -> list[str]:
    """redis-server on 127.0.0.1:`port`, persisting nothing, with `workdir` as its dir;
    `extra` options (`--appendonly yes`, `--maxmemory 64mb`) override those."""
    return [
        redis_server(), "--port", str(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", str(workdir), *extra,
    ]


PERSIST = ("--appendonly", "yes", "--appendfsync", "everysec")
"""redis-server options that keep its data in its dir across restarts (an append-only
file, as the deployments' state and broker Redis run)."""


def wait_for_redis(url: str, timeout_s: float = 10.0, alive: Callable[[], None] = lambda: None) -> None:
    """Returns once `url` answers PING; `alive` raises if the server died meanwhile."""
    import redis  # the server extras; `torchfarm up` checks for them first

    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.ping():
                return
        except redis.RedisError:
            alive()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def coordinator_command(python: str = sys.executable) -> list[str]:
    return [python, "-m", "services.coordinator.server"]


def worker_command(i: int, concurrency: int, python: str = sys.executable, pin_cores: bool = False) -> list[str]:
    """Worker i's Celery command, as the CPU worker image runs it."""
    cmd = [
        python, "-m", "celery", "-A", "workers.app", "worker",
        # No -Q: the worker consumes the queues of its targets (TORCHFARM_TARGETS,
        # default "local": this machine's own, e.g. "cpu.avx512"; workers/serving.py).
        "-n", f"cpu{i}@%h", "--concurrency", str(concurrency), "--pool", "prefork",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    if pin_cores:
        cmd = ["taskset", "-c", str(i % (os.cpu_count() or 1))] + cmd
    return cmd


def service_env(
    *, listen: str, broker_url: str, cache_url: str, state_url: str, metrics_port: int,
    signing_key_file: Path | None = None, trusted_keys_file: Path | None = None,
    tokens_file: Path | None = None, url_dir: Path | None = None,
) -> dict[str, str]:
    """The environment the coordinator and the workers share: this one's, plus where
    they listen, their Redis, and their keys and tokens. With `url_dir` (mode 0700), the
    Redis URLs, which carry a password, are written there (0600) and named by
    `TORCHFARM_*_URL_FILE`, as the deployments pass them."""
    env = dict(os.environ)
    env.update(TORCHFARM_LISTEN=listen, TORCHFARM_METRICS_PORT=str(metrics_port), PYTHONUNBUFFERED="1")
    urls = {"BROKER_URL": broker_url, "CACHE_URL": cache_url, "STATE_URL": state_url}
    for name, url in urls.items():
        if url_dir is None:
            env[f"TORCHFARM_{name}"] = url
            continue
        path = url_dir / name.lower().replace("_", "-")
        write_atomic(path, (url + "\n").encode(), 0o600)
        # A URL in the environment would win over its file.
        env.pop(f"TORCHFARM_{name}", None)
        env[f"TORCHFARM_{name}_FILE"] = str(path)
    if signing_key_file is not None:
        env["TORCHFARM_SIGNING_KEY_FILE"] = str(signing_key_file)
    if trusted_keys_file is not None:
        env["TORCHFARM_TRUSTED_KEYS_FILE"] = str(trusted_keys_file)
    if tokens_file is not None:
        env["TORCHFARM_TOKENS_FILE"] = str(tokens_file)
    return env


def worker_env(env: dict[str, str], i: int, caches: Path, metrics_port: int, metrics_dir: Path | None) -> dict[str, str]:
    """Worker i's environment over `env`: a name, Inductor and Triton caches of its own
    (as a worker on its own machine has) and its /metrics port (0: off); its pool
    processes share a prometheus-client multiprocess directory of its own."""
    env = {
        **env,
        "TORCHFARM_NAME": f"cpu{i}",
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "TORCHFARM_METRICS_PORT": str(metrics_port),
    }
    if metrics_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return env


def spawn(cmd: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    """`cmd` in a session of its own, stdout and stderr appended to `logfile`."""
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            die_with_parent(cmd), env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def stop(procs: dict[str, subprocess.Popen], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stops the processes at once: each gets SIGTERM, then `timeout_s` from then to
    exit, then SIGKILL with what it left in its group."""
    for p in procs.values():
        if p.poll() is None:
            # The leader only: a Celery worker then drains (finishes its compile and
            # takes no new one) and stops its own pool; a SIGTERM to the whole group
            # would kill the pool process mid-compile instead.
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for name, p in procs.items():
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0fs; killing it", name, timeout_s)
        # Whatever the leader left in its group (pool processes, compile workers) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a child's log, for the error that reports its death."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    channel: grpc.Channel, live_workers: Callable[[], int], workers: int, timeout_s: float,
    alive: Callable[[], None], where: str,
) -> None:
    """Returns once the coordinator on `channel` reports SERVING and `workers` workers
    have registered; `alive` raises if a child died meanwhile."""
    import redis
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    # Any: the stub package's HealthStub lacks its generated methods (Check).
    health: Any = health_pb2_grpc.HealthStub(channel)
    while True:
        alive()
        try:
            ok = (
                health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                == health_pb2.HealthCheckResponse.SERVING
            )
            if ok and live_workers() >= workers:
                return
        except (grpc.RpcError, redis.RedisError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"farm not ready after {timeout_s:.0f}s; logs in {where}")
        time.sleep(0.2)
