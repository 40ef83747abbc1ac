"""A Redis primary, a replica and one Sentinel on loopback, for failover tests.

Debian's redis-server runs as a Sentinel with `--sentinel`; the Sentinel here decides
alone (quorum 1) and declares the primary down after `down_after_ms`.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from localfarm.stack import free_port, redis_command, wait_for_redis

SERVICE = "tfmaster"


@dataclass
class SentinelGroup:
    workdir: Path
    down_after_ms: int = 1000
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def url(self, db: int) -> str:
        return f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{SERVICE}/{db}"

    def start(self) -> SentinelGroup:
        for name in ("primary", "replica", "sentinel"):
            self.ports[name] = free_port()
        p, r = self.ports["primary"], self.ports["replica"]
        for name, extra in (("primary", []), ("replica", ["--replicaof", "127.0.0.1", str(p)])):
            d = self.workdir / name
            d.mkdir(parents=True, exist_ok=True)
            self._spawn(name, redis_command(self.ports[name], d) + extra)
            wait_for_redis(f"redis://127.0.0.1:{self.ports[name]}/0")
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.ports['sentinel']}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {p} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self._spawn("sentinel", [redis_command(0, self.workdir)[0], str(conf), "--sentinel"])
        self.wait_primary(p)
        self.wait_replica_synced(r)
        return self

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.ports["sentinel"], socket_timeout=2)

    def primary_port(self) -> int | None:
        try:
            addr = self.sentinel().execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    def wait_primary(self, port: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.primary_port() != port:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Sentinel does not name 127.0.0.1:{port} as the primary")
            time.sleep(0.1)

    def wait_replica_synced(self, port: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=port, socket_timeout=2)
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError("the replica did not sync")
            time.sleep(0.1)

    def kill_primary(self) -> int:
        """Kills the primary outright (as a lost node); returns the replica's port."""
        self.procs["primary"].kill()
        self.procs["primary"].wait(10)
        return self.ports["replica"]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
