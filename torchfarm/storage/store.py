"""The artifact cache and the job board, both in Redis.

Layout, under a configurable prefix (default "tf"):

- `tf:blob:<sha256>`: a blob's bytes, content-addressed, written once (SET NX), unless
  `blob_url` puts the blobs elsewhere (object storage; torchfarm/storage/blobs.py);
- `tf:artifact:<key>`: the manifest JSON; written after all its blobs, so a reader
  that sees a manifest can fetch every blob it names;
- `tf:req:<key>`: the CompileRequest bytes a worker compiles from (protobuf, never pickle),
  written with the job record in one script, deleted when the job ends and expiring
  with the record;
- `tf:jobev:<key>`: not a key but a pub/sub channel, published on at every write of the
  job record, so watchers need not poll;
- `tf:job:<key>`: a hash with the job's state, stage, attempts, timings and error (and a
  staged compile's stage records and kernel counts, workers/board.py);
- `tf:queues-seen`: sorted set of queue → when a worker last beat on it (scale from zero);
- `tf:worker:<name>`: a worker's heartbeat, expiring when the worker stops beating: its
  queues, the targets it serves with the job kinds it takes for each, and its build;
- `tf:kreq:<key>`, `tf:kernel:<key>`: a Triton kernel request (protobuf) and the
  manifest of its compiled binary (kind "kernel"), whose bytes are blobs like any other;
- `tf:recent`: the latest job keys, for `torchfarm status`;
- `tf:kbin:<key>`, `tf:plan:<key>`, `tf:pending:<key>`: the staged compile's kernel cache,
  plans and barriers (workers/board.py);
- `tf:stat:<key>`: a hash of an artifact's use: `hits`, `last_hit` (unix seconds), and
  the `label` of the request that created its job; for `torchfarm cache`;
- `tf:inflight:<tenant>`: the tenant's jobs not yet seen to finish, for its queue quota;
- `tf:stored:<ns>`, `tf:storedbytes:<ns>`, `tf:uploaded:<ns>:<window>`: what each
  namespace keeps in the cache, and uploads lately (torchfarm/storage/usage.py).

Tenants: `Store.tenant(namespace)` is a view in which every per-key entry (artifact,
req, job) is named `<namespace>:<key>`, as `tf:artifact:alice:<key>`. The unnamed
namespace of a farm without tokens keeps the plain `tf:artifact:<key>`. Blobs are
content-addressed and shared: a blob is reachable only through a manifest, and
manifests are per namespace.

Two Redis roles (one server may play both, as the embedded stack's does):

- the cache (`cache_url`), which may evict (`allkeys-lru`): blobs, manifests (`artifact`),
  use stats (`stat`), Triton kernel records (`kernel`), the C++ kernel cache (`kbin`)
  and miss explanations (torchfarm/storage/explain.py). A manifest whose blobs were evicted
  counts as a miss, so eviction costs a recompile and never a broken artifact.
- the state (`state_url`, `Store.r`), which must never evict (`noeviction`, with
  persistence): everything in flight: requests, job records and their channels, the
  recent list, quotas, stored-bytes ledgers, worker registrations, `queues-seen`, kernel requests, and the
  staged compile's plans, barriers, decompositions and claims (workers/board.py).
  `check_state_redis` refuses one that may evict. All of it but the stored-bytes
  ledgers is deleted or expires when its job ends, so it stays proportional to the load;
  the ledgers hold one small entry per artifact a namespace keeps in the cache.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from torchfarm.storage import redisconn
from torchfarm.storage.blobs import BlobStore, open_blobs
from torchfarm.storage.usage import BlobOwners, Ledger
from torchfarm.wire.manifest import KERNEL, Manifest, ManifestError

log = logging.getLogger(__name__)

RECENT_JOBS = 50
"""How many job keys `tf:recent` keeps."""

MAX_JOB_MESSAGE_CHARS = 16_000
"""A failed job keeps this many characters of its message: the tail, where the error is."""


_CREATE_JOB = """
-- KEYS: job record, request, recent list, the job's event channel.
-- ARGV: now, state, queue, label, ttl, request bytes ("": none),
--       the job's ref in the recent list, the recent list's last index.
if redis.call('HSETNX', KEYS[1], 'created', ARGV[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'queue', ARGV[3], 'label', ARGV[4], 'updated', ARGV[1],
           'ttl', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[5])
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[2], ARGV[6], 'EX', ARGV[5])
end
redis.call('LPUSH', KEYS[3], ARGV[7])
redis.call('LTRIM', KEYS[3], 0, ARGV[8])
redis.call('PUBLISH', KEYS[4], 'created')
return 1
"""
"""Creates a job whole or not at all (Store.create_job), in the state Redis."""

_UPDATE_JOB = """
-- KEYS: job record, request, kernel request, the job's event channel.
-- ARGV: "1" when the update ends the job, then field, value pairs.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local unpack = unpack or table.unpack
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
if ARGV[1] == '1' then
  redis.call('DEL', KEYS[2], KEYS[3])
else
  local ttl = redis.call('HGET', KEYS[1], 'ttl')
  if ttl then
    redis.call('EXPIRE', KEYS[1], ttl)
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('EXPIRE', KEYS[3], ttl)
  end
end
redis.call('PUBLISH', KEYS[4], 'updated')
return 1
"""
"""Writes a job record that exists (Store.update_job), in the state Redis."""

_COUNT_ATTEMPT = """
-- KEYS: job record, the job's event channel. ARGV: the counter.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('PUBLISH', KEYS[2], 'attempt')
return n
"""
"""Counts a delivery of a job whose record exists (Store.incr_attempts)."""

EVICTING_STATE = "the state Redis may evict"
"""Starts `check_state_redis`'s refusal, which names the policy (`maxmemory-policy`)."""


def state_eviction(client: redis.Redis) -> str | None:
    """Why `client` may evict keys, or None when it cannot: with a `maxmemory` set,
    any `maxmemory-policy` but `noeviction` drops keys when memory is full. Read from
    INFO, which the role ACLs allow (CONFIG need not be)."""
    info = client.info("memory")
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if int(info.get("maxmemory", 0) or 0) == 0 or policy == "noeviction":
        return None
    return f"maxmemory {info.get('maxmemory')} bytes with maxmemory-policy {policy}"


class JobState:
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TERMINAL = frozenset({SUCCEEDED, FAILED})


class Attempts(enum.StrEnum):
    """The job record's delivery counters: the job's own (its graph or export job, which
    the coordinator's status shows), and each stage job's, which fails its job
    TOO_MANY_ATTEMPTS past the worker's cap (workers/jobs/stage.py)."""

    JOB = "attempts"
    LOWERING = "lower_attempts"
    ASSEMBLY = "assemble_attempts"

    @staticmethod
    def kernel_batch(batch: str) -> str:
        """The counter of one kernel-build batch (its cache keys' digest)."""
        return f"kattempts:{batch}"


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
    stages: list[dict[str, Any]] = field(default_factory=list)
    """A staged compile's stage records (torchfarm/wire/manifest.py `Manifest.stages`)."""
    kernels_total: int = 0
    """Kernels the graph needs (staged compiles); 0 until lowering has run."""
    kernels_done: int = 0
    """Of those, built or found in the kernel cache so far."""
    kernels_hit: int = 0
    """Of kernels_done, found in the kernel cache."""
    unserved: bool = False
    """Not stored: the coordinator's view of a QUEUED job whose queue no live worker
    consumes (services/coordinator/farm.py `Farm.watch`)."""

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
            attempts=int(s.get(Attempts.JOB, 0)),
            created=float(s.get("created", 0)),
            started=float(s.get("started", 0)),
            updated=float(s.get("updated", 0)),
            worker=s.get("worker", ""),
            label=s.get("label", ""),
            timings=json.loads(s.get("timings", "{}")),
            artifact_bytes=int(s.get("artifact_bytes", 0)),
            stages=json.loads(s.get("stages", "[]")),
            kernels_total=int(s.get("kernels_total", 0)),
            kernels_done=int(s.get("kernels_done", 0)),
            kernels_hit=int(s.get("kernels_hit", 0)),
        )


