"""The embedded local stack: redis-server, the coordinator and N CPU workers on loopback.

By default one redis-server, without a memory limit, is the broker, the cache and the
state (torchfarm/storage/store.py): it never evicts, so one is enough and starts fast. With
`split_state`, a second one, `noeviction` with an append-only file, holds the state
and the broker, and `cache_maxmemory` bounds the cache with `allkeys-lru`, as a
deployment runs them (docker-compose.yml).

Integration tests and benchmarks start one per session with free ports. Its processes
start as `torchfarm up` starts them, through the same launcher (cli/launch.py):
the same commands and environment, each in its own session, so that stopping the stack
also stops Celery's pool processes and Inductor's compile workers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis

from cli import launch
from cli.launch import STOP_TIMEOUT_S, free_port, redis_command, wait_for_redis
from torchfarm.storage.store import Store
from torchfarm.trust import trustfile

__all__ = [
    "INDUCTOR_SEED_ENV", "STOP_TIMEOUT_S", "LocalStack", "free_port", "redis_command",
    "seed_isa_probe", "start_redis_server", "wait_for_redis",
]

log = logging.getLogger(__name__)

INDUCTOR_SEED_ENV = "TORCHFARM_STACK_INDUCTOR_SEED"

_PROBE = "from torchfarm.fx import vecisa; vecisa.picked()"
_SEED_LOCK, _SEED_DONE = ".seeding", ".seeded"
"""The seed dir's lock file and its mark of a finished probe; no worker's cache gets them."""


def _path_from_env(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def seed_isa_probe(cache_dir: Path, python: str = sys.executable) -> Path:
    """`cache_dir`, holding what Inductor's vector-ISA probe builds (`pick_vec_isa()`: a
    test program per ISA and sub-feature the CPU reports, seconds each under the test
    suite's load), run in
    a process of `python` the first time; returns `cache_dir`. The files are keyed by
    their source, the compiler's version and the torch version, so a process of another
    build builds its own beside them. Holds a lock while it runs, for concurrent test
    processes."""
    import fcntl

    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / _SEED_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = cache_dir / _SEED_DONE
        if not done.exists():
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
            subprocess.run([python, "-c", _PROBE], env=env, check=True, timeout=300)
            done.touch()
    return cache_dir


def start_redis_server(port: int, workdir: Path) -> subprocess.Popen:
    """A standalone redis-server for tests and benchmarks, answering PING on return."""
    proc = subprocess.Popen(
        redis_command(port, workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_redis(f"redis://127.0.0.1:{port}/0")
    return proc


@dataclass
class LocalStack:
    workers: int = 1
    grpc_port: int = 0
    redis_port: int = 0
    metrics_port: int = 0
    workdir: Path | None = None
    python: str = sys.executable
    pin_cores: bool = False
    concurrency: int = 1
    """Pool processes per worker: how many jobs (a lowering and the kernel builds it
    streams, say) one worker runs at once."""
    extra_env: dict[str, str] = field(default_factory=dict)
    worker_env: dict[int, dict[str, str]] = field(default_factory=dict)
    """Environment of worker i only, over `extra_env`: e.g. TORCHFARM_REPORTED_BUILD, so
    one machine plays workers of two builds (workers/identity.py)."""
    blob_url: str = ""
    """Where the farm keeps blobs (torchfarm/storage/blobs.py); "" is the stack's own Redis."""
    sign: bool = True
    """Generate an Ed25519 key for the workers to sign artifacts with (trusted_keys_file)."""
    tenants: tuple[str, ...] = ()
    """With names here, the coordinator requires tokens: one is made per tenant (`tokens`)."""
    publish_key: bool = True
    """While the stack runs, its public key is in this user's trust file for its address
    (torchfarm/trust/trustfile.py), so SDK processes of this user find it unconfigured."""
    cache_root: Path | None = None
    """Where worker i keeps its Inductor and Triton caches: `cache_root/worker{i}`; by
    default the stack's workdir, new with the stack. Stacks given one root find there
    what the worker of the same index in an earlier stack compiled, as a worker
    restarted on the same machine does; the workers of one stack never share a cache."""
    inductor_seed: Path | None = field(default_factory=lambda: _path_from_env(INDUCTOR_SEED_ENV))
    """An Inductor cache dir whose files each worker's fresh cache dir starts with: the
    vector-ISA probe's test programs (`seed_isa_probe`), so a worker's first compile
    dlopens them instead of building six of them. None, the default unless
    TORCHFARM_STACK_INDUCTOR_SEED names one, starts every worker cache empty."""
    warmup: bool = True
    """Workers warm Inductor up before they register (workers/priming.py). Tests that do not test it turn it off: the first
    compile then pays the ISA probe and the build hashes instead."""
    split_state: bool = False
    """Start a second redis-server for the state and the broker (`noeviction`, AOF):
    the cache's Redis may then evict (cache_maxmemory)."""
    state_port: int = 0
    cache_maxmemory: str = ""
    """With split_state: the cache Redis's maxmemory ("64mb"), evicting allkeys-lru;
    "" sets no limit."""
    tls_cert_file: str = ""
    """With tls_key_file: the coordinator serves TLS only (a certificate for 127.0.0.1);
    clients verify it against tls_ca_file."""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, init=False)
    tokens: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.grpc_port = self.grpc_port or free_port()
        self.redis_port = self.redis_port or free_port()
        if self.split_state:
            self.state_port = self.state_port or free_port()
        elif self.cache_maxmemory:
            raise ValueError("cache_maxmemory needs split_state: the state must not be evicted")
        self._tmp = None
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="torchfarm-stack-")
            self.workdir = Path(self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.signing_key_file = self.workdir / "signing-key.pem"
        self.trusted_keys_file = self.workdir / "trusted-keys.json"
        self.tokens_file = self.workdir / "tokens.json"
        self.trust_file: Path | None = None
        """The per-user trust file the running stack published its key in."""
        if self.sign and not self.signing_key_file.exists():
            self._make_signing_key()
        if self.tenants:
            self._make_tokens()

    @property
    def root(self) -> Path:
        """`workdir`, which __post_init__ makes when none is given (never None after it)."""
        assert self.workdir is not None
        return self.workdir

    def _make_signing_key(self) -> None:
        from torchfarm.trust.signing import Signer

        signer = Signer.generate()
        signer.save(self.signing_key_file)
        self.trusted_keys_file.write_text(json.dumps(signer.trusted_entry(), indent=2) + "\n")

    def _make_tokens(self) -> None:
        from torchfarm.trust import tokens

        table: dict[str, object] = {}
        for tenant in self.tenants:
            self.tokens[tenant] = tokens.new_token(tenant)
            table.update(tokens.table_entry(self.tokens[tenant], tenant))
        fd = os.open(self.tokens_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=2)

    def client_env(self, tenant: str = "") -> dict[str, str]:
        """What an SDK process sets to use this farm: its address, the pinned signing
        key, and the tenant's token when the farm requires one."""
        env = {"TORCHFARM_REMOTE": self.address}
        if self.tls_ca_file:
            env["TORCHFARM_TLS_CA_FILE"] = self.tls_ca_file
        if self.sign:
            env["TORCHFARM_TRUSTED_KEYS_FILE"] = str(self.trusted_keys_file)
        if self.tenants:
            env["TORCHFARM_TOKEN"] = self.tokens[tenant or self.tenants[0]]
        return env

    @property
    def address(self) -> str:
        return f"{'grpcs' if self.tls_cert_file else 'grpc'}://127.0.0.1:{self.grpc_port}"

    @property
    def broker_url(self) -> str:
        return f"redis://127.0.0.1:{self.state_port or self.redis_port}/0"

    @property
    def cache_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/1"

    @property
    def state_url(self) -> str:
        """The state Redis's URL; the cache's when the stack runs one Redis."""
        return f"redis://127.0.0.1:{self.state_port}/1" if self.state_port else self.cache_url

    def store(self) -> Store:
        return Store.from_url(self.cache_url, blob_url=self.blob_url, state_url=self.state_url)

    def env(self) -> dict[str, str]:
        env = launch.service_env(
            listen=self.listen, broker_url=self.broker_url, cache_url=self.cache_url,
            state_url=self.state_url, metrics_port=self.metrics_port,
            signing_key_file=self.signing_key_file if self.sign else None,
            trusted_keys_file=self.trusted_keys_file if self.sign else None,
            tokens_file=self.tokens_file if self.tenants else None,
        )
        if not self.warmup:
            env["TORCHFARM_WARMUP"] = "0"
        if self.blob_url:
            env["TORCHFARM_BLOB_URL"] = self.blob_url
        if self.tls_cert_file:
            env["TORCHFARM_TLS_CERT_FILE"] = self.tls_cert_file
            env["TORCHFARM_TLS_KEY_FILE"] = self.tls_key_file
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = launch.spawn(cmd, env or self.env(), self.root / f"{name}.log")

    @property
    def listen(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _publish_key(self) -> None:
        if self.sign and self.publish_key:
            entry = json.loads(self.trusted_keys_file.read_text())
            self.trust_file = trustfile.publish(self.listen, entry)

    def _withdraw_key(self) -> None:
        if self.sign and self.publish_key and self.trusted_keys_file.exists():
            for key_id in json.loads(self.trusted_keys_file.read_text()):
                trustfile.withdraw(self.listen, key_id)

    def start(self, timeout_s: float = 60.0) -> LocalStack:
        try:
            self._publish_key()
            self.start_redis()
            self.start_coordinator()
            for i in range(self.workers):
                self.start_worker(i)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_redis(self) -> None:
        cache: tuple[str, ...] = ()
        if self.cache_maxmemory:
            cache = ("--maxmemory", self.cache_maxmemory, "--maxmemory-policy", "allkeys-lru")
        self._spawn("redis", redis_command(self.redis_port, self.root, *cache))
        if self.state_port:
            state = self.root / "state-redis"
            state.mkdir(exist_ok=True)
            self._spawn("state-redis", redis_command(
                self.state_port, state, "--appendonly", "yes", "--maxmemory-policy", "noeviction",
            ))
        for name, url in (("redis", self.cache_url), ("state-redis", self.state_url)):
            try:
                wait_for_redis(url)
            except redis.RedisError as e:
                raise RuntimeError(f"redis-server did not start; see {self.workdir}/{name}.log") from e

    def start_coordinator(self) -> None:
        self._spawn("coordinator", launch.coordinator_command(self.python))

    def worker_cmd(self, i: int) -> list[str]:
        return launch.worker_command(i, self.concurrency, self.python, self.pin_cores)

    def worker_metrics_port(self, i: int) -> int:
        """Where worker i serves /metrics: metrics_port + 1 + i, or 0 (off) with metrics off."""
        return self.metrics_port + 1 + i if self.metrics_port else 0

    def start_worker(self, i: int) -> None:
        # Each worker has a cache dir of its own, as a worker on its own machine would.
        caches = (self.cache_root or self.root) / f"worker{i}"
        if self.inductor_seed is not None and not (caches / "inductor").exists():
            shutil.copytree(
                seed_isa_probe(self.inductor_seed, self.python), caches / "inductor",
                ignore=shutil.ignore_patterns(_SEED_LOCK, _SEED_DONE),
            )
        metrics_dir = self.root / f"worker{i}" / "metrics" if self.metrics_port else None
        env = launch.worker_env(self.env(), i, caches, self.worker_metrics_port(i), metrics_dir)
        env.update(self.worker_env.get(i, {}))
        self._spawn(f"worker{i}", self.worker_cmd(i), env)

    def wait_ready(self, timeout_s: float) -> None:
        with self._health_channel() as channel:
            launch.wait_ready(
                channel, lambda: len(self.store().live_workers()), self.workers, timeout_s,
                self._check_alive, str(self.workdir),
            )

    def _health_channel(self) -> grpc.Channel:
        target = f"127.0.0.1:{self.grpc_port}"
        if not self.tls_cert_file:
            return grpc.insecure_channel(target)
        roots = Path(self.tls_ca_file).read_bytes() if self.tls_ca_file else None
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def signal(self, name: str, sig: int) -> None:
        """Sends `sig` to one process of the stack (and its children)."""
        os.killpg(self.procs[name].pid, sig)

    def stop_process(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.stop_processes([name], timeout_s)

    def stop_processes(self, names: list[str], timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stops the named processes at once: each gets SIGTERM, then `timeout_s` from
        then to exit, then SIGKILL with what it left in its group."""
        procs = {name: p for name in names if (p := self.procs.pop(name, None)) is not None}
        launch.stop(procs, timeout_s)

    def stop(self) -> None:
        self.stop_processes([n for n in self.procs if n.startswith("worker")])
        self.stop_process("coordinator")
        self.stop_processes(["redis", "state-redis"])
        self._withdraw_key()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
