"""gRPC servicer: translates protobuf to the Farm's domain calls, and errors to codes.

Each call runs as the tenant the auth interceptor admitted (`auth.caller()`). Each
error's stable reason travels in the `torchfarm-reason` trailing metadata.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

import grpc

from services.coordinator import auth, errors, metrics
from services.coordinator.cache import CacheService, Entry, Filters, Totals
from services.coordinator.farm import Farm
from services.coordinator.kernel_rpc import KernelService
from services.coordinator.settings import CoordinatorSettings
from torchfarm import __version__, routing
from torchfarm.store import JobRecord, JobState
from torchfarm.v1 import farm_pb2, farm_pb2_grpc

log = logging.getLogger(__name__)

_CODES: dict[type[errors.CoordinatorError], grpc.StatusCode] = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.RequestTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TenantQueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ArtifactCorrupt: grpc.StatusCode.DATA_LOSS,
    errors.NoWorker: grpc.StatusCode.UNAVAILABLE,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
}


def job_status(job: JobRecord) -> farm_pb2.JobStatus:
    return farm_pb2.JobStatus(
        key=job.key,
        state=farm_pb2.JobState.Value(job.state),
        stage=job.stage,
        message=job.message,
        error_code=job.error_code,
        attempts=job.attempts,
        queued_seconds=max(0.0, job.started - job.created) if job.started else 0.0,
        timings=_stage_timings(job),
        artifact_bytes=job.artifact_bytes,
        worker=job.worker,
        kernels_total=job.kernels_total,
        kernels_done=job.kernels_done,
        kernels_hit=job.kernels_hit,
    )


def _stage_timings(job: JobRecord) -> list[farm_pb2.StageTiming]:
    """A staged compile's stage records (workers/jobs/ (lower, build, assemble)); else the flat timings."""
    if job.stages:
        return [
            farm_pb2.StageTiming(
                stage=str(s.get("stage", "")), seconds=float(s.get("seconds", 0.0)),
                queued_seconds=float(s.get("queued_seconds", 0.0)),
                kernels=int(s.get("kernels", 0)), kernels_hit=int(s.get("kernels_hit", 0)),
                worker=str(s.get("worker", "")),
            )
            for s in job.stages
        ]
    return [farm_pb2.StageTiming(stage=s, seconds=t) for s, t in job.timings.items()]


class _ErrorMapping:
    """Maps domain errors to status codes; anything unexpected becomes INTERNAL."""

    def __init__(self, context: grpc.aio.ServicerContext):
        self.context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, (grpc.aio.AbortError, GeneratorExit)):
            return False
        if isinstance(exc, errors.CoordinatorError):
            code, reason = _CODES[type(exc)], exc.reason
        elif isinstance(exc, Exception):
            log.exception("internal error")
            code, reason = grpc.StatusCode.INTERNAL, "INTERNAL"
        else:
            return False
        metrics.RPC_ERRORS.labels(code=code.name).inc()
        await self.context.abort(code, str(exc), trailing_metadata=((auth.REASON_KEY, reason),))
        return True  # abort raised already; not reached


class CompileFarmServicer(farm_pb2_grpc.CompileFarmServicer):
    def __init__(self, farm: Farm, settings: CoordinatorSettings):
        self.farm = farm
        self.settings = settings
        self.kernels = KernelService(farm)
        self.cache = CacheService(farm)

    async def Submit(self, request, context):
        async with _ErrorMapping(context):
            s = await self.farm.submit(request, request.ByteSize(), auth.caller())
            return farm_pb2.SubmitReply(
                key=s.key,
                state=farm_pb2.JobState.Value(s.state),
                cache_hit=s.cache_hit,
                deduplicated=s.deduplicated,
            )

    async def GetJob(self, request, context):
        async with _ErrorMapping(context):
            return job_status(await self.farm.job(request.key, auth.caller()))

    async def Watch(self, request, context) -> AsyncIterator[farm_pb2.JobStatus]:
        async with _ErrorMapping(context):
            async for job in self.farm.watch(request.key, auth.caller()):
                yield job_status(job)

    async def FetchArtifact(self, request, context) -> AsyncIterator[farm_pb2.ArtifactChunk]:
        async with _ErrorMapping(context):
            async for piece in self.farm.fetch(request.key, auth.caller(), request.direct):
                if not piece.digest:
                    yield farm_pb2.ArtifactChunk(manifest=piece.data)
                elif piece.url:
                    yield farm_pb2.ArtifactChunk(
                        link=farm_pb2.BlobLink(
                            digest=piece.digest, size=piece.offset, url=piece.url,
                            expires_in_seconds=self.farm.settings.direct_url_ttl_s,
                        )
                    )
                else:
                    yield farm_pb2.ArtifactChunk(
                        blob=farm_pb2.BlobChunk(
                            digest=piece.digest, offset=piece.offset, data=piece.data
                        )
                    )

    async def GetFarmStatus(self, request, context):
        async with _ErrorMapping(context):
            st = await self.farm.status(auth.caller())
            now = time.time()
            return farm_pb2.FarmStatus(
                workers=[
                    farm_pb2.WorkerInfo(
                        name=name,
                        queue=",".join(w.get("queues", [])),
                        last_seen_seconds=max(0.0, now - float(w.get("seen", now))),
                        build=w.get("build", ""),
                        targets=[
                            farm_pb2.ServedTarget(target=t, jobs=sorted(kinds))
                            for t, kinds in sorted(routing.served_targets(w).items())
                        ],
                        fingerprint=w.get("fingerprint", {}),
                    )
                    for name, w in sorted(st.workers.items())
                ],
                queues=[
                    farm_pb2.QueueInfo(name=q.name, queued=q.queued, running=q.running)
                    for q in st.queues
                ],
                artifacts=st.artifacts,
                cache_bytes=st.cache_bytes,
                coordinator_version=__version__,
                recent_jobs=[job_status(j) for j in st.recent_jobs],
                in_flight=[job_status(j) for j in st.recent_jobs if j.state not in JobState.TERMINAL],
                job_info=[
                    farm_pb2.FarmStatus.JobInfo(
                        key=j.key, label=j.label, queue=j.queue,
                        age_seconds=max(0.0, now - j.created) if j.created else 0.0,
                        idle_seconds=max(0.0, now - j.updated) if j.updated else 0.0,
                    )
                    for j in st.recent_jobs
                ],
            )

    async def ListArtifacts(self, request, context):
        async with _ErrorMapping(context):
            listing = await self.cache.list(
                _filters(request.target, request.older_than_seconds, request.keys),
                request.limit, auth.caller().namespace,
            )
            now = time.time()
            return farm_pb2.CacheListing(
                entries=[_cache_entry(e, now) for e in listing.entries],
                matched=listing.matched.entries,
                bytes=listing.matched.bytes,
                hits=listing.matched.hits,
                targets=[_target_totals(t, tot) for t, tot in listing.by_target.items()],
            )

    async def EvictArtifacts(self, request, context):
        async with _ErrorMapping(context):
            evicted = await self.cache.evict(
                _filters(request.target, request.older_than_seconds, request.keys),
                request.all, auth.caller().namespace,
            )
            shared: dict[str, int] = {}
            for e in evicted:
                shared.update(e.digests)
            return farm_pb2.CacheEvictReply(
                evicted=[e.key for e in evicted], bytes=sum(shared.values())
            )

    async def CompileKernel(self, request, context):
        async with _ErrorMapping(context):
            k = await self.kernels.compile(request, request.ByteSize(), auth.caller().namespace)
            return farm_pb2.KernelReply(
                key=k.key,
                cache_hit=k.cache_hit,
                kind=k.record["kind"],
                binary=k.binary,
                assembly=k.assembly,
                metadata_json=json.dumps(k.record.get("metadata", {}), sort_keys=True),
                triton_version=k.record.get("triton_version", ""),
                worker=k.record.get("worker", ""),
                compile_seconds=float(k.record.get("seconds", 0.0)),
            )


def _filters(target: str, older_than_s: float, keys) -> Filters:
    return Filters(target=target, older_than_s=older_than_s, keys=tuple(keys))


def _cache_entry(e: Entry, now: float) -> farm_pb2.CacheEntry:
    return farm_pb2.CacheEntry(
        key=e.key, label=e.label, target=e.target, bytes=e.bytes, hits=e.hits,
        age_seconds=max(0.0, now - e.created),
        last_hit_seconds=max(0.0, now - e.last_hit) if e.hits else 0.0,
        kernels=e.kernels, worker=e.worker,
    )


def _target_totals(target: str, t: Totals) -> farm_pb2.CacheTargetTotals:
    return farm_pb2.CacheTargetTotals(target=target, entries=t.entries, bytes=t.bytes, hits=t.hits)
