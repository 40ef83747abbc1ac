"""The coordinator's request path, free of gRPC and of torch.

submit: validate the graph and options → derive the key in the caller's namespace →
answer from the cache → or join the in-flight job for that key → or, within the
tenant's quota, create the job and queue it on the target's queue (and evict the
namespace's own oldest entries while it stores more than its quota: storage.py).
watch/job: read the job record the workers keep up to date.
fetch: stream the manifest, then every blob, in chunks, checking each blob's digest;
each stream holds one of the tenant's places (`TenantSlots`), as each Watch does.

Every call names its tenant (torchfarm/trust/tokens.py); all it reads and writes goes through
`Store.tenant(namespace)`, so a tenant can neither see nor fetch another's jobs.

Redis and Celery clients are synchronous; their calls go through a `Runner`
(runner.py), so the asyncio loop that serves gRPC never blocks on them, nor on
checking a request's graph.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis

from services.coordinator import metrics, precompiled, storage
from services.coordinator.errors import (
    ArtifactCorrupt,
    InvalidRequest,
    NotFound,
    NoWorker,
    RequestTooLarge,
    TenantQueueFull,
)
from services.coordinator.jobevents import JobEvents, wait_for_change
from services.coordinator.ratelimit import TenantSlots, TokenBuckets
from services.coordinator.runner import Runner
from services.coordinator.settings import CoordinatorSettings
from torchfarm.celeryconf import make_celery
from torchfarm.graph import exportcheck, graphcheck
from torchfarm.graph.graph_errors import DisallowedOp, GraphError, GraphTooLarge
from torchfarm.storage import redisconn
from torchfarm.storage.explain import Explanation, MissIndex
from torchfarm.storage.store import JobRecord, JobState, Store
from torchfarm.trust.signing import SignatureError, TrustedKeys
from torchfarm.trust.tokens import OPEN, Tenant
from torchfarm.v1 import farm_pb2
from torchfarm.wire import builds, keys, labels, options, routing, targets
from torchfarm.wire.codes import Reason, Rejection, Stage
from torchfarm.wire.manifest import Manifest, ManifestError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    key: str
    state: str
    cache_hit: bool = False
    deduplicated: bool = False
    explanation: Explanation | None = None
    """Why it missed, when it queued a compile or joined one (torchfarm/storage/explain.py)."""


@dataclass(frozen=True)
class ArtifactPiece:
    """One piece of a fetch: the manifest (digest empty) or a chunk of a blob."""

    digest: str
    offset: int
    data: bytes
    url: str = ""
    """Set instead of data on a direct fetch: a pre-signed URL of the whole blob, whose
    size is then `offset`."""


@dataclass(frozen=True)
class QueueDepth:
    name: str
    queued: int
    running: int


@dataclass(frozen=True)
class FarmState:
    workers: dict[str, dict[str, Any]]
    queues: list[QueueDepth]
    recent_jobs: list[JobRecord]
    artifacts: int
    cache_bytes: int


class Dispatcher:
    """Sends compile jobs to a queue. The real one is Celery; unit tests pass another."""

    def send(self, key: str, queue: str, namespace: str = "") -> None:
        """Queues the compile of `key` in the tenant `namespace` ("" on an open farm)."""
        raise NotImplementedError

    def send_kernel(self, key: str, queue: str, namespace: str = "") -> None:
        """Queues the Triton kernel compile of `key` (services/coordinator/triton_rpc.py)."""
        raise NotImplementedError

    def send_export(self, key: str, queue: str, namespace: str = "") -> None:
        """Queues the AOTInductor export of `key` (workers/jobs/export.py)."""
        raise NotImplementedError

    def depth(self, queue: str) -> int:
        raise NotImplementedError


class CeleryDispatcher(Dispatcher):
    def __init__(self, broker_url: str):
        self.app = make_celery(broker_url)
        self.broker = redisconn.connect(broker_url, socket_timeout=10)

    def send(self, key: str, queue: str, namespace: str = "") -> None:
        self.app.send_task(
            routing.COMPILE_TASK, args=[key], kwargs={"namespace": namespace}, queue=queue
        )

    def send_kernel(self, key: str, queue: str, namespace: str = "") -> None:
        self.app.send_task(
            routing.KERNEL_TASK, args=[key], kwargs={"namespace": namespace}, queue=queue
        )

    def send_export(self, key: str, queue: str, namespace: str = "") -> None:
        self.app.send_task(
            routing.EXPORT_TASK, args=[key], kwargs={"namespace": namespace}, queue=queue
        )

    def depth(self, queue: str) -> int:
        # Celery's Redis transport keeps each queue as a list named after it.
        return int(self.broker.llen(queue))


class Farm:
    def __init__(
        self, settings: CoordinatorSettings, store: Store, dispatcher: Dispatcher,
        events: JobEvents | None = None, runner: Runner | None = None,
    ):
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.runner = runner or Runner()
        """Where each blocking store and broker call runs (runner.py); shared with the
        kernel and cache services."""
        self.events = events
        """Wake-ups when a job record changes; None polls every poll_interval_s instead."""
        self._watches = TenantSlots(
            settings.max_watches_per_tenant, "Watch streams and kernel waits", Reason.WATCH_LIMIT)
        self._fetches = TenantSlots(settings.max_fetches_per_tenant, "FetchArtifact streams", Reason.FETCH_LIMIT)
        self._served: tuple[float, frozenset[str]] = (-math.inf, frozenset())
        """When `served_queues` last read the workers' queues, and those queues."""
        self.limits = graphcheck.GraphLimits(max_nodes=settings.max_nodes, max_rank=settings.max_rank)
        self.trusted = TrustedKeys.load(settings.trusted_keys_file) if settings.trusted_keys_file else None
        self._known_queues = known_queues(settings.known_targets)
        per_minute = settings.explain_misses_per_minute
        self._explains = TokenBuckets(per_minute, per_minute / 60) if per_minute else None
        """Each tenant's ExplainPrecompiledMiss calls: each costs a few ms of this process."""

    async def submit(
        self, request: farm_pb2.CompileRequest, size: int, tenant: Tenant = OPEN
    ) -> Submitted:
        if size > self.settings.max_request_bytes:
            raise RequestTooLarge(
                f"request is {size} bytes; the farm accepts at most "
                f"{self.settings.max_request_bytes}"
            )
        queue, key = await self.runner.compute(self._checked, request, tenant.namespace, tenant=tenant.namespace)
        result = await self.runner.run(self._submit_sync, key, queue, request, tenant)
        metrics.REQUESTS.labels(outcome=_outcome(result)).inc()
        log.info(
            "submit key=%s queue=%s state=%s hit=%s dedup=%s label=%s",
            keys.short(key), queue, result.state, result.cache_hit, result.deduplicated,
            request.label,
        )
        return result

    def _checked(self, request: farm_pb2.CompileRequest, namespace: str) -> tuple[str, str]:
        """The queue and key of a well-formed request; InvalidRequest otherwise. Pure
        Python over the whole graph, so `submit` runs it off the loop (runner.py)."""
        try:
            labels.check_label(request.label)
            queue = routing.queue_for(request.target, build=builds.digest(builds.of_request(request)))
            graphcheck.validate_graph(request.graph, self.limits)
            if request.HasField("export"):
                exportcheck.validate_export(request.graph, request.export)
            options.check_options(
                request.options.mode, [(o.name, o.json_value) for o in request.options.inductor]
            )
            options.check_autocast([(a.device_type, a.dtype) for a in request.options.autocast])
            options.check_sdpa_backends(list(request.options.sdpa_backends))
        except labels.BadLabel as e:
            metrics.REQUESTS.labels(outcome="invalid").inc()
            raise InvalidRequest(str(e), Reason.INVALID_REQUEST) from e
        except routing.UnknownDevice as e:
            metrics.REQUESTS.labels(outcome="invalid").inc()
            raise InvalidRequest(str(e), Reason.UNKNOWN_TARGET) from e
        except GraphError as e:
            metrics.REQUESTS.labels(outcome="invalid").inc()
            raise InvalidRequest(str(e), _graph_reason(e)) from e
        return queue, keys.compute_key(request, namespace)

    def _submit_sync(
        self, key: str, queue: str, request: farm_pb2.CompileRequest, tenant: Tenant = OPEN
    ) -> Submitted:
        store = self.store.tenant(tenant.namespace)
        try:
            if self._servable(store, key):
                store.note_hit(key)  # for `torchfarm cache ls` (services/coordinator/cache.py)
                return Submitted(key, JobState.SUCCEEDED, cache_hit=True)
        except ManifestError:
            log.warning("key=%s has a corrupt manifest; recompiling", keys.short(key))
            store.delete_artifact(key)
        job = store.get_job(key)
        if job is not None and self.is_stale(job):
            log.warning("key=%s job stuck in %s; requeueing", keys.short(key), job.state)
            store.delete_job(key)
            metrics.REQUEUED.inc()
            job = None
        if job is not None and job.state == JobState.SUCCEEDED:
            # Its artifact is gone (evicted, corrupt, or refused above): compile again.
            store.delete_job(key)
            job = None
        if job is not None:
            return Submitted(
                key, job.state, deduplicated=job.state not in JobState.TERMINAL,
                explanation=self._last_explanation(store, key),
            )
        # The queue names the exact target, the build and the job kind (torchfarm/wire/routing.py).
        workers = store.live_workers()
        if queue not in routing.live_queues(workers):
            pool = self._not_known(store, queue)
            if pool is not None:
                raise _no_worker(request, workers, pool)
            log.info("key=%s queue=%s has no live worker; queued for its pool to wake",
                     keys.short(key), queue)
        if not store.create_job(
            key, queue, request.label, self.settings.job_ttl_s, request=request.SerializeToString()
        ):
            return Submitted(key, JobState.QUEUED, deduplicated=True)  # lost the race
        self.charge(store, key, tenant, max(1, keys.traced_ranks(request)))
        explanation = self._explain(store, request, key)  # admitted: a refused job records no miss
        self._trim(store)
        try:
            if request.HasField("export"):
                self.dispatcher.send_export(key, queue, tenant.namespace)
            else:
                self.dispatcher.send(key, queue, tenant.namespace)
        except Exception:
            store.abandon_job(key)  # let the next submit try again
            store.forget_job(tenant.name, key)
            raise
        return Submitted(key, JobState.QUEUED, explanation=explanation)

    def _explain(self, store: Store, request: farm_pb2.CompileRequest, key: str) -> Explanation | None:
        """Why the new job's key missed, counted by reason; then its own record, for the
        misses after it. An index that fails costs the explanation, never the submit."""
        index = MissIndex(store)
        try:
            explanation = index.explain(request, key)
            index.remember(request, key)
        except (redis.RedisError, ValueError, KeyError) as e:
            log.warning("key=%s: no miss explanation: %s", keys.short(key), e)
            return None
        metrics.MISSES.labels(reason=explanation.reason).inc()
        log.info("miss key=%s reason=%s %s", keys.short(key), explanation.reason, explanation.detail)
        return explanation

    def _last_explanation(self, store: Store, key: str) -> Explanation | None:
        try:
            return MissIndex(store).last(key)
        except (redis.RedisError, ValueError, KeyError):
            return None

    async def explain(self, key: str, tenant: Tenant = OPEN) -> Explanation:
        """The explanation of `key`'s last miss in the caller's namespace."""
        _check_named(key)
        found = await self.runner.run(MissIndex(self.store.tenant(tenant.namespace)).last, key)
        if found is None:
            raise NotFound(f"the farm has no explanation of a miss for key {keys.short(key)}")
        return found

    def _not_known(self, store: Store, queue: str) -> set[str] | None:
        """None for a queue a pool that is down, scaled to zero or starting will serve: one
        a worker served within the window, or one of a configured known target's, of a
        build its pool runs (`known_queues`). Otherwise the digests of the builds the
        target's pool runs, for the refusal to name: those its entries name, and those its
        workers ran within the window before the last of them went away (a pool's build
        changes when its image does); empty for a target not known, and for one named bare
        whose workers never ran."""
        seen = store.queues_seen()
        window = self.settings.known_target_window_s
        if window > 0 and seen.get(queue, -math.inf) >= time.time() - window:
            return None
        target = routing.queue_name(routing.target_of_queue(queue))
        named = self._known_queues.get(target)
        if named is None:
            return set()
        ran = [
            (build, when)
            for q, when in seen.items()
            if (build := routing.build_of_queue(q)) and routing.queue_name(routing.target_of_queue(q)) == target
        ]
        last = max((when for _, when in ran), default=0.0)
        pool = set(named) | {build for build, when in ran if when >= last - window}
        return None if not pool or routing.build_of_queue(queue) in pool else pool

    def charge(self, store: Store, key: str, tenant: Tenant, weight: int = 1) -> None:
        """Counts a new job against the tenant's quota, `weight` times (a DTensor graph,
        once per rank its rank check traces), or undoes it and refuses.

        Counting after the job exists, and undoing when over, never lets a burst of
        concurrent submits past the quota (at worst one of them is refused early)."""
        limit = self.settings.max_jobs_per_tenant
        if not limit:
            return
        in_flight = store.note_job(tenant.name, key, self.settings.job_ttl_s, weight)
        if in_flight > limit:
            store.forget_job(tenant.name, key)
            store.abandon_job(key)
            metrics.QUOTA_REFUSALS.inc()
            who = f"tenant {tenant.name!r}" if tenant.name else "this farm's (open) tenant"
            this = f"; this one counts {weight}, once per rank its rank check traces" if weight > 1 else ""
            raise TenantQueueFull(
                f"{who} has {in_flight - weight} compiles queued or running{this}, the most the "
                f"farm allows per tenant is {limit}; retry when some finish"
            )

    def _trim(self, store: Store) -> None:
        """Keeps the namespace within its storage quota, evicting its own oldest entries
        (services/coordinator/storage.py). A failure costs the trim, never the submit."""
        try:
            storage.trim(store, self.settings.max_stored_bytes_per_tenant)
        except redis.RedisError as e:
            log.warning("namespace %r not trimmed to its storage quota: %s", store.namespace, e)

    def _servable(self, store: Store, key: str) -> bool:
        """True when the cache holds a complete artifact for `key` whose signature (if
        the coordinator pins keys) verifies and has not expired. A refused one is
        dropped from the index, so the key compiles again."""
        manifest = store.get_manifest(key)
        if manifest is None:
            return False
        if self.refuses(manifest, key, store.namespace):
            store.delete_artifact(key)
            return False
        return True

    def refuses(self, manifest: Manifest, key: str, namespace: str) -> bool:
        """True, logged and counted, when this coordinator would not serve the cached
        manifest (an artifact's or a Triton kernel's): see `_refusal`. The caller drops it."""
        reason = self._refusal(manifest, key, namespace)
        if reason is None:
            return False
        log.warning("key=%s cached artifact refused (%s); recompiling", keys.short(key), reason)
        metrics.ARTIFACTS_REFUSED.labels(reason=reason).inc()
        return True

    def _refusal(self, manifest: Manifest, key: str, namespace: str) -> Rejection | None:
        sig = manifest.signature
        if sig is not None and sig.expires_at <= time.time() + self.settings.poll_interval_s + 60:
            return Rejection.EXPIRED  # about to: a client fetching now would refuse it
        if self.trusted is None:
            return None
        try:
            self.trusted.verify(manifest, key=key, tenant=namespace, fingerprint=manifest.fingerprint)
        except SignatureError as e:
            return e.reason
        return None

    def is_stale(self, job: JobRecord) -> bool:
        return (
            job.state not in JobState.TERMINAL
            and time.time() - job.updated > self.settings.stale_job_s
        )

    async def job(self, key: str, tenant: Tenant = OPEN) -> JobRecord:
        _check_named(key)
        store = self.store.tenant(tenant.namespace)
        job = await self.runner.run(store.get_job, key)
        if job is not None:
            return job
        manifest = await self.runner.run(store.get_manifest, key)
        if manifest is not None:
            return JobRecord(
                key=key, state=JobState.SUCCEEDED, stage=Stage.DONE, timings=manifest.timings,
                artifact_bytes=manifest.total_bytes(), worker=manifest.worker,
                stages=list(manifest.stages),
            )
        raise NotFound(f"no job or artifact for key {keys.short(key)}")

    async def watch(self, key: str, tenant: Tenant = OPEN) -> AsyncIterator[JobRecord]:
        """Yields the job's record whenever it changes, until a terminal state. The
        record is read again when the store announces a change (jobevents.py), and every
        watch_poll_s regardless; without events, every poll_interval_s."""
        _check_named(key)
        async with self.wait_slot(tenant), self.job_changes(key, tenant) as changed:
            last = None
            while True:
                job = await self.job(key, tenant)
                if job.state == JobState.QUEUED:
                    served = await self.served_queues()
                    job = dataclasses.replace(job, unserved=job.queue not in served)
                seen = (job.state, job.stage, job.attempts, job.kernels_done, job.unserved)
                if seen != last:
                    last = seen
                    yield job
                if job.state in JobState.TERMINAL:
                    return
                await changed()

    async def served_queues(self) -> frozenset[str]:
        """The queues some live worker consumes. Read (a SCAN of the workers'
        registrations, on the runner) at most every watch_poll_s, however many watches
        ask; between reads, the last one, with no hop to the runner."""
        read_at, queues = self._served
        if time.monotonic() - read_at < self.settings.watch_poll_s:
            return queues
        queues = routing.live_queues(await self.runner.run(self.store.live_workers))
        self._served = (time.monotonic(), queues)
        return queues

    @contextlib.asynccontextmanager
    async def job_changes(self, key: str, tenant: Tenant = OPEN) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """A wait that returns when the job's record may have changed."""
        if self.events is None:
            yield lambda: asyncio.sleep(self.settings.poll_interval_s)
            return
        channel = self.store.tenant(tenant.namespace).job_channel(key)
        async with self.events.watching(channel) as event:
            yield lambda: wait_for_change(event, self.settings.watch_poll_s)

    def wait_slot(self, tenant: Tenant) -> contextlib.AbstractAsyncContextManager[None]:
        """Holds one of the tenant's waits in this process (a Watch stream, a CompileKernel
        call waiting for its job), or refuses (WATCH_LIMIT)."""
        return self._watches.hold(tenant)

    async def fetch(self, key: str, tenant: Tenant = OPEN, direct: bool = False) -> AsyncIterator[ArtifactPiece]:
        """Streams the manifest, then each blob in chunks. A blob whose bytes no longer
        match its digest (tampered with, or damaged, in Redis) ends the stream with
        ArtifactCorrupt and drops the manifest, so the next submit recompiles.

        With `direct`, where the blob store pre-signs URLs, each blob is a link instead
        of bytes: the client downloads and checks it, and no byte passes through here.

        The stream holds one of the tenant's fetch places from its start to its end
        (FETCH_LIMIT past them): a stream its client stopped reading keeps chunks in memory.
        """
        _check_named(key)
        async with self._fetches.hold(tenant):
            store = self.store.tenant(tenant.namespace)
            manifest_bytes = await self.runner.run(store.get_manifest_bytes, key)
            manifest = await self.runner.run(store.get_manifest, key)
            if manifest is None or manifest_bytes is None:
                raise NotFound(f"no artifact for key {keys.short(key)}")
            yield ArtifactPiece("", 0, manifest_bytes)
            if direct:
                links = await self.runner.run(self._links, store, manifest)
                if links is not None:
                    for piece in links:
                        yield piece
                    return
            step = self.settings.chunk_bytes
            for ref in manifest.blobs():
                digest = hashlib.sha256()
                for offset in range(0, max(ref.size, 1), step):
                    end = min(offset + step, ref.size) - 1
                    data = await self.runner.run(store.get_blob_range, ref.digest, offset, end)
                    if len(data) != end - offset + 1:
                        raise NotFound(f"artifact {keys.short(key)} was evicted while streaming")
                    digest.update(data)
                    yield ArtifactPiece(ref.digest, offset, data)
                if "sha256:" + digest.hexdigest() != ref.digest:
                    metrics.ARTIFACTS_REFUSED.labels(reason=Rejection.CORRUPT).inc()
                    log.error("key=%s blob %s does not match its digest; dropping the artifact",
                              keys.short(key), ref.digest[:19])
                    # The blob is keyed by the digest it no longer has: drop it too, or the
                    # recompile's SET NX would keep the bad bytes.
                    await self.runner.run(store.delete_artifact, key)
                    await self.runner.run(store.delete_blob, ref.digest)
                    raise ArtifactCorrupt(
                        f"artifact {keys.short(key)}: a cached blob is corrupt; it will be recompiled"
                    )
            metrics.ARTIFACT_BYTES.observe(manifest.total_bytes())

    async def put_precompiled(self, upload: farm_pb2.PrecompiledUpload, tenant: Tenant = OPEN) -> str:
        """Stores a client's precompiled package in its namespace, unread
        (services/coordinator/precompiled.py); returns its key."""
        manifest, blobs, record = await self.runner.compute(
            precompiled.check_upload, upload, tenant.namespace, self.settings.max_request_bytes,
            tenant=tenant.namespace,
        )
        store = self.store.tenant(tenant.namespace)
        await self.runner.run(storage.admit_upload, store, self.settings, upload.ByteSize())
        await self.runner.run(precompiled.store_upload, store, manifest, blobs, self.settings.precompiled_ttl_s)
        if record is not None:
            try:
                await self.runner.run(MissIndex(store).remember_precompiled, record)
            except redis.RedisError as e:  # it costs later explanations, never the upload
                log.warning("key=%s: precompiled record not kept: %s", keys.short(manifest.key), e)
        return manifest.key

    async def explain_precompiled(self, miss: farm_pb2.PrecompiledMiss, tenant: Tenant = OPEN) -> Explanation:
        """Why the caller's precompiled key missed, against its namespace's packages of the
        same model; counted by reason and kept for `torchfarm explain`."""
        if self._explains is not None and not self._explains.take(tenant.name):
            raise TenantQueueFull(
                f"more than {self.settings.explain_misses_per_minute} precompiled misses to explain "
                "in a minute: retry later", Reason.EXPLAIN_RATE,
            )
        precompiled.check_key(miss.key, "precompiled miss refused")
        try:
            explanation = await self.runner.run(
                MissIndex(self.store.tenant(tenant.namespace)).explain_precompiled, miss.record, miss.key,
            )
        except ValueError as e:
            raise InvalidRequest(f"precompiled miss refused: {e}") from e
        metrics.PRECOMPILED_MISSES.labels(reason=explanation.reason).inc()
        log.info("precompiled miss key=%s reason=%s %s", keys.short(miss.key), explanation.reason, explanation.detail)
        return explanation

    def _links(self, store: Store, manifest: Manifest) -> list[ArtifactPiece] | None:
        """A pre-signed link per blob, or None where the store hands out none."""
        ttl = self.settings.direct_url_ttl_s
        links = []
        for ref in manifest.blobs():
            url = store.blobs.presign(ref.digest, ttl)
            if url is None:
                return None
            links.append(ArtifactPiece(ref.digest, ref.size, b"", url))
        return links

    async def status(self, tenant: Tenant = OPEN) -> FarmState:
        return await self.runner.run(self._status_sync, tenant)

    def _status_sync(self, tenant: Tenant = OPEN) -> FarmState:
        workers = self.store.live_workers()
        jobs = self.store.tenant(tenant.namespace).recent_jobs()
        served = routing.live_queues(workers)
        names = sorted(served | {j.queue for j in jobs if j.queue})
        queues = [
            QueueDepth(
                name=q,
                queued=self.dispatcher.depth(q),
                running=sum(1 for j in jobs if j.queue == q and j.state == JobState.RUNNING),
            )
            for q in names
        ]
        if tenant.namespace:  # what this tenant keeps: the cache's totals would show others' compiles land
            ledger = self.store.tenant(tenant.namespace).ledger()
            artifacts, cache_bytes = len(ledger.keys()), ledger.total()
        else:
            artifacts, cache_bytes = len(self.store.artifact_keys()), self.store.cache_bytes()
        return FarmState(
            workers=workers, queues=queues, recent_jobs=jobs, artifacts=artifacts, cache_bytes=cache_bytes,
        )


