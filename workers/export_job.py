"""A worker's export path, free of Celery: request → checks → package → store.

Each delivery goes through `workers.job.run_delivery`, as a compile's does: idempotent
under at-least-once delivery, capped in attempts, failing with a stable code. The
artifact is a manifest of kind "export" whose payload is the AOTInductor .pt2 package,
signed like any other (torchfarm/signing.py).
"""

from __future__ import annotations

import logging
import time

from google.protobuf.message import DecodeError

from torchfarm import keys, options
from torchfarm.graph_errors import GraphError
from torchfarm.manifest import EXPORT, BlobRef, Manifest, blob_digest
from torchfarm.v1 import farm_pb2
from workers.exporter import ExportFailed, build_package
from workers.job import JobFailed, WorkerContext, requested_fingerprint, run_delivery
from workers.limits import cpu_time_limit

log = logging.getLogger(__name__)


def run_export_job(key: str, ctx: WorkerContext, namespace: str = "") -> None:
    """Runs one delivery of the export job `key` in the tenant `namespace`."""
    manifest = run_delivery(key, ctx, namespace, _export_and_store)
    if manifest is not None:
        log.info("export key=%s done in %.2fs: package %d bytes", keys.short(key),
                 manifest.timings.get("total", 0.0), manifest.payload.size)


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
