"""Redis records of the staged compile pipeline (workers/pipeline.py): the fleet-wide
kernel cache, each staged job's plan, and the barrier that starts its assembly.

Keys, under the store's prefix:

- `tf:kbin:<key>`: a compiled C++ kernel, JSON `{"binary": {digest, size}, "worker",
  "seconds"}`; the bytes are a blob (`tf:blob:<sha256>`). `<key>` is `kernel_cache_key`:
  the kernel's spec, the exact target and the build that compiled it. Fleet-wide by
  default: a worker writes it from a spec its own lowering produced, so every graph
  that holds the same kernel, from any client, reuses the binary. A tenant then sees in
  its kernel-hit counts that some other compile had a kernel of the same source; a farm
  whose tenants must not learn that sets `TORCHFARM_KERNEL_CACHE_SCOPE=tenant`, which
  adds the tenant's namespace to the key.
- `tf:plan:<ref>`: what a staged job's lowering produced (payload and kernel spec blobs,
  shape guards, stage timings), until assembly turns it into the manifest (TTL).
- `tf:pending:<ref>`: the kernel cache keys the job still waits for, plus the member
  `LOWERING` while its lowering job runs. Kernel builds are sent while the lowering is
  still running (each kernel as Inductor asks for it), so the set can hold real keys
  before the job knows all of them; the lowering job removes `LOWERING` when it ends
  (`close_lowering`). Each kernel-build job removes its keys once their binaries are
  stored, and whichever removal empties the set sends the assembly job. Nothing waits
  on anything: a farm of one worker cannot deadlock.

`<ref>` is the job's key in its namespace (`Store.ref`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from torchfarm.manifest import BlobRef
from torchfarm.store import Store

KERNEL_CACHE_FORMAT = "torchfarm.kernel-cache/1"
"""Enters every kernel cache key; change it to orphan every cached binary."""

PLAN_FORMAT = "torchfarm.plan/1"
"""Schema of `tf:plan:<ref>`."""

LOWERING = "lowering"
"""The pending set's member while the job's lowering runs (never a cache key: those are
hex digests)."""

_RELEASE = """
local removed = redis.call('SREM', KEYS[1], unpack(ARGV, 4))
if removed > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'kernels_done', removed)
  redis.call('HINCRBY', KEYS[2], 'kernels_hit', math.min(removed, tonumber(ARGV[2])))
  redis.call('HINCRBYFLOAT', KEYS[2], 'k_busy', ARGV[3])
  redis.call('HSET', KEYS[2], 'k_ended', ARGV[1], 'updated', ARGV[1])
end
return redis.call('SCARD', KEYS[1])
"""
"""Removes finished kernel keys from a job's pending set and counts them on its job
record, atomically; returns how many are still pending. ARGV: now, cache hits among
them, build seconds, then the keys."""

_CLOSE = """
local n_strays = tonumber(ARGV[5])
if n_strays > 0 then
  redis.call('SREM', KEYS[1], unpack(ARGV, 6, 5 + n_strays))
end
if #ARGV > 5 + n_strays then
  redis.call('SADD', KEYS[1], unpack(ARGV, 6 + n_strays))