def known_queues(names: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """The graph queues of TORCHFARM_KNOWN_TARGETS, each with the build digests its
    entries name ("cuda:sm_90@3f9c21", the digest `torchfarm status` shows a worker's
    build by). Each target must be exact.

    A known target's job is queued with no live worker when its build is one named, or
    one its pool runs (`Farm._not_known`); with none named, of any build only until a
    worker of the target first runs, so that the first job wakes a new pool. Any other
    build waits for a pool that cannot take it, and a queue-depth autoscaler that sums
    the target's queues would start pods for it (k8s/keda.yaml)."""
    known: dict[str, frozenset[str]] = {}
    for entry in names:
        name, at, build = entry.partition("@")
        build = build.removeprefix("b")
        if at and not builds.is_digest(build):
            raise ValueError(
                f"TORCHFARM_KNOWN_TARGETS: {entry!r}: a build is its digest, {builds.DIGEST_HEX} hex "
                "digits after '@' (`torchfarm status` shows each worker's)"
            )
        try:
            queue = routing.queue_name(targets.require_exact(targets.parse(name), "a known target"))
        except targets.TargetError as e:
            raise ValueError(f"TORCHFARM_KNOWN_TARGETS: {e}") from e
        known[queue] = known.get(queue, frozenset()) | ({build} if at else set())
    return known


def _no_worker(request: farm_pb2.CompileRequest, workers: dict[str, dict[str, Any]], pool: set[str]) -> NoWorker:
    """NO_WORKER when no worker lowers graphs for the target; BUILD_NOT_SERVED, naming
    the build and those served, when some do, live or (`pool`, digests) scaled down,
    but none of the client's build."""
    target = routing.describe(request.target)
    wanted = builds.of_request(request)
    served = builds.served_builds(workers, target, routing.GRAPH)
    if served:
        return NoWorker(builds.unserved_message(target, wanted, served), Reason.BUILD_NOT_SERVED)
    if pool:
        return NoWorker(builds.unrun_message(target, wanted, pool), Reason.BUILD_NOT_SERVED)
    return NoWorker(routing.unserved_message(target, routing.GRAPH, workers))


def _graph_reason(e: GraphError) -> Reason:
    if isinstance(e, options.OptionNotAllowed):
        return Reason.OPTION_NOT_ALLOWED
    if isinstance(e, GraphTooLarge):
        return Reason.GRAPH_TOO_LARGE
    return Reason.DISALLOWED_OP if isinstance(e, DisallowedOp) else Reason.INVALID_GRAPH


def _outcome(s: Submitted) -> str:
    if s.cache_hit:
        return "hit"
    if s.deduplicated:
        return "deduplicated"
    return "failed" if s.state == JobState.FAILED else "miss"


def _check_named(key: str) -> None:
    """InvalidRequest unless `key` is one an entry could have (`keys.NAMED_KEY`), before
    it reaches Redis as part of a key name or a channel."""
    if not keys.NAMED_KEY.match(key):
        raise InvalidRequest(f"{key[:20]!r}... is not a key: 64 hex digits, or a precompiled key")
