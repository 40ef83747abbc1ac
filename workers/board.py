"""Redis records of the staged compile pipeline (workers/jobs/): the fleet-wide
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
- `tf:decomp:<ref>`: a staged job's decomposition (workers/aot_seam.py): AOTAutograd's
  forward and backward graphs in the graph format and a JSON head, from the
  decomposition job to the lowering job (TTL).
- `tf:plan:<ref>`: what a staged job's lowering produced (payload and kernel spec blobs,
  shape guards, stage timings), until assembly turns it into the manifest (TTL).
- `tf:pending:<ref>`: the kernel cache keys the job still waits for, plus the member
  `LOWERING` while its lowering job runs. Kernel builds are sent while the lowering is
  still running (each kernel as Inductor asks for it), so the set can hold real keys
  before the job knows all of them; the lowering job removes `LOWERING` when it ends
  (`close_lowering`). Each kernel-build job removes its keys once their binaries are
  stored, and whichever removal empties the set sends the assembly job. Nothing waits
  on anything: a farm of one worker cannot deadlock. A lowering that gives way to the
  whole-graph compile leaves the set holding only `ABANDONED`, which no build removes,
  so builds it had already sent cannot start an assembly.
- `tf:kclaim:<key>` and `tf:kwait:<key>`: one build per kernel across the jobs in
  flight. The first job that needs a kernel the cache lacks claims it (SET NX) and sends
  its build; a job that finds it claimed joins its waiters instead, with the key in its
  own pending set. The build job that stores the binary then releases every waiter's
  pending set as it releases its own (`settle`). A build job that ends without the
  binary (its job failed, or it did) passes the claim, if its job still holds it, to
  one waiter, which sends a build of its own (`hand_over`). A claim lapses after the
  broker's visibility timeout. Claims and waiters are keyed like the kernel cache, so
  they are fleet-wide or per tenant with it; a waiter is named `[namespace, job key,
  target]`.

`<ref>` is the job's key in its namespace (`Store.ref`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from redis.typing import EncodableT, FieldT

from torchfarm.storage.store import Store
from torchfarm.trust.seal import Seal, TamperedRecord
from torchfarm.wire.manifest import BlobRef

log = logging.getLogger(__name__)

KERNEL_CACHE_FORMAT = "torchfarm.kernel-cache/1"
"""Enters every kernel cache key; change it to orphan every cached binary."""

PLAN_FORMAT = "torchfarm.plan/1"
"""Schema of `tf:plan:<ref>`."""

LOWERING = "lowering"
"""The pending set's member while the job's lowering runs (never a cache key: those are
hex digests)."""

ABANDONED = "abandoned"
"""The pending set's only member after its lowering gave way: no assembly may follow."""

CACHED, BUILD, WAIT = 0, 1, 2
"""`StageBoard.claim`'s verdict on a kernel: cached meanwhile, this job builds it, or
another job in flight builds it."""

_CLAIM = """
local pending, out, n = KEYS[1], {}, (#KEYS - 1) / 2
for i = 0, n - 1 do
  local claim, waiters = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  if ARGV[4 + n + i] == '1' then
    out[i + 1] = 0
  else
    redis.call('SADD', pending, ARGV[4 + i])
    if redis.call('SET', claim, ARGV[1], 'NX', 'EX', ARGV[3])
        or redis.call('GET', claim) == ARGV[1] then
      out[i + 1] = 1
    else
      redis.call('SADD', waiters, ARGV[1])
      redis.call('EXPIRE', waiters, ARGV[2])
      out[i + 1] = 2
    end
  end
end
redis.call('EXPIRE', pending, ARGV[2])
return out
"""
"""For each kernel, atomically: cached (0), or pending for the job and either claimed by
it (1) or joined as a waiter of the job that holds the claim (2). A job's own claim
counts as claimed by it: a redelivered lowering cannot know whether its first delivery
sent the build before its worker was lost, so it sends it again. KEYS: the pending set,
then kclaim, kwait of each kernel. ARGV: the waiter name, the TTL of the pending set and
the waiters, the claim's TTL, the keys, then '1' for each kernel the cache holds.

The kernel cache is in the cache Redis and the claims in the state Redis
(torchfarm/storage/store.py), so whether a kernel is cached is read just before the script: a
binary stored in between and settled before the script runs is claimed again, which
costs one more build of it and never a job that waits for ever."""