end
redis.call('SREM', KEYS[1], ARGV[4])
local left = redis.call('SCARD', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
local total = tonumber(ARGV[2])
redis.call('HSET', KEYS[2], 'kernels_total', total, 'kernels_done', total - left)
redis.call('HINCRBY', KEYS[2], 'kernels_hit', ARGV[3])
return left
"""
"""Ends the lowering's hold on a job's pending set, atomically: drops the kernels sent
while lowering that the artifact does not load (strays), adds the ones still to build,
removes `LOWERING`, and sets the job's kernel counts; returns how many are pending.
ARGV: TTL, total kernels, cache hits, `LOWERING`, the number of strays, the strays, the
misses."""


def kernel_cache_key(
    spec: bytes, target: str, build: dict[str, str], tenant: str | None = None
) -> str:
    """The content address of one kernel's binary: its spec (source text and every
    option that enters Inductor's own key), the exact target, and the build that
    compiles it (torch version and git hash, Python, platform, ISA, C++ compiler);
    and the tenant's namespace, for a cache scoped to each tenant."""
    body: dict[str, Any] = {
        "format": KERNEL_CACHE_FORMAT,
        "spec": hashlib.sha256(spec).hexdigest(),
        "target": target,
        "build": dict(sorted(build.items())),
    }
    if tenant is not None:
        body["tenant"] = tenant
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class PlannedKernel:
    name: str
    """`sdk.loader.kernel_name` of the spec, as in the manifest."""
    kind: str
    source: BlobRef
    """The spec's blob."""
    cache_key: str


@dataclass
class Plan:
    """What lowering hands to the kernel builds and the assembly."""

    payload: BlobRef
    kernels: list[PlannedKernel]
    target: str
    guards: list[Any] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Stage records so far (workers/pipeline.py `stage_record`)."""
    timings: dict[str, float] = field(default_factory=dict)
    sends: list[list[Any]] = field(default_factory=list)
    """Each kernel-build job the lowering sent: [seconds after the lowering began, its
    cache keys]. Those sent before `lowered_after` overlapped the lowering."""
    lowered_after: float = 0.0
    """Seconds from the lowering's start to its end (the barrier's release)."""

    def to_json(self) -> bytes:
        body = asdict(self)
        body["format"] = PLAN_FORMAT
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        body = json.loads(data)
        if body.get("format") != PLAN_FORMAT:
            raise ValueError(f"unknown plan format {body.get('format')!r}")
        return cls(
            payload=BlobRef(**body["payload"]),
            kernels=[
                PlannedKernel(k["name"], k["kind"], BlobRef(**k["source"]), k["cache_key"])
                for k in body["kernels"]
            ],
            target=body["target"],
            guards=body["guards"],
            stages=body["stages"],
            timings={k: float(v) for k, v in body["timings"].items()},
            sends=body.get("sends", []),
            lowered_after=float(body.get("lowered_after", 0.0)),
        )


class StageBoard:
    """The staged pipeline's Redis records, seen from one tenant's `Store` view."""

    def __init__(self, store: Store):
        self.store = store
        self.r = store.r
        self._release = self.r.register_script(_RELEASE)
        self._close = self.r.register_script(_CLOSE)

    def _k(self, *parts: str) -> str:
        return ":".join((self.store.prefix, *parts))

    def _job(self, key: str) -> str:
        return self._k("job", self.store.ref(key))

    # The kernel cache (shared by all tenants).

    def cached_binaries(self, cache_keys: list[str]) -> dict[str, BlobRef]:
        """The cached binary of each key that has one whose blob is still there."""
        if not cache_keys:
            return {}
        records = self.r.mget([self._k("kbin", k) for k in cache_keys])
        found = {}
        for key, data in zip(cache_keys, records):
            if data is not None:
                found[key] = BlobRef(**json.loads(data)["binary"])
        present = self.r.pipeline(transaction=False)
        for ref in found.values():
            present.exists(self._k("blob", ref.digest))
        alive = present.execute()
        return {k: ref for (k, ref), ok in zip(found.items(), alive) if ok}

    def put_binary(self, cache_key: str, binary: bytes, worker: str, seconds: float) -> BlobRef:
        """Stores a built kernel: blob first, then its record, so a record names a blob."""
        from torchfarm.manifest import blob_digest

        ref = BlobRef(blob_digest(binary), len(binary))
        self.store.put_blob(ref.digest, binary)
        record = {"binary": asdict(ref), "worker": worker, "seconds": round(seconds, 3)}
        self.r.set(self._k("kbin", cache_key), json.dumps(record, sort_keys=True))
        return ref

    def build_seconds(self, cache_keys: list[str]) -> dict[str, float]:
        """How long each cached kernel took to build, where it is cached."""
        records = self.r.mget([self._k("kbin", k) for k in cache_keys]) if cache_keys else []
        return {k: float(json.loads(d)["seconds"]) for k, d in zip(cache_keys, records) if d}

    def forget_binary(self, cache_key: str) -> None:
        self.r.delete(self._k("kbin", cache_key))

    # A staged job's plan and its barrier.

    def open_lowering(self, key: str, ttl_s: int) -> None:
        """Starts a lowering's hold on the job's pending set (a redelivered lowering
        starts afresh): the set holds only `LOWERING`, and the kernel counts are zero."""
        pk, job = self._k("pending", self.store.ref(key)), self._job(key)
        pipe = self.r.pipeline()
        pipe.delete(pk)
        pipe.sadd(pk, LOWERING)
        pipe.expire(pk, ttl_s)
        pipe.hdel(job, "k_sent", "k_started", "k_ended", "k_busy")
        pipe.hset(job, mapping={"kernels_total": 0, "kernels_done": 0, "kernels_hit": 0})
        pipe.execute()

    def add_streamed(self, key: str, cache_keys: list[str], ttl_s: int) -> None:
        """Kernels sent to be built while the lowering runs: pending, and counted in the
        job's total so far (`close_lowering` sets the exact total)."""
        pk, job = self._k("pending", self.store.ref(key)), self._job(key)
        pipe = self.r.pipeline()
        pipe.sadd(pk, *cache_keys)
        pipe.expire(pk, ttl_s)
        pipe.hincrby(job, "kernels_total", len(cache_keys))
        pipe.hsetnx(job, "k_sent", time.time())
        pipe.execute()

    def close_lowering(
        self, key: str, total: int, hits: int, strays: list[str], misses: list[str], ttl_s: int
    ) -> int:
        """Ends the lowering's hold (`_CLOSE`); returns how many kernels are pending.
        0 means: send the assembly."""
        if misses:
            self.r.hsetnx(self._job(key), "k_sent", time.time())
        return int(
            self._close(
                keys=[self._k("pending", self.store.ref(key)), self._job(key)],
                args=[ttl_s, total, hits, LOWERING, len(strays), *strays, *misses],
            )
        )

    def put_plan(self, key: str, plan: Plan, ttl_s: int) -> None:
        """Writes what the assembly needs; before `close_lowering`, which can send it."""
        self.r.set(self._k("plan", self.store.ref(key)), plan.to_json(), ex=ttl_s)

    def get_plan(self, key: str) -> Plan | None:
        data = self.r.get(self._k("plan", self.store.ref(key)))
        return Plan.from_json(data) if data is not None else None

    def add_pending(self, key: str, cache_keys: list[str], ttl_s: int) -> None:
        pk = self._k("pending", self.store.ref(key))
        pipe = self.r.pipeline()
        pipe.sadd(pk, *cache_keys)
        pipe.expire(pk, ttl_s)
        pipe.execute()

    def pending(self, key: str) -> set[str]:
        return {m.decode() for m in self.r.smembers(self._k("pending", self.store.ref(key)))}

    def release(self, key: str, cache_keys: list[str], hits: int, busy_s: float) -> int:
        """Marks these kernels of the job done; returns how many it still waits for.
        0 means: send the assembly (a redelivered batch may see 0 again; assembly is
        idempotent)."""
        return int(
            self._release(
                keys=[self._k("pending", self.store.ref(key)), self._job(key)],
                args=[time.time(), hits, busy_s, *cache_keys],
            )
        )

    def note_kernel_start(self, key: str, worker: str) -> None:
        """The first kernel job's start (HSETNX), and which workers built the job's kernels."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hsetnx(self._job(key), "k_started", time.time())
        pipe.hset(self._job(key), f"kworker:{worker}", 1)
        pipe.execute()

    def count(self, key: str, name: str) -> int:
        """Increments a counter on the job record (attempts of one stage job)."""
        return int(self.r.hincrby(self._job(key), name, 1))

    def job_fields(self, key: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(self._job(key)).items()}

    def clear(self, key: str) -> None:
        self.r.delete(self._k("plan", self.store.ref(key)), self._k("pending", self.store.ref(key)))
