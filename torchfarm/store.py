"""The artifact cache and the job board, both in Redis.

Layout, under a configurable prefix (default "tf"):

- `tf:blob:<sha256>`: a blob's bytes, content-addressed, written once (SET NX);
- `tf:artifact:<key>`: the manifest JSON; written after all its blobs, so a reader
  that sees a manifest can fetch every blob it names;
- `tf:req:<key>`: the CompileRequest bytes a worker compiles from (protobuf, never pickle);
- `tf:job:<key>`: a hash with the job's state, stage, attempts, timings and error;
- `tf:worker:<name>`: a worker's heartbeat, expiring when the worker stops beating;
- `tf:recent`: the latest job keys, for `torchfarm status`.

The cache may live on a Redis with LRU eviction. A manifest whose blobs were evicted
counts as a miss, so eviction costs a recompile and never a broken artifact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from torchfarm.manifest import Manifest

RECENT_JOBS = 50
"""How many job keys `tf:recent` keeps."""


class JobState:
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TERMINAL = frozenset({SUCCEEDED, FAILED})


@dataclass
class JobRecord:
    key: str
    state: str
    queue: str = ""
    stage: str = ""
    message: str = ""
    error_code: str = ""
    attempts: int = 0
    created: float = 0.0
    started: float = 0.0
    updated: float = 0.0
    worker: str = ""
    label: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    artifact_bytes: int = 0

    @classmethod
    def from_hash(cls, key: str, h: dict[bytes, bytes]) -> JobRecord:
        s = {k.decode(): v.decode() for k, v in h.items()}
        return cls(
            key=key,
            state=s.get("state", JobState.QUEUED),
            queue=s.get("queue", ""),
            stage=s.get("stage", ""),
            message=s.get("message", ""),
            error_code=s.get("error_code", ""),
            attempts=int(s.get("attempts", 0)),
            created=float(s.get("created", 0)),
            started=float(s.get("started", 0)),
            updated=float(s.get("updated", 0)),
            worker=s.get("worker", ""),
            label=s.get("label", ""),
            timings=json.loads(s.get("timings", "{}")),
            artifact_bytes=int(s.get("artifact_bytes", 0)),
        )


class Store:
    """Typed access to the farm's Redis keys. Safe to share between threads."""

    def __init__(self, client: redis.Redis, prefix: str = "tf"):
        self.r = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = "tf") -> Store:
        return cls(redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5), prefix)

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # Blobs and manifests.

    def put_blob(self, digest: str, data: bytes) -> None:
        self.r.set(self._k("blob", digest), data, nx=True)

    def get_blob(self, digest: str) -> bytes | None:
        return self.r.get(self._k("blob", digest))

    def get_blob_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes [start, end] inclusive, so large blobs stream without one big read."""
        return self.r.getrange(self._k("blob", digest), start, end)

    def has_blobs(self, digests: Iterable[str]) -> bool:
        keys = [self._k("blob", d) for d in digests]
        return not keys or self.r.exists(*keys) == len(keys)

    def put_manifest(self, manifest: Manifest) -> None:
        self.r.set(self._k("artifact", manifest.key), manifest.to_json())

    def get_manifest_bytes(self, key: str) -> bytes | None:
        return self.r.get(self._k("artifact", key))

    def get_manifest(self, key: str) -> Manifest | None:
        """The manifest, if it and every blob it names are in the cache."""
        data = self.get_manifest_bytes(key)
        if data is None:
            return None
        manifest = Manifest.from_json(data)
        if not self.has_blobs(b.digest for b in manifest.blobs()):
            # Evicted under memory pressure: drop the index entry so the key recompiles.
            self.r.delete(self._k("artifact", key))
            return None
        return manifest

    def delete_artifact(self, key: str) -> bool:
        return bool(self.r.delete(self._k("artifact", key)))

    def artifact_keys(self) -> list[str]:
        pre = self._k("artifact", "")
        return sorted(k.decode()[len(pre) :] for k in self.r.scan_iter(match=pre + "*", count=500))

    # Requests and jobs.

    def put_request(self, key: str, data: bytes, ttl_s: int) -> None:
        self.r.set(self._k("req", key), data, ex=ttl_s)

    def get_request(self, key: str) -> bytes | None:
        return self.r.get(self._k("req", key))

    def create_job(self, key: str, queue: str, label: str, ttl_s: int) -> bool:
        """Creates the job record unless one exists; True when this call created it.

        HSETNX on one field is the lease: of concurrent identical submits exactly one
        creates the job and enqueues it, the others join it.
        """
        jk = self._k("job", key)
        now = time.time()
        if not self.r.hsetnx(jk, "created", now):
            return False
        pipe = self.r.pipeline()
        pipe.hset(
            jk,
            mapping={"state": JobState.QUEUED, "queue": queue, "label": label, "updated": now},
        )
        pipe.expire(jk, ttl_s)
        pipe.lpush(self._k("recent"), key)
        pipe.ltrim(self._k("recent"), 0, RECENT_JOBS - 1)
        pipe.execute()
        return True

    def get_job(self, key: str) -> JobRecord | None:
        h = self.r.hgetall(self._k("job", key))
        return JobRecord.from_hash(key, h) if h and b"state" in h else None

    def update_job(self, key: str, **fields: object) -> None:
        mapping = {
            k: json.dumps(v) if isinstance(v, dict) else v for k, v in fields.items() if v is not None
        }
        mapping["updated"] = time.time()
        self.r.hset(self._k("job", key), mapping=mapping)

    def incr_attempts(self, key: str) -> int:
        return int(self.r.hincrby(self._k("job", key), "attempts", 1))

    def expire_job(self, key: str, ttl_s: int) -> None:
        self.r.expire(self._k("job", key), ttl_s)

    def delete_job(self, key: str) -> None:
        self.r.delete(self._k("job", key))

    def recent_jobs(self) -> list[JobRecord]:
        keys = [k.decode() for k in self.r.lrange(self._k("recent"), 0, RECENT_JOBS - 1)]
        jobs = (self.get_job(k) for k in dict.fromkeys(keys))
        return [j for j in jobs if j is not None]

    # Workers.

    def heartbeat(self, name: str, queues: list[str], build: str, ttl_s: int) -> None:
        self.r.set(
            self._k("worker", name),
            json.dumps({"queues": queues, "build": build, "seen": time.time()}),
            ex=ttl_s,
        )

    def forget_worker(self, name: str) -> None:
        self.r.delete(self._k("worker", name))

    def live_workers(self) -> dict[str, dict]:
        pre = self._k("worker", "")
        names = [k.decode() for k in self.r.scan_iter(match=pre + "*", count=500)]
        values = self.r.mget(names) if names else []
        return {n[len(pre) :]: json.loads(v) for n, v in zip(names, values) if v is not None}

    def cache_bytes(self) -> int:
        """Bytes used by the Redis that holds the cache (all of it, as Redis reports)."""
        return int(self.r.info("memory").get("used_memory", 0))