_SETTLE = """
local waiters = redis.call('SMEMBERS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
return waiters
"""
"""A claimed kernel's binary is stored: ends the claim and returns its waiters."""

_HAND_OVER = """
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[2] then
  return false
end
local heir = redis.call('SPOP', KEYS[2])
if heir then
  redis.call('SET', KEYS[1], heir, 'EX', ARGV[1])
else
  redis.call('DEL', KEYS[1])
end
return heir
"""
"""A kernel's build ended without its binary: if the claim is the ending job's (ARGV[2])
or has expired, one waiter takes it over. A claim that already passed to another job
stays with it."""

_RELEASE = """
local removed = redis.call('SREM', KEYS[1], unpack(ARGV, 4))
if removed > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'kernels_done', removed)
  redis.call('HINCRBY', KEYS[2], 'kernels_hit', math.min(removed, tonumber(ARGV[2])))
  redis.call('HINCRBYFLOAT', KEYS[2], 'k_busy', ARGV[3])
  redis.call('HSET', KEYS[2], 'k_ended', ARGV[1], 'updated', ARGV[1])
end
return {removed, redis.call('SCARD', KEYS[1])}
"""
"""Removes finished kernel keys from a job's pending set and counts them on its job
record, atomically; returns how many it removed and how many are still pending. ARGV:
now, cache hits among them, build seconds, then the keys."""

_CLOSE = """
local n_strays = tonumber(ARGV[6])
if n_strays > 0 then
  redis.call('SREM', KEYS[1], unpack(ARGV, 7, 6 + n_strays))
end
redis.call('SREM', KEYS[1], ARGV[4])
local left = redis.call('SCARD', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  if ARGV[5] ~= '' then
    redis.call('HSETNX', KEYS[2], 'k_sent', ARGV[5])
  end
  local total = tonumber(ARGV[2])
  redis.call('HSET', KEYS[2], 'kernels_total', total, 'kernels_done', total - left)
  redis.call('HINCRBY', KEYS[2], 'kernels_hit', ARGV[3])
end
return left
"""
"""Ends the lowering's hold on a job's pending set, atomically: drops the kernels sent
while lowering that the artifact does not load (strays), removes `LOWERING`, sets the
job's kernel counts (on a record that still exists) and, if it now sends builds, when
the first were sent; returns how many are pending. ARGV: TTL, total kernels, cache hits,
`LOWERING`, now or "" (no builds sent), the number of strays, the strays."""


_NOTE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 3 do
  local op, name, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if op == 'set' then
    redis.call('HSET', KEYS[1], name, value)
  elseif op == 'setnx' then
    redis.call('HSETNX', KEYS[1], name, value)
  elseif op == 'incr' then
    redis.call('HINCRBY', KEYS[1], name, value)
  elseif op == 'del' then
    redis.call('HDEL', KEYS[1], name)
  end
end
return 1
"""
"""Writes a job record's fields only while the record exists: a write to one that
expired would make it again with no TTL, in the state Redis, which never evicts. ARGV:
triples of op (set, setnx, incr, del), field, value."""


def waiter_name(namespace: str, key: str, target: str) -> str:
    """How a job is named among a kernel's claim and waiters: enough to release its
    pending set and send its assembly."""
    return json.dumps([namespace, key, target])


def parse_waiter(name: str) -> tuple[str, str, str]:
    namespace, key, target = json.loads(name)
    return namespace, key, target


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
    """`torchfarm.fx.cpp_kernels.kernel_name` of the spec, as in the manifest."""
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
    """Stage records so far (workers/jobs/ `stage_record`)."""
    timings: dict[str, float] = field(default_factory=dict)
    sends: list[list[Any]] = field(default_factory=list)
    """Each kernel-build job the lowering sent: [seconds after the lowering began, its
    cache keys]. Those sent before `lowered_after` overlapped the lowering."""
    lowered_after: float = 0.0
    """Seconds from the lowering's start to its end (the barrier's release)."""
    autotune: list[dict[str, Any]] = field(default_factory=list)
    """The lowering's Triton autotune records (torchfarm/fx/autotune.py), for the manifest."""

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
            autotune=body.get("autotune", []),
        )


