"""A worker's export path, free of Celery: request → checks → package → store.

Like `workers.job.run_job`, and sharing its context, error and job record: idempotent
under at-least-once delivery, capped in attempts, failing with a stable code. The
artifact is a manifest of kind "export" whose payload is the AOTInductor .pt2 package,
signed like any other (torchfarm/signing.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from google.protobuf.message import DecodeError

from torchfarm import keys, options
from torchfarm.graph_errors import GraphError
from torchfarm.manifest import EXPORT, BlobRef, Manifest, blob_digest
from torchfarm.store import JobState
from torchfarm.v1 import farm_pb2
from workers.exporter import ExportFailed, build_package
from workers.job import JobFailed, WorkerContext, requested_fingerprint
from workers.limits import cpu_time_limit

log = logging.getLogger(__name__)


def run_export_job(key: str, ctx: WorkerContext, namespace: str = "") -> None:
    """Runs one delivery of the export job `key` in the tenant `namespace`."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    store = ctx.store
    attempt = store.incr_attempts(key)
    try:
        if store.get_manifest(key) is not None:
            store.update_job(key, state=JobState.SUCCEEDED, stage="done")
            return
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS",
                f"the job was delivered {attempt} times; a worker was lost on each earlier try",
            )
        store.update_job(
            key, state=JobState.RUNNING, stage="decode", worker=ctx.name, started=time.time()
        )
        manifest = _export_and_store(key, ctx)
    except JobFailed as e:
        fail_export_job(key, ctx, e.code, str(e))
        return
    store.update_job(
        key, state=JobState.SUCCEEDED, stage="done", timings=manifest.timings,
        artifact_bytes=manifest.total_bytes(),
    )
    store.expire_job(key, ctx.settings.done_ttl_s)
    log.info("export key=%s done in %.2fs: package %d bytes", keys.short(key),
             manifest.timings.get("total", 0.0), manifest.payload.size)


def fail_export_job(key: str, ctx: WorkerContext, code: str, message: str) -> None:
    """Marks the export FAILED; `ctx.store` must already be the tenant's."""
    log.warning("export key=%s failed: %s: %s", keys.short(key), code, message[-500:])
    ctx.store.fail_job(key, code, message, ctx.settings.failed_ttl_s)


def _load(key: str, ctx: WorkerContext) -> farm_pb2.CompileRequest:
    data = ctx.store.get_request(key)
    if data is None:
        raise JobFailed("REQUEST_EXPIRED", "the export request is no longer in the cache")
    request = farm_pb2.CompileRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as e:
        raise JobFailed("MALFORMED_REQUEST", f"cannot parse the export request: {e}") from e
    if not request.HasField("export") or keys.compute_key(request, ctx.store.namespace) != key:
        raise JobFailed("MALFORMED_REQUEST", "the stored request is not the export of this key")
    wanted, have = requested_fingerprint(request), ctx.fingerprint.to_dict()
    diff = [f"{k}: wanted {v!r}, worker has {have.get(k)!r}" for k, v in wanted.items() if v != have.get(k)]
    if diff:
        raise JobFailed("BUILD_MISMATCH", "this worker cannot build for the request: " + "; ".join(diff))
    return request


def _export_and_store(key: str, ctx: WorkerContext) -> Manifest:
    t0 = time.perf_counter()
    request = _load(key, ctx)
    try:
        inductor_options = options.check_options(
            request.options.mode, [(o.name, o.json_value) for o in request.options.inductor]
        )
    except options.OptionNotAllowed as e:
        raise JobFailed("OPTION_NOT_ALLOWED", str(e)) from e
    ctx.store.update_job(key, stage="export")
    try:
        with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
            result = build_package(request.graph, request.export, inductor_options)
    except GraphError as e:
        raise JobFailed("INVALID_GRAPH", str(e)) from e
    except ExportFailed as e:
        if any(isinstance(c, ctx.timeout_errors) for c in _chain(e)):
            raise JobFailed("COMPILE_TIMEOUT", "the export ran past the farm's time limit") from e
        raise JobFailed("COMPILE_ERROR", str(e)) from e
    if len(result.package) > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            "ARTIFACT_TOO_LARGE",
            f"the package is {len(result.package)} bytes; the farm stores at most "
            f"{ctx.settings.max_artifact_bytes}",
        )
    ctx.store.update_job(key, stage="store")
    payload = BlobRef(blob_digest(result.package), len(result.package))
    ctx.store.put_blob(payload.digest, result.package)
    manifest = Manifest(
        key=key,
        fingerprint=ctx.fingerprint.to_dict(),
        payload=payload,
        timings={**result.timings, "total": time.perf_counter() - t0},
        worker=ctx.name,
        created=time.time(),
        tenant=ctx.store.namespace,
        kind=EXPORT,
    )
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds the package
    return manifest


def _chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen
