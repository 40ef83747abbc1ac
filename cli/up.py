"""`torchfarm up`: a farm on this machine's loopback, supervised until Ctrl-C.

Two redis-servers, as deployments run them: the broker and the state (`noeviction`),
and the cache, capped at `--cache-memory` (`allkeys-lru`; `0` runs one Redis for all,
without a limit); then the coordinator and N CPU workers, started by cli/launch.py and watched by
cli/supervisor.py: a child that dies is restarted, up to a bound, past which
the farm stops with the child's last log lines and exit status 1.

Both Redis let in only the farm's own user, whose password `up` makes (kept in
DIR/keys); the processes read their password-bearing URLs from files there
(`TORCHFARM_*_URL_FILE`). Without it any local user could read and rewrite every
tenant's requests and artifacts on 127.0.0.1, whatever tokens `--auth` requires.

With `--data-dir DIR` the farm keeps, across runs (each directory mode 0700):

    DIR/redis/       the state Redis's append-only file: job records, quotas, ledgers
    DIR/cache/       the cache Redis's append-only file: artifacts, stats
    DIR/logs/        one log per child, appended to
    DIR/keys/        the workers' signing key (so kept artifacts stay verifiable), tokens,
                     the Redis password, its ACL file and the processes' Redis URLs
    DIR/worker{i}/   worker i's Inductor and Triton caches

Without it, all of that lives in a temporary directory, removed when the farm stops
cleanly and kept (and named) when it stops on an error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from cli import launch, parser
from cli.errors import CliError
from cli.supervisor import ChildFailed, Supervisor
from torchfarm.files import write_atomic
from torchfarm.trust import provision, trustfile


def add_up_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="run redis-server, the coordinator and CPU workers on loopback")
    up.add_argument("--grpc-port", type=parser.port, default=50051, help="the coordinator's port")
    up.add_argument("--redis-port", type=parser.port, default=0, help="0 picks a free port")
    up.add_argument("--metrics-port", type=parser.port, default=0,
                    help="Prometheus /metrics of the coordinator, worker i on PORT+1+i; 0 is off")
    up.add_argument("--workers", type=parser.count(1), default=1, help="CPU workers")
    up.add_argument("--pin-cores", action="store_true", help="pin worker i to core i (taskset)")
    up.add_argument(
        "--concurrency", type=parser.count(1), default=1,
        help="jobs each worker runs at once (Celery pool processes); with N cores and no "
        "pinning, N / workers lets a worker build kernels while it lowers",
    )
    up.add_argument("--auth", metavar="TENANT", default="", help="require tokens; make one for TENANT")
    up.add_argument(
        "--cache-memory", default="2gb",
        help="the cache Redis's maxmemory (allkeys-lru; the state gets its own Redis); "
        "0: one Redis for all, without a limit",
    )
    up.add_argument("--data-dir", type=Path, default=None,
                    help="keep Redis's data, the logs, the signing key and the worker caches "
                    "here across runs (default: a temporary directory, removed on stop)")
    up.add_argument("--max-restarts", type=int, default=3,
                    help="restarts of a child that dies, within 5 minutes, before the farm stops")
    up.add_argument("--start-timeout", type=float, default=180.0,
                    help="seconds the farm may take to be ready (workers warm Inductor up first)")
    up.set_defaults(run=run)


@dataclass
class Layout:
    """Where a farm's files are (see the module docstring)."""

    root: Path
    persistent: bool

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def worker(self, i: int) -> Path:
        return self.root / f"worker{i}"

    def make(self, workers: int = 0) -> Layout:
        # The user's own: Redis's files hold every tenant's requests and artifacts. The
        # directories that hold data are narrowed where an earlier version made them
        # 0755; a data dir given that exists keeps its own mode.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for d in (self.redis, self.cache, self.logs, self.keys, *map(self.worker, range(workers))):
            d.mkdir(exist_ok=True)
            d.chmod(0o700)
        return self


class _Interrupted(Exception):
    """SIGINT or SIGTERM while the farm was starting."""


def _check_ports(args: argparse.Namespace) -> None:
    wanted = [("--grpc-port", args.grpc_port)]
    if args.redis_port:
        wanted.append(("--redis-port", args.redis_port))
    if args.metrics_port:
        wanted += [("--metrics-port", args.metrics_port + i) for i in range(args.workers + 1)]
    for flag, port in wanted:
        if launch.port_in_use(port):
            raise CliError(f"port {port} on 127.0.0.1 is in use; give another with {flag}")