class Store:
    """Typed access to the farm's Redis keys. Safe to share between threads."""

    def __init__(self, client: redis.Redis, prefix: str = "tf", namespace: str = "",
                 blobs: BlobStore | None = None, cache: redis.Redis | None = None):
        # redis-py types replies as `bytes | str`; these clients never decode them (no
        # decode_responses), so the methods below cast replies to bytes.
        self.r = client
        """The state Redis: what is in flight (never evicted)."""
        self.c = client if cache is None else cache
        """The cache Redis: artifacts and what else a miss can rebuild (may evict)."""
        self.prefix = prefix
        self.namespace = namespace
        self._create_job = client.register_script(_CREATE_JOB)
        self._update_job = client.register_script(_UPDATE_JOB)
        self._count_attempt = client.register_script(_COUNT_ATTEMPT)
        self.blobs = blobs if blobs is not None else open_blobs("", self.c, prefix)
        """Where blob bytes live (torchfarm/storage/blobs.py); the cache Redis unless configured."""

    @classmethod
    def from_url(cls, url: str, prefix: str = "tf", blob_url: str = "", state_url: str = "") -> Store:
        """The store on the cache Redis at `url` and the state Redis at `state_url`
        ("" or the same URL: one Redis plays both)."""
        cache = redisconn.connect(url, socket_timeout=10, socket_connect_timeout=5)
        state = cache
        if state_url and state_url != url:
            state = redisconn.connect(state_url, socket_timeout=10, socket_connect_timeout=5)
        return cls(state, prefix, blobs=open_blobs(blob_url, cache, prefix), cache=cache)

    @property
    def split(self) -> bool:
        """The state and the cache are two Redis clients (two servers or databases)."""
        return self.c is not self.r

    def check_state_redis(self) -> None:
        """Raises RuntimeError if the state Redis may evict: a flood of one tenant's
        artifacts would then evict every tenant's jobs in flight."""
        why = state_eviction(self.r)
        if why is not None:
            raise RuntimeError(
                f"{EVICTING_STATE} ({why}): jobs in flight would be lost under memory "
                "pressure. Point TORCHFARM_STATE_URL at a Redis with maxmemory-policy "
                "noeviction (and persistence), and keep the evicting cache at TORCHFARM_CACHE_URL."
            )

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def tenant(self, namespace: str) -> Store:
        """The same Redis, seen from one tenant namespace ("" is the farm without tokens)."""
        return Store(self.r, self.prefix, namespace, self.blobs, self.c)

    def ref(self, key: str) -> str:
        """How this namespace names `key` in Redis keys and in `tf:recent`."""
        return f"{self.namespace}:{key}" if self.namespace else key

    def _j(self, kind: str, key: str) -> str:
        return self._k(kind, self.ref(key))

    # Blobs and manifests.

    def put_blob(self, digest: str, data: bytes) -> None:
        self.blobs.put(digest, data)

    def get_blob(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)

    def get_blob_range(self, digest: str, start: int, end: int) -> bytes:
        """Bytes [start, end] inclusive, so large blobs stream without one big read."""
        return self.blobs.get_range(digest, start, end)

    def delete_blob(self, digest: str) -> None:
        self.blobs.delete(digest)

    def has_blobs(self, digests: Iterable[str]) -> bool:
        return all(self.blobs.present(digests))

    def put_manifest(
        self, manifest: Manifest, ttl_s: int = 0, created_blobs: Iterable[str] = (), kept_blobs: Iterable[str] = (),
    ) -> None:
        """Writes the manifest (expiring after `ttl_s`, 0: never) and charges it, with
        the blobs it names, to this namespace's stored bytes (torchfarm/storage/usage.py).
        `created_blobs`: those its writer created, which leave the cache with it;
        `kept_blobs`: those an earlier write of this key created, which leave with it
        only while no other entry has named them (`BlobOwners.claim`)."""
        data = manifest.to_json()
        created, kept = set(created_blobs), set(kept_blobs)
        owners = self.blob_owners()
        owners.share(d for d in dict.fromkeys(b.digest for b in manifest.blobs()) if d not in created | kept)
        owned = owners.claim(owners.owner(self.namespace, manifest.key), created, kept)
        self.c.set(self._j("artifact", manifest.key), data, ex=ttl_s or None)
        self.ledger().charge(manifest.key, len(data) + manifest.total_bytes(), owned)

    def ledger(self) -> Ledger:
        """This namespace's stored entries and bytes, in the state Redis."""
        return Ledger(self.r, self.prefix, self.namespace)

    def blob_owners(self) -> BlobOwners:
        """Which entry created each blob that leaves the cache with it, in the state Redis."""
        return BlobOwners(self.r, self.prefix)

    def artifacts_present(self, keys: list[str]) -> list[bool]:
        """For each key, in order, whether its manifest is in the cache."""
        pipe = self.c.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._j("artifact", key))
        return [bool(n) for n in pipe.execute()]

    def cache_memory(self) -> tuple[int, int]:
        """The cache Redis's used memory and its `maxmemory` (0: no limit), in bytes."""
        info = self.c.info("memory")
        return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0) or 0)

    def get_manifest_bytes(self, key: str) -> bytes | None:
        return cast("bytes | None", self.c.get(self._j("artifact", key)))

    def get_manifest(self, key: str) -> Manifest | None:
        """The manifest, if it and every blob it names are in the cache."""
        data = self.get_manifest_bytes(key)
        if data is None:
            return None
        manifest = Manifest.from_json(data)
        if not self.has_blobs(b.digest for b in manifest.blobs()):
            # Evicted under memory pressure: drop the index entry so the key recompiles.
            self.c.delete(self._j("artifact", key))
            return None
        return manifest

    def delete_artifact(self, key: str) -> bool:
        return bool(self.c.delete(self._j("artifact", key)))

    def note_hit(self, key: str) -> None:
        """Counts a cache hit on `key`: one pipelined round trip."""
        sk = self._j("stat", key)
        pipe = self.c.pipeline(transaction=False)
        pipe.hincrby(sk, "hits", 1)
        pipe.hset(sk, "last_hit", time.time())
        pipe.execute()

    def my_artifacts(self) -> list[tuple[str, bytes, dict[str, str]]]:
        """(key, manifest JSON, use stats) of every artifact in this namespace only.

        One SCAN, then one pipelined read of the manifests and their stat hashes. The
        manifests are not parsed here, and their blobs are not checked."""
        pre = self._j("artifact", "")
        keys = [
            name.decode()[len(pre) :]
            for name in self.c.scan_iter(match=pre + "*", count=1000)
        ]
        if not self.namespace:  # the open namespace: not other tenants' `<ns>:<key>`
            keys = [k for k in keys if ":" not in k]
        pipe = self.c.pipeline(transaction=False)
        for key in keys:
            pipe.get(self._j("artifact", key))
            pipe.hgetall(self._j("stat", key))
        replies = pipe.execute()
        out = []
        for i, key in enumerate(keys):
            data, stats = replies[2 * i], replies[2 * i + 1]
            if data is not None:  # evicted between the scan and the read
                out.append((key, data, {k.decode(): v.decode() for k, v in stats.items()}))
        return out

    def evict_artifacts(self, keys: Iterable[str]) -> int:
        """Deletes these artifacts' manifests and use stats; returns how many manifests
        there were. Blobs stay: they are shared by content, between namespaces too."""
        keys = list(keys)
        if not keys:
            return 0
        pipe = self.c.pipeline(transaction=False)
        for key in keys:
            pipe.delete(self._j("artifact", key))
            pipe.delete(self._j("stat", key))
        return sum(pipe.execute()[0::2])

    def artifact_keys(self) -> list[str]:
        pre = self._k("artifact", "")
        return sorted(k.decode()[len(pre) :] for k in self.c.scan_iter(match=pre + "*", count=500))

    # Requests and jobs.

    def put_request(self, key: str, data: bytes, ttl_s: int) -> None:
        self.r.set(self._j("req", key), data, ex=ttl_s)

    def get_request(self, key: str) -> bytes | None:
        return cast("bytes | None", self.r.get(self._j("req", key)))

    def create_job(
        self, key: str, queue: str, label: str, ttl_s: int,
        *, request: bytes = b"", kind: str = "req",
    ) -> bool:
        """Creates the job record unless one exists; True when this call created it.

        HSETNX on one field is the lease: of concurrent identical submits exactly one
        creates the job and enqueues it, the others join it. It runs in one Lua script
        with the rest of the record, its TTL and the request the worker will read
        (`tf:<kind>:<key>`, "req" or "kreq"), so a coordinator killed part way leaves
        no job or a whole one: never a lease whose record says nothing, which every
        later submit would join for ever. The request expires with the record: a job
        no worker takes frees its tenant's quota then, and must free the state Redis
        of its request too.
        """
        created = self._create_job(
            keys=[self._j("job", key), self._j(kind, key), self._k("recent"), self.job_channel(key)],
            args=[
                time.time(), JobState.QUEUED, queue, label, ttl_s, request,
                self.ref(key), RECENT_JOBS - 1,
            ],
        )
        if created and label:
            # In the cache, beside the artifact it names (for `torchfarm cache ls`): the
            # label outlives the job record, and losing it loses no job.
            self.c.hset(self._j("stat", key), "label", label)
        return bool(created)

    def get_job(self, key: str) -> JobRecord | None:
        h = cast("dict[bytes, bytes]", self.r.hgetall(self._j("job", key)))
        return JobRecord.from_hash(key, h) if h and b"state" in h else None

    def update_job(self, key: str, **fields: object) -> None:
        """Writes fields of the job record, if it has not expired: one written again would
        have no TTL, in the Redis that never evicts. A job that moves on keeps its record
        and request for another TTL from now (a job queued most of its TTL, then
        compiling, lost both mid-run). A job that ends (SUCCEEDED, or FAILED, which is
        never retried) drops its request in the same round trip: nothing reads it again,
        and a resubmit after the record expires stores it anew."""
        pairs: list[Any] = []
        for name, value in {**fields, "updated": time.time()}.items():
            if value is not None:
                pairs += [name, json.dumps(value) if isinstance(value, (dict, list)) else value]
        ends = "1" if fields.get("state") in JobState.TERMINAL else "0"
        self._update_job(
            keys=[self._j("job", key), self._j("req", key), self._j("kreq", key), self.job_channel(key)],
            args=[ends, *pairs],
        )

    def job_channel(self, key: str) -> str:
        """The pub/sub channel on which every change of the job's record is announced, so
        a watcher reads the record when it changes instead of polling it
        (services/coordinator/jobevents.py). Changes made by the staged compile's Lua
        scripts (kernel counts, workers/board.py) are not announced; the watcher's slow
        poll picks those up."""
        return self._j("jobev", key)

    def incr_attempts(self, key: str, counter: str = Attempts.JOB) -> int:
        """Counts a delivery of the job (or of one of its stage jobs: `counter`); 0 when
        its record has expired."""
        return int(self._count_attempt(keys=[self._j("job", key), self.job_channel(key)], args=[counter]))

    def expire_job(self, key: str, ttl_s: int) -> None:
        self.r.expire(self._j("job", key), ttl_s)

    def fail_job(self, key: str, code: str, message: str, ttl_s: int) -> None:
        """Ends a job as FAILED with the stable `code`; the record is kept `ttl_s` more."""
        self.update_job(
            key, state=JobState.FAILED, error_code=code, message=message[-MAX_JOB_MESSAGE_CHARS:]
        )
        self.expire_job(key, ttl_s)

    def delete_job(self, key: str) -> None:
        pipe = self.r.pipeline()
        pipe.delete(self._j("job", key))
        pipe.publish(self.job_channel(key), "deleted")
        pipe.execute()

    def abandon_job(self, key: str) -> None:
        """Undoes `create_job` for a job never sent: its record, its request and its label.
        A refused compile must leave nothing in the state Redis, which never evicts."""
        pipe = self.r.pipeline()
        pipe.delete(self._j("job", key), self._j("req", key), self._j("kreq", key))
        pipe.publish(self.job_channel(key), "deleted")
        pipe.execute()
        self.c.hdel(self._j("stat", key), "label")  # the hash goes with its last field

    def recent_jobs(self) -> list[JobRecord]:
        """The latest jobs: in a tenant view only its own, in the root view all (keyed by ref)."""
        recent = cast("list[bytes]", self.r.lrange(self._k("recent"), 0, RECENT_JOBS - 1))
        refs = [k.decode() for k in recent]
        if self.namespace:
            mine = self.namespace + ":"
            refs = [r[len(mine) :] for r in refs if r.startswith(mine)]
        jobs = (self.get_job(k) for k in dict.fromkeys(refs))
        return [j for j in jobs if j is not None]

    # Per-tenant quota of queued and running jobs.

    def note_job(self, tenant: str, key: str, ttl_s: int, weight: int = 1) -> int:
        """Counts the job against the tenant `weight` times (a DTensor graph whose rank
        check traces several ranks: `keys.traced_ranks`); returns how many the tenant
        now has in flight, so counted."""
        zk = self._k("inflight", tenant or "-")
        ref, now = self.ref(key), time.time()
        pipe = self.r.pipeline()
        pipe.zadd(zk, {ref: now, **{f"{ref}#{i}": now for i in range(2, weight + 1)}})
        pipe.expire(zk, ttl_s)
        pipe.execute()
        return self.jobs_in_flight(tenant)

    def forget_job(self, tenant: str, key: str) -> None:
        zk, ref = self._k("inflight", tenant or "-"), self.ref(key)
        mine = [m for m in cast("list[bytes]", self.r.zrange(zk, 0, -1)) if m.decode().split("#")[0] == ref]
        if mine:
            self.r.zrem(zk, *mine)

    def jobs_in_flight(self, tenant: str) -> int:
        """The tenant's jobs still queued or running. Entries whose record finished or
        expired (a lost worker, a Redis restart) are dropped as they are found."""
        zk = self._k("inflight", tenant or "-")
        refs = [r.decode() for r in cast("list[bytes]", self.r.zrange(zk, 0, -1))]
        if not refs:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for ref in refs:
            pipe.hget(self._k("job", ref.split("#")[0]), "state")
        states = pipe.execute()
        done = [r for r, st in zip(refs, states, strict=False) if st is None or st.decode() in JobState.TERMINAL]
        if done:
            self.r.zrem(zk, *done)
        return len(refs) - len(done)

    def job_states(self) -> list[tuple[str, str]]:
        """(queue, state) of every job record, for the metrics: one SCAN, one pipelined read.

        Records expire (finished ones after an hour), so this stays proportional to the
        recent load, not to the cache's size.
        """
        names = list(self.r.scan_iter(match=self._k("job", "*"), count=1000))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, "queue", "state")
        return [(q.decode(), s.decode()) for q, s in pipe.execute() if q and s]

    # Workers.

    def heartbeat(
        self,
        name: str,
        queues: list[str],
        build: str,
        ttl_s: int,
        targets: dict[str, list[str]] | None = None,
        fingerprint: dict[str, str] | None = None,
        sandbox: str | None = None,
        triton: str | None = None,
    ) -> None:
        """Registers (or renews) a worker until `ttl_s` passes without another beat.

        `targets` maps each target it serves ("cuda:sm_90") to the job kinds it takes
        there ("graph", "kernel"); `fingerprint` is its build (torch, Triton, Python,
        platform, ISA, compiler), so a client compiling for a fleet it is not on can
        ask for exactly what that fleet's workers build (docs/targets.md). `sandbox` is
        where its compiles run (workers/sandbox/process.py): anything but "bwrap" is degraded.
        `triton` is the Triton version its kernel jobs compile with, for a worker that
        takes them (a CPU target's build names none).
        """
        record: dict[str, object] = {"queues": queues, "build": build, "seen": time.time()}
        if targets is not None:
            record["targets"] = targets
        if fingerprint is not None:
            record["fingerprint"] = fingerprint
        if sandbox is not None:
            record["sandbox"] = sandbox
        if triton is not None:
            record["triton"] = triton
        self.r.set(self._k("worker", name), json.dumps(record), ex=ttl_s)
        # When each queue last had a live worker: a pool scaled to zero stays known.
        self.r.zadd(self._k("queues-seen"), {q: cast(float, record["seen"]) for q in queues})

    def queues_seen_since(self, since: float) -> set[str]:
        """Queues some worker consumed at `since` (a time.time()) or later, live or not."""
        seen = cast("list[bytes]", self.r.zrangebyscore(self._k("queues-seen"), since, "+inf"))
        return {q.decode() for q in seen}

    def queues_seen(self) -> dict[str, float]:
        """Each queue some worker ever consumed → when one last did (a time.time())."""
        seen = cast("list[tuple[bytes, float]]", self.r.zrange(self._k("queues-seen"), 0, -1, withscores=True))
        return {q.decode(): when for q, when in seen}

    def forget_worker(self, name: str) -> None:
        self.r.delete(self._k("worker", name))

    def live_workers(self) -> dict[str, dict[str, Any]]:
        pre = self._k("worker", "")
        names = [k.decode() for k in self.r.scan_iter(match=pre + "*", count=500)]
        values = self.r.mget(names) if names else []
        return {n[len(pre) :]: json.loads(v) for n, v in zip(names, values, strict=False) if v is not None}

    # Triton kernels: request, then blobs, then the kernel record (last, as artifacts).
    # Per namespace, like artifacts; the blobs are shared by content.

    def put_kernel_request(self, key: str, data: bytes, ttl_s: int) -> None:
        self.r.set(self._j("kreq", key), data, ex=ttl_s)

    def get_kernel_request(self, key: str) -> bytes | None:
        return cast("bytes | None", self.r.get(self._j("kreq", key)))

    def put_kernel(self, manifest: Manifest) -> None:
        """A compiled Triton kernel's manifest (torchfarm/kernels/kernel_artifact.py), after its blobs."""
        self.c.set(self._j("kernel", manifest.key), manifest.to_json())

    def get_kernel(self, key: str) -> Manifest | None:
        """The kernel's manifest, if it and the blobs it names are in the cache."""
        data = cast("bytes | None", self.c.get(self._j("kernel", key)))
        if data is None:
            return None
        try:
            manifest = Manifest.from_json(data)
            if manifest.kind != KERNEL or manifest.key != key or len(manifest.kernels) != 1:
                raise ManifestError(f"a {manifest.kind!r} for key {manifest.key[:12]}")
        except ManifestError as e:
            # Redis is storage: an unreadable record (or one from before kernels had
            # manifests) is a miss, compiled again, not an error for every later request.
            log.warning("kernel %s has an unreadable record (%s); recompiling", key[:12], str(e)[:80])
            self.delete_kernel(key)
            return None
        if not self.has_blobs([b.digest for b in manifest.blobs()]):
            self.delete_kernel(key)  # evicted: recompile
            return None
        return manifest

    def delete_kernel(self, key: str) -> None:
        self.c.delete(self._j("kernel", key))

    def cache_bytes(self) -> int:
        """Bytes used by the Redis that holds the cache (all of it, as Redis reports)."""
        return int(self.c.info("memory").get("used_memory", 0))