class StageBoard:
    """The staged pipeline's Redis records, seen from one tenant's `Store` view.

    With a `seal`, every record a worker acts on (plan, decomposition, kernel-cache
    record) is sealed where it is written and checked where it is read: a plan or
    decomposition without a valid seal raises `TamperedRecord` (or reads as absent), a
    kernel-cache record without one reads as a miss, so the kernel is built again."""

    def __init__(self, store: Store, seal: Seal | None = None):
        self.store = store
        self.seal = seal
        self.r = store.r
        self.cache = store.c
        """Where the kernel cache (`kbin`) lives; every other record is in `r`, the state."""
        self._release = self.r.register_script(_RELEASE)
        self._close = self.r.register_script(_CLOSE)
        self._claim = self.r.register_script(_CLAIM)
        self._settle = self.r.register_script(_SETTLE)
        self._hand_over = self.r.register_script(_HAND_OVER)
        self._note = self.r.register_script(_NOTE)

    def _k(self, *parts: str) -> str:
        return ":".join((self.store.prefix, *parts))

    def _job(self, key: str) -> str:
        return self._k("job", self.store.ref(key))

    # The kernel cache (shared by all tenants).

    def cached_kernels(self, cache_keys: list[str]) -> dict[str, tuple[BlobRef, float]]:
        """The cached binary of each key that has one whose blob is still there, with
        the seconds its build took."""
        if not cache_keys:
            return {}
        records = self.cache.mget([self._k("kbin", k) for k in cache_keys])
        found = {}
        for key, data in zip(cache_keys, records, strict=False):
            if data is not None:
                record = json.loads(data)
                ref = BlobRef(**record["binary"])
                if not self._sealed_binary(key, ref, record.get("mac")):
                    continue
                found[key] = (ref, float(record["seconds"]))
        alive = self.store.blobs.present(ref.digest for ref, _ in found.values())
        return {k: kernel for (k, kernel), ok in zip(found.items(), alive, strict=False) if ok}

    def cached_binaries(self, cache_keys: list[str]) -> dict[str, BlobRef]:
        """The cached binary of each key that has one whose blob is still there."""
        return {k: ref for k, (ref, _) in self.cached_kernels(cache_keys).items()}

    def put_binary(self, cache_key: str, binary: bytes, worker: str, seconds: float) -> BlobRef:
        """Stores a built kernel: blob first, then its record, so a record names a blob."""
        from torchfarm.wire.manifest import blob_digest

        ref = BlobRef(blob_digest(binary), len(binary))
        self.store.put_blob(ref.digest, binary)
        record = {"binary": asdict(ref), "worker": worker, "seconds": round(seconds, 3)}
        if self.seal is not None:
            record["mac"] = self.seal.mac("kbin", cache_key, ref.digest, str(ref.size))
        self.cache.set(self._k("kbin", cache_key), json.dumps(record, sort_keys=True))
        return ref

    def _sealed_binary(self, cache_key: str, ref: BlobRef, mac: str | None) -> bool:
        if self.seal is None:
            return True
        try:
            self.seal.check(mac, "kbin", cache_key, ref.digest, str(ref.size))
        except TamperedRecord:
            log.error("kernel cache record %s carries no valid seal; it is built again", cache_key[:12])
            return False
        return True

    def forget_binaries(self, cache_keys: list[str]) -> None:
        if cache_keys:
            self.cache.delete(*(self._k("kbin", k) for k in cache_keys))

    # One build per kernel across the jobs in flight.

    def claim(
        self, key: str, waiter: str, cache_keys: list[str], ttl_s: int, claim_ttl_s: int
    ) -> list[int]:
        """Makes the job `key` wait for these kernels (`_CLAIM`): each one's verdict,
        `CACHED`, `BUILD` (send its build) or `WAIT` (another job's build releases it).
        `waiter` is `waiter_name` of the job. A claim lapses after `claim_ttl_s`, so one
        whose build job was never sent (its worker lost in between) does not hold
        later compiles of that kernel; a lapsed claim only risks a second build."""
        if not cache_keys:
            return []
        kernel_keys = [name for k in cache_keys for name in (self._k("kclaim", k), self._k("kwait", k))]
        pipe = self.cache.pipeline(transaction=False)
        for k in cache_keys:
            pipe.exists(self._k("kbin", k))
        cached = ["1" if n else "0" for n in pipe.execute()]
        return [int(v) for v in self._claim(
            keys=[self._k("pending", self.store.ref(key)), *kernel_keys],
            args=[waiter, ttl_s, claim_ttl_s, *cache_keys, *cached],
        )]

    def settle(self, cache_key: str) -> list[str]:
        """The kernel's binary is stored: ends its claim; returns its waiters."""
        return [w.decode() for w in self._settle(
            keys=[self._k("kclaim", cache_key), self._k("kwait", cache_key)]
        )]

    def hand_over(self, cache_key: str, owner: str, ttl_s: int) -> str | None:
        """The build of the job named `owner` ended without the kernel's binary: one
        waiter, if any, now holds the claim and must send the build (its name is
        returned)."""
        heir = self._hand_over(
            keys=[self._k("kclaim", cache_key), self._k("kwait", cache_key)], args=[ttl_s, owner]
        )
        return heir.decode() if heir else None

    # A staged job's plan and its barrier.

    def open_lowering(self, key: str, ttl_s: int) -> None:
        """Starts a lowering's hold on the job's pending set (a redelivered lowering
        starts afresh): the set holds only `LOWERING`, and the kernel counts are zero."""
        pk = self._k("pending", self.store.ref(key))
        pipe = self.r.pipeline()
        pipe.delete(pk)
        pipe.sadd(pk, LOWERING)
        pipe.expire(pk, ttl_s)
        pipe.execute()
        self._note_job(
            key, *(("del", name, "") for name in ("k_sent", "k_started", "k_ended", "k_busy")),
            *(("set", name, 0) for name in ("kernels_total", "kernels_done", "kernels_hit")),
        )

    def abandon_lowering(self, key: str, ttl_s: int) -> None:
        """The lowering gave way: the pending set holds only `ABANDONED`, so the builds
        it had sent only fill the kernel cache."""
        pk = self._k("pending", self.store.ref(key))
        pipe = self.r.pipeline()
        pipe.delete(pk)
        pipe.sadd(pk, ABANDONED)
        pipe.expire(pk, ttl_s)
        pipe.execute()

    def note_waiting(self, key: str, kernels: int, sent: bool) -> None:
        """Counts kernels the job now waits for in its total so far (`close_lowering`
        sets the exact total); `sent`: it sent build jobs for some."""
        sending = [("setnx", "k_sent", time.time())] if sent else []
        self._note_job(key, ("incr", "kernels_total", kernels), *sending)

    def close_lowering(
        self, key: str, total: int, hits: int, strays: list[str], sends_builds: bool, ttl_s: int
    ) -> int:
        """Ends the lowering's hold (`_CLOSE`); returns how many kernels are pending.
        0 means: send the assembly. `sends_builds`: the lowering sends build jobs now."""
        sent = time.time() if sends_builds else ""
        return int(
            self._close(
                keys=[self._k("pending", self.store.ref(key)), self._job(key)],
                args=[ttl_s, total, hits, LOWERING, sent, len(strays), *strays],
            )
        )

    def put_decomposition(self, key: str, fields: dict[str, bytes], ttl_s: int) -> None:
        """Writes a decomposition's hash fields (`Decomposition.to_fields`), whole."""
        name = self._k("decomp", self.store.ref(key))
        if self.seal is not None:
            fields = {**fields, "mac": self._decomposition_mac(key, fields).encode()}
        pipe = self.r.pipeline()
        pipe.delete(name)
        pipe.hset(name, mapping=cast("dict[FieldT, EncodableT]", fields))
        pipe.expire(name, ttl_s)
        pipe.execute()

    def get_decomposition(self, key: str) -> dict[bytes, bytes] | None:
        """The decomposition's fields; None if it is gone or its seal does not hold."""
        fields = cast("dict[bytes, bytes]", self.r.hgetall(self._k("decomp", self.store.ref(key)))) or None
        if fields is None or self.seal is None:
            return fields
        mac = fields.pop(b"mac", None)
        try:
            self.seal.check(mac, "decomp", self._decomposition_mac_body(key, fields))
        except TamperedRecord:
            log.error("job key=%s: its decomposition carries no valid seal; not used", key[:12])
            return None
        return fields

    def _decomposition_mac(self, key: str, fields: dict[str, bytes]) -> str:
        assert self.seal is not None
        return self.seal.mac("decomp", self._decomposition_mac_body(key, fields))

    def _decomposition_mac_body(self, key: str, fields: dict[Any, bytes]) -> bytes:
        named = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        parts = [self.store.ref(key).encode()]
        for name in sorted(named):
            parts += [name.encode(), named[name]]
        return b"".join(len(p).to_bytes(8, "big") + p for p in parts)

    def put_plan(self, key: str, plan: Plan, ttl_s: int) -> None:
        """Writes what the assembly needs; before `close_lowering`, which can send it."""
        body = plan.to_json()
        if self.seal is not None:
            mac = self.seal.mac("plan", self.store.ref(key), body)
            body = json.dumps({"mac": mac, "plan": body.decode()}).encode()
        self.r.set(self._k("plan", self.store.ref(key)), body, ex=ttl_s)

    def get_plan(self, key: str) -> Plan | None:
        """The job's plan, or None; raises TamperedRecord if its seal does not hold."""
        data = cast("bytes | None", self.r.get(self._k("plan", self.store.ref(key))))
        if data is None:
            return None
        if self.seal is not None:
            wrapped = json.loads(data)
            if not isinstance(wrapped, dict) or set(wrapped) != {"mac", "plan"}:
                raise TamperedRecord("the staged compile's plan carries no seal")
            data = wrapped["plan"].encode()
            self.seal.check(wrapped["mac"], "plan", self.store.ref(key), data)
        return Plan.from_json(data)

    def pending(self, key: str) -> set[str]:
        members = cast("set[bytes]", self.r.smembers(self._k("pending", self.store.ref(key))))
        return {m.decode() for m in members}

    def release(self, key: str, cache_keys: list[str], hits: int, busy_s: float) -> tuple[int, int]:
        """Marks these kernels of the job done; returns how many of them were pending and
        how many it still waits for. 0 left means: send the assembly (a redelivered
        batch may see 0 again; assembly is idempotent)."""
        removed, left = self._release(
            keys=[self._k("pending", self.store.ref(key)), self._job(key)],
            args=[time.time(), hits, busy_s, *cache_keys],
        )
        return int(removed), int(left)

    def note_kernel_start(self, key: str, worker: str) -> None:
        """The first kernel job's start (HSETNX), and which workers built the job's kernels."""
        self._note_job(key, ("setnx", "k_started", time.time()), ("set", f"kworker:{worker}", 1))

    def count(self, key: str, name: str) -> int:
        """Increments a counter on the job record (attempts of one stage job); 0 when the
        record has expired."""
        return self.store.incr_attempts(key, name)

    def _note_job(self, key: str, *ops: tuple[str, str, str | float]) -> None:
        """Applies `ops` (`_NOTE`'s op, field, value) to the job record, if it exists."""
        self._note(keys=[self._job(key)], args=[part for op in ops for part in op])

    def job_fields(self, key: str) -> dict[str, str]:
        fields = cast("dict[bytes, bytes]", self.r.hgetall(self._job(key)))
        return {k.decode(): v.decode() for k, v in fields.items()}

    def clear(self, key: str) -> None:
        ref = self.store.ref(key)
        self.r.delete(self._k("plan", ref), self._k("pending", ref), self._k("decomp", ref))
