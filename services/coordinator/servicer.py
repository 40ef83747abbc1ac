"""gRPC servicer: translates protobuf to the Farm's domain calls, and errors to codes.

Each call runs as the tenant the auth interceptor admitted (`auth.caller()`). Each
error's stable reason travels in the `torchfarm-reason` trailing metadata.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Any, Literal, cast

import grpc

from services.coordinator import auth, errors, metrics
from services.coordinator.cache import CacheService, Entry, Filters, Totals
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.triton_rpc import KernelService
from torchfarm import __version__
from torchfarm.storage.store import JobRecord, JobState
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire import codes, routing
from torchfarm.wire.codes import REASONS, JobError, Reason, Stage

log = logging.getLogger(__name__)


_Context = grpc.aio.ServicerContext[Any, Any]


def status_of(reason: Reason) -> grpc.StatusCode:
    """The status a refusal is answered with: the contract's table says (torchfarm/wire/codes.py)."""
    return grpc.StatusCode[REASONS[reason].status]


def job_status(job: JobRecord) -> farm_pb2.JobStatus:
    return farm_pb2.JobStatus(
        key=job.key,
        state=cast("farm_pb2.JobState", farm_pb2.JobState.Value(job.state)),
        stage=job.stage,
        message=job.message,
        error_code=job.error_code,
        # The stubs type enum fields by their wrapper classes; a wire number is a plain int.
        error=cast("farm_pb2.JobError.Code", codes.number(JobError, job.error_code)),
        stage_id=cast("farm_pb2.Stage.Name", codes.number(Stage, job.stage)),
        attempts=job.attempts,
        queued_seconds=max(0.0, job.started - job.created) if job.started else 0.0,
        timings=_stage_timings(job),
        artifact_bytes=job.artifact_bytes,
        worker=job.worker,
        kernels_total=job.kernels_total,
        kernels_done=job.kernels_done,
        kernels_hit=job.kernels_hit,
        unserved=job.unserved,
    )


def _stage_timings(job: JobRecord) -> list[farm_pb2.StageTiming]:
    """A staged compile's stage records (workers/jobs/); else the flat timings."""
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

    def __init__(self, context: _Context):
        self.context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:  # never swallows: the exception propagates, or the abort raises
        if exc is None or isinstance(exc, (grpc.aio.AbortError, GeneratorExit)):
            return False
        if isinstance(exc, errors.CoordinatorError):
            reason = exc.reason
        elif isinstance(exc, Exception):
            log.exception("internal error")
            reason = Reason.INTERNAL
        else:
            return False
        code = status_of(reason)
        metrics.RPC_ERRORS.labels(code=code.name).inc()
        await self.context.abort(code, str(exc), trailing_metadata=((auth.REASON_KEY, reason.value),))
        return True  # abort raised already; not reached


class CompileFarmServicer(farm_pb2_grpc.CompileFarmServicer):
    def __init__(self, farm: Farm, settings: CoordinatorSettings):
        self.farm = farm
        self.settings = settings
        self.kernels = KernelService(farm, farm.runner)
        self.cache = CacheService(farm, farm.runner)

    async def Submit(self, request: farm_pb2.CompileRequest, context: _Context) -> farm_pb2.SubmitReply:
        async with _ErrorMapping(context):
            s = await self.farm.submit(request, request.ByteSize(), auth.caller())
            return farm_pb2.SubmitReply(
                key=s.key,
                state=cast("farm_pb2.JobState", farm_pb2.JobState.Value(s.state)),
                cache_hit=s.cache_hit,
                deduplicated=s.deduplicated,
                explanation=s.explanation.to_proto() if s.explanation else None,
            )

    async def ExplainMiss(self, request: farm_pb2.JobRef, context: _Context) -> farm_pb2.MissExplanation:
        async with _ErrorMapping(context):
            return (await self.farm.explain(request.key, auth.caller())).to_proto()

    async def GetJob(self, request: farm_pb2.JobRef, context: _Context) -> farm_pb2.JobStatus:
        async with _ErrorMapping(context):
            return job_status(await self.farm.job(request.key, auth.caller()))

    async def Watch(self, request: farm_pb2.JobRef, context: _Context) -> AsyncIterator[farm_pb2.JobStatus]:
        async with _ErrorMapping(context):
            async for job in self.farm.watch(request.key, auth.caller()):
                yield job_status(job)

    async def FetchArtifact(
        self, request: farm_pb2.ArtifactRef, context: _Context
    ) -> AsyncIterator[farm_pb2.ArtifactChunk]:
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

    async def GetFarmStatus(
        self, request: farm_pb2.FarmStatusRequest, context: _Context
    ) -> farm_pb2.FarmStatus:
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
                        sandbox=w.get("sandbox", ""),
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

    async def ListArtifacts(self, request: farm_pb2.CacheQuery, context: _Context) -> farm_pb2.CacheListing:
        async with _ErrorMapping(context):
            listing = await self.cache.list(
                _filters(request.target, request.older_than_seconds, request.keys),
                request.limit, auth.caller(),
            )
            now = time.time()
            return farm_pb2.CacheListing(
                entries=[_cache_entry(e, now) for e in listing.entries],
                matched=listing.matched.entries,
                bytes=listing.matched.bytes,
                hits=listing.matched.hits,
                targets=[_target_totals(t, tot) for t, tot in listing.by_target.items()],
            )

    async def EvictArtifacts(
        self, request: farm_pb2.CacheEvict, context: _Context
    ) -> farm_pb2.CacheEvictReply:
        async with _ErrorMapping(context):
            evicted = await self.cache.evict(
                _filters(request.target, request.older_than_seconds, request.keys),
                request.all, auth.caller(),
            )
            shared: dict[str, int] = {}
            for e in evicted:
                shared.update(e.digests)
            return farm_pb2.CacheEvictReply(
                evicted=[e.key for e in evicted], bytes=sum(shared.values())
            )

    async def PutPrecompiled(
        self, request: farm_pb2.PrecompiledUpload, context: _Context
    ) -> farm_pb2.PrecompiledReply:
        async with _ErrorMapping(context):
            return farm_pb2.PrecompiledReply(key=await self.farm.put_precompiled(request, auth.caller()))

    async def ExplainPrecompiledMiss(
        self, request: farm_pb2.PrecompiledMiss, context: _Context
    ) -> farm_pb2.MissExplanation:
        async with _ErrorMapping(context):
            return (await self.farm.explain_precompiled(request, auth.caller())).to_proto()

    async def CompileKernel(self, request: farm_pb2.KernelRequest, context: _Context) -> farm_pb2.KernelReply:
        async with _ErrorMapping(context):
            k = await self.kernels.compile(request, request.ByteSize(), auth.caller())
            return farm_pb2.KernelReply(
                key=k.key,
                cache_hit=k.cache_hit,
                kind=k.manifest.kernels[0].kind,
                binary=k.binary,
                assembly=k.assembly,
                metadata_json=k.metadata,
                triton_version=k.manifest.fingerprint.get("triton_version", ""),
                worker=k.manifest.worker,
                compile_seconds=k.manifest.timings.get("kernel", 0.0),
                manifest=k.manifest.to_json(),
            )


def _filters(target: str, older_than_s: float, keys: Iterable[str]) -> Filters:
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