def _signing_key(keys: Path) -> tuple[Path, Path]:
    """The workers' key and its pin, made on the first run and kept in the data dir."""
    from torchfarm.trust.signing import Signer

    key, pins = keys / "signing-key.pem", keys / "trusted-keys.json"
    if not key.exists():
        Signer.generate().save(key)
    if not pins.exists():
        pins.write_text(json.dumps(Signer.from_file(key).trusted_entry(), indent=2) + "\n")
    return key, pins


def _token(keys: Path, tenant: str) -> tuple[Path, str]:
    """A new token for `tenant`, added to the data dir's tokens file (earlier ones stay
    valid until they expire)."""
    from torchfarm.trust import tokens

    path = keys / "tokens.json"
    token = tokens.new_token(tenant)
    tokens.add_to_file(path, tokens.table_entry(token, tenant))
    return path, token


REDIS_USER = "farm"
"""The one user of `up`'s Redis, with the password in DIR/keys/redis.password."""


def _redis_acl(keys: Path) -> tuple[Path, str]:
    """The ACL file `up`'s Redis start with and its user's password (made on the first
    run and kept): the unauthenticated may only PING."""
    password = provision.password(keys / "redis.password")
    acl = keys / "redis.acl"
    text = provision.redis_acl({REDIS_USER: password}, channels=launch.redis_version() >= (6, 2))
    write_atomic(acl, text.encode(), 0o600)
    return acl, password


SERVER_MODULES = ("redis", "celery", "grpc_health", "prometheus_client")
"""What the coordinator and the workers import beyond a client's `[sdk]` install."""


def _check_extras() -> None:
    """Raises CliError, in one line, where this install lacks the coordinator's and the
    workers' packages (a training machine's `pip install 'torchfarm[sdk]'`)."""
    missing = []
    for name in SERVER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise CliError(f"this install lacks {', '.join(missing)}, which the coordinator and workers need: "
                       "pip install 'torchfarm[all]' (and apt-get install redis-server)", 1)


