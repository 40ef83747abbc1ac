"""The export job: request → checks → AOTInductor package (the executor's `export`:
workers/executor.py) → store.

Each delivery goes through `workers.runtime.run_delivery`, as a compile's does. The
artifact is a manifest of kind "export" whose payload is the AOTInductor .pt2 package,
signed like any other (torchfarm/trust/signing.py).
"""

from __future__ import annotations

import logging
import time

from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import EXPORT, BlobRef, Manifest, blob_digest
from workers.runtime import (
    Delivery,
    JobFailed,
    WorkerContext,
    check_build,
    check_options,
    in_tenant,
    load_request,
    run_delivery,
)

log = logging.getLogger(__name__)


def run_export_job(key: str, ctx: WorkerContext, namespace: str = "") -> None:
    """Runs one delivery of the export job `key` in the tenant `namespace`."""
    ctx = in_tenant(ctx, namespace)
    manifest = run_delivery(
        key, ctx.store, Delivery.of(ctx), lambda store: store.get_manifest(key) is not None,
        lambda store: _export_and_store(key, ctx),
    )
    if isinstance(manifest, Manifest):
        log.info("export key=%s done in %.2fs: package %d bytes", keys.short(key),
                 manifest.timings.get("total", 0.0), manifest.payload.size)


def _export_and_store(key: str, ctx: WorkerContext) -> Manifest:
    t0 = time.perf_counter()
    request = load_request(key, ctx.store, farm_pb2.CompileRequest, "export")
    if not request.HasField("export"):
        raise JobFailed(JobError.MALFORMED_REQUEST, "the stored request is not the export of this key")
    check_build(request, ctx.fingerprint)
    inductor_options = check_options(request)
    ctx.store.update_job(key, stage=Stage.EXPORT)
    package, timings = ctx.executor.export(request, inductor_options)
    if len(package) > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            JobError.ARTIFACT_TOO_LARGE,
            f"the package is {len(package)} bytes; the farm stores at most {ctx.settings.max_artifact_bytes}",
        )
    ctx.store.update_job(key, stage=Stage.STORE)
    payload = BlobRef(blob_digest(package), len(package))
    ctx.store.put_blob(payload.digest, package)
    manifest = Manifest(
        key=key,
        fingerprint=ctx.fingerprint.to_dict(),
        payload=payload,
        timings={**timings, "total": time.perf_counter() - t0},
        worker=ctx.name,
        created=time.time(),
        tenant=ctx.store.namespace,
        kind=EXPORT,
    )
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds the package
    return manifest
