"""The coordinator's request path, free of gRPC and of torch.

submit: validate the graph → derive the key → answer from the cache → or join the
in-flight job for that key → or create the job and queue it on the target's queue.
watch/job: read the job record the workers keep up to date.
fetch: stream the manifest, then every blob, in chunks.

Redis and Celery clients are synchronous; their calls run in worker threads so the
asyncio loop that serves gRPC never blocks on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError

from services.coordinator import metrics
from services.coordinator.errors import (
    BackendUnavailable,
    InvalidRequest,
    NoWorker,
    NotFound,
    RequestTooLarge,
)
from services.coordinator.settings import CoordinatorSettings
from torchfarm import graphcheck, keys, routing
from torchfarm.celeryconf import make_celery
from torchfarm.graph_errors import GraphError
from torchfarm.manifest import ManifestError
from torchfarm.store import JobRecord, JobState, Store
from torchfarm.v1 import farm_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Submitted:
    key: str
    state: str
    cache_hit: bool = False
    deduplicated: bool = False


@dataclass(frozen=True)
class ArtifactPiece:
    """One piece of a fetch: the manifest (digest empty) or a chunk of a blob."""

    digest: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class QueueDepth:
    name: str
    queued: int
    running: int


@dataclass(frozen=True)
class FarmState:
    workers: dict[str, dict]
    queues: list[QueueDepth]
    recent_jobs: list[JobRecord]
    artifacts: int
    cache_bytes: int


class Dispatcher:
    """Sends compile jobs to a queue. The real one is Celery; unit tests pass another."""

    def send(self, key: str, queue: str) -> None:
        raise NotImplementedError

    def depth(self, queue: str) -> int:
        raise NotImplementedError


class CeleryDispatcher(Dispatcher):
    def __init__(self, broker_url: str):
        self.app = make_celery(broker_url)
        self.broker = redis.Redis.from_url(broker_url, socket_timeout=10)

    def send(self, key: str, queue: str) -> None:
        self.app.send_task(routing.COMPILE_TASK, args=[key], queue=queue)

    def depth(self, queue: str) -> int:
        # Celery's Redis transport keeps each queue as a list named after it.
        return int(self.broker.llen(queue))


class Farm:
    def __init__(self, settings: CoordinatorSettings, store: Store, dispatcher: Dispatcher):
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.limits = graphcheck.GraphLimits(max_nodes=settings.max_nodes)

    async def _io(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except (redis.RedisError, OperationalError, OSError) as e:
            raise BackendUnavailable(f"farm backend unavailable: {e}") from e

    async def submit(self, request: farm_pb2.CompileRequest, size: int) -> Submitted:
        if size > self.settings.max_request_bytes:
            raise RequestTooLarge(
                f"request is {size} bytes; the farm accepts at most "
                f"{self.settings.max_request_bytes}"
            )
        try:
            queue = routing.queue_for(request.target)
            graphcheck.validate_graph(request.graph, self.limits)
        except (routing.UnknownDevice, GraphError) as e:
            metrics.REQUESTS.labels(outcome="invalid").inc()
            raise InvalidRequest(str(e)) from e
        key = keys.compute_key(request)
        result = await self._io(self._submit_sync, key, queue, request)
        metrics.REQUESTS.labels(outcome=_outcome(result)).inc()
        log.info(
            "submit key=%s queue=%s state=%s hit=%s dedup=%s label=%s",
            keys.short(key), queue, result.state, result.cache_hit, result.deduplicated,
            request.label,
        )
        return result

    def _submit_sync(self, key: str, queue: str, request: farm_pb2.CompileRequest) -> Submitted:
        try:
            if self.store.get_manifest(key) is not None:
                return Submitted(key, JobState.SUCCEEDED, cache_hit=True)
        except ManifestError:
            log.warning("key=%s has a corrupt manifest; recompiling", keys.short(key))
            self.store.delete_artifact(key)
        job = self.store.get_job(key)
        if job is not None and self._is_stale(job):
            log.warning("key=%s job stuck in %s; requeueing", keys.short(key), job.state)
            self.store.delete_job(key)
            job = None
        if job is not None:
            return Submitted(key, job.state, deduplicated=job.state not in JobState.TERMINAL)
        if not any(queue in w.get("queues", ()) for w in self.store.live_workers().values()):
            raise NoWorker(f"no live worker serves target {routing.describe(request.target)}")
        self.store.put_request(key, request.SerializeToString(), self.settings.request_ttl_s)
        if not self.store.create_job(key, queue, request.label, self.settings.job_ttl_s):
            return Submitted(key, JobState.QUEUED, deduplicated=True)  # lost the race
        try:
            self.dispatcher.send(key, queue)
        except Exception:
            self.store.delete_job(key)  # let the next submit try again
            raise
        return Submitted(key, JobState.QUEUED)

    def _is_stale(self, job: JobRecord) -> bool:
        return (
            job.state not in JobState.TERMINAL
            and time.time() - job.updated > self.settings.stale_job_s
        )

    async def job(self, key: str) -> JobRecord:
        job = await self._io(self.store.get_job, key)
        if job is not None:
            return job
        manifest = await self._io(self.store.get_manifest, key)
        if manifest is not None:
            return JobRecord(
                key=key, state=JobState.SUCCEEDED, stage="done", timings=manifest.timings,
                artifact_bytes=manifest.total_bytes(), worker=manifest.worker,
            )
        raise NotFound(f"no job or artifact for key {keys.short(key)}")

    async def watch(self, key: str) -> AsyncIterator[JobRecord]:
        """Yields the job's record whenever it changes, until a terminal state."""
        last = None
        while True:
            job = await self.job(key)
            seen = (job.state, job.stage, job.attempts)
            if seen != last:
                last = seen
                yield job
            if job.state in JobState.TERMINAL:
                return
            await asyncio.sleep(self.settings.poll_interval_s)

    async def fetch(self, key: str) -> AsyncIterator[ArtifactPiece]:
        manifest_bytes = await self._io(self.store.get_manifest_bytes, key)
        manifest = await self._io(self.store.get_manifest, key)
        if manifest is None or manifest_bytes is None:
            raise NotFound(f"no artifact for key {keys.short(key)}")
        yield ArtifactPiece("", 0, manifest_bytes)
        step = self.settings.chunk_bytes
        for ref in manifest.blobs():
            for offset in range(0, max(ref.size, 1), step):
                end = min(offset + step, ref.size) - 1
                data = await self._io(self.store.get_blob_range, ref.digest, offset, end)
                if len(data) != end - offset + 1:
                    raise NotFound(f"artifact {keys.short(key)} was evicted while streaming")
                yield ArtifactPiece(ref.digest, offset, data)
        metrics.ARTIFACT_BYTES.observe(manifest.total_bytes())

    async def status(self) -> FarmState:
        return await self._io(self._status_sync)

    def _status_sync(self) -> FarmState:
        workers = self.store.live_workers()
        jobs = self.store.recent_jobs()
        served = {q for w in workers.values() for q in w.get("queues", ())}
        names = sorted(served | {j.queue for j in jobs if j.queue})
        queues = [
            QueueDepth(
                name=q,
                queued=self.dispatcher.depth(q),
                running=sum(1 for j in jobs if j.queue == q and j.state == JobState.RUNNING),
            )
            for q in names
        ]
        return FarmState(
            workers=workers,
            queues=queues,
            recent_jobs=jobs,
            artifacts=len(self.store.artifact_keys()),
            cache_bytes=self.store.cache_bytes(),
        )


def _outcome(s: Submitted) -> str:
    if s.cache_hit:
        return "hit"
    if s.deduplicated:
        return "deduplicated"
    return "failed" if s.state == JobState.FAILED else "miss"