def run(args: argparse.Namespace) -> int:
    _check_extras()
    _check_ports(args)
    launch.redis_server()  # fails now, in one line, where redis-server is not installed
    version = launch.redis_version()
    if version < (6, 0):
        raise CliError(
            f"torchfarm up needs redis-server 6.0 or later, for the password its Redis requires "
            f"(an ACL file); this one is {version[0]}.{version[1]}", 1,
        )
    if args.data_dir is not None:
        layout = Layout(args.data_dir.resolve(), persistent=True).make(args.workers)
    else:
        layout = Layout(Path(tempfile.mkdtemp(prefix="torchfarm-up-")), persistent=False).make(args.workers)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    farm = _Farm(args, layout, stop)
    failure = ""
    clean = False
    try:
        farm.start()
        farm.announce()
        farm.supervisor.run(stop)
        clean = True
    except (ChildFailed, TimeoutError) as e:
        failure = str(e)
    except _Interrupted:
        clean = True
    finally:
        print("torchfarm: stopping", flush=True)
        farm.stop()
        if not layout.persistent:
            if clean:
                shutil.rmtree(layout.root, ignore_errors=True)
            else:
                print(f"torchfarm: logs kept in {layout.logs}", file=sys.stderr, flush=True)
    if failure:  # last, where the user looks
        print(f"torchfarm up: {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


class _Farm:
    def __init__(self, args: argparse.Namespace, layout: Layout, stop: threading.Event):
        self.args, self.layout, self.stop_event = args, layout, stop
        self.redis_port = args.redis_port or launch.free_port()
        # A capped cache that evicts, apart from the state, as deployments run it: one
        # Redis without a limit grows with every artifact ever compiled.
        self.cache_memory = "" if args.cache_memory in ("", "0") else args.cache_memory
        self.cache_port = launch.free_port() if self.cache_memory else 0
        self.listen = f"127.0.0.1:{args.grpc_port}"
        self.supervisor = Supervisor(max_restarts=args.max_restarts)
        self.signing_key, self.pins = _signing_key(layout.keys)
        self.tokens_file: Path | None = None
        self.token = ""
        if args.auth:
            self.tokens_file, self.token = _token(layout.keys, args.auth)
        self.trust_file: Path | None = None
        self.redis_acl, self.redis_password = _redis_acl(layout.keys)

    def _url(self, port: int, db: int) -> str:
        return provision.redis_url(REDIS_USER, self.redis_password, f"127.0.0.1:{port}", db)

    @property
    def redis_url(self) -> str:
        """The state's Redis (and, without a capped cache, the cache's)."""
        return self._url(self.redis_port, 1)

    @property
    def cache_url(self) -> str:
        return self._url(self.cache_port, 0) if self.cache_memory else self.redis_url

    def env(self) -> dict[str, str]:
        return launch.service_env(
            listen=self.listen, broker_url=self._url(self.redis_port, 0),
            cache_url=self.cache_url, state_url=self.redis_url, metrics_port=self.args.metrics_port,
            signing_key_file=self.signing_key, trusted_keys_file=self.pins,
            tokens_file=self.tokens_file, url_dir=self.layout.keys,
        )

    def _child(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log = self.layout.logs / f"{name}.log"
        self.supervisor.start(name, lambda: launch.spawn(cmd, env, log), log)

    def _alive(self) -> None:
        self.supervisor.alive()
        if self.stop_event.is_set():
            raise _Interrupted()

    def start(self) -> None:
        # The workers sign every artifact with this farm's key. It is published in this
        # user's trust file for the farm's address, where the SDK finds it.
        self.trust_file = trustfile.publish(self.listen, json.loads(self.pins.read_text()))
        # The ACL file by its path: a password in the argv is every local user's to read.
        both = (*(launch.PERSIST if self.layout.persistent else ()), "--aclfile", str(self.redis_acl))
        state = (*both, "--maxmemory-policy", "noeviction") if self.cache_memory else both
        self._child("redis", launch.redis_command(self.redis_port, self.layout.redis, *state), self.env())
        launch.wait_for_redis(self.redis_url, 30.0, self._alive)
        if self.cache_memory:
            capped = (*both, "--maxmemory", self.cache_memory, "--maxmemory-policy", "allkeys-lru")
            self._child("cache", launch.redis_command(self.cache_port, self.layout.cache, *capped), self.env())
            launch.wait_for_redis(self.cache_url, 30.0, self._alive)
        self._child("coordinator", launch.coordinator_command(), self.env())
        for i in range(self.args.workers):
            port = self.args.metrics_port + 1 + i if self.args.metrics_port else 0
            metrics = self.layout.worker(i) / "metrics" if port else None
            env = launch.worker_env(self.env(), i, self.layout.worker(i), port, metrics)
            self._child(f"worker{i}", launch.worker_command(i, self.args.concurrency, pin_cores=self.args.pin_cores), env)
        with grpc.insecure_channel(self.listen) as channel:
            launch.wait_ready(
                channel, self._live_workers, self.args.workers, self.args.start_timeout,
                self._alive, str(self.layout.logs),
            )

    def _live_workers(self) -> int:
        from torchfarm.storage.store import Store

        names = Store.from_url(self.redis_url).live_workers()
        # A kept Redis may still hold the heartbeats of the last run's workers.
        return sum(1 for n in names if n.startswith("cpu") and n[3:].isdigit()
                   and int(n[3:]) < self.args.workers)

    def announce(self) -> None:
        print(f"torchfarm: farm ready at grpc://{self.listen} (logs in {self.layout.logs})", flush=True)
        print(f"torchfarm: signing key published in {self.trust_file}", flush=True)
        print("torchfarm: for SDK processes of this user on this machine:", flush=True)
        print(f"  export TORCHFARM_REMOTE=grpc://{self.listen}", flush=True)
        if self.token:
            print(f"  export TORCHFARM_TOKEN={self.token}", flush=True)
        else:
            print("torchfarm: authentication is off (loopback only); --auth TENANT turns it on", flush=True)
        # The published file is this user's; the pins are what another user or machine copies.
        kept = "" if self.layout.persistent else " (a new key at each start; --data-dir keeps one)"
        print(f"torchfarm: for other users and machines, copy {self.pins} and set "
              f"TORCHFARM_TRUSTED_KEYS_FILE to the copy{kept}", flush=True)
        if self.args.metrics_port:
            ports = [self.args.metrics_port + i for i in range(self.args.workers + 1)]
            print(f"torchfarm: /metrics on ports {', '.join(map(str, ports))}", flush=True)
        if self.layout.persistent:
            print(f"torchfarm: Redis's data and the logs are kept in {self.layout.root}", flush=True)

    def stop(self) -> None:
        children = list(self.supervisor.children)
        self.supervisor.stop([n for n in children if n.startswith("worker")])
        self.supervisor.stop(["coordinator"])
        self.supervisor.stop(["cache", "redis"])
        if self.trust_file is not None:
            for key_id in json.loads(self.pins.read_text()):
                trustfile.withdraw(self.listen, key_id)
