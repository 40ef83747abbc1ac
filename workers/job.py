"""A worker's job path, free of Celery: request → checks → decode → compile → store.

`run_job` is idempotent: Celery delivers at least once, so a redelivered job that
already has its artifact finishes at once, and blobs are written by content digest.

Each job belongs to a tenant namespace; everything it reads and writes goes through
`Store.tenant(namespace)`, and the manifest names the namespace. With a signing key the
worker signs the manifest for its key, namespace, content and fingerprint
(torchfarm/signing.py) before it is written.

On the staged path (`TORCHFARM_PIPELINE=staged`, the default) this job is the
decomposition stage (workers/lowering.py): it sends the lowering job, and the later
stage jobs write the artifact and finish the record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from sdk import guards as shape_guards
from sdk.target import Fingerprint
from sdk.vecisa import probed_toolchain
from torchfarm import keys, options
from torchfarm.graph_errors import GraphError
from torchfarm.manifest import BlobRef, KernelRef, Manifest, blob_digest
from torchfarm.signing import Signer
from torchfarm.store import JobState, Store
from torchfarm.v1 import farm_pb2
from workers.compiler import (
    CompileFailed,
    CompileResult,
    cause_of,
    compile_graph,
)
from workers.graph_build import DecodedGraph, decode_graph
from workers.limits import cpu_time_limit
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)


class JobFailed(Exception):
    """Ends a job as FAILED without a retry; `code` is the stable name clients see."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class WorkerContext:
    settings: WorkerSettings
    store: Store
    fingerprint: Fingerprint
    name: str
    signer: Signer | None = None
    """Signs every manifest; None leaves artifacts unsigned (clients pinning keys refuse them)."""
    timeout_errors: tuple[type[BaseException], ...] = ()
    """The task runner's time-limit exceptions (Celery's soft limit): a compile that
    failed because of one fails COMPILE_TIMEOUT, even if Inductor wrapped it."""
    send: Callable[[str, list[Any], str], None] | None = None
    """Sends a stage job (Celery task name, arguments, queue) of a staged compile
    (workers/pipeline.py); None allows only the whole-graph path."""


def requested_fingerprint(request: farm_pb2.CompileRequest) -> dict[str, str]:
    """The fingerprint the client asked for, in the same fields as `Fingerprint`."""
    t, b = request.target, request.build
    return {
        "torch_version": b.torch_version,
        "torch_git": b.torch_git,
        "triton_version": b.triton_version,
        "python": b.python,
        "platform": b.platform,
        "device": t.device,
        "arch": t.arch,
        "isa": t.isa,
        "compiler": t.compiler,
    }


def run_job(key: str, ctx: WorkerContext, namespace: str = "") -> None:
    """Runs one delivery of the job for `key` in the tenant `namespace`, recording the
    outcome in its job record."""
    manifest = run_delivery(key, ctx, namespace, _compile_and_store)
    if manifest is not None:
        log.info(
            "job key=%s done in %.2fs: %d kernels, %d bytes",
            keys.short(key), manifest.timings.get("total", 0.0), len(manifest.kernels),
            manifest.total_bytes(),
        )


def run_delivery(
    key: str, ctx: WorkerContext, namespace: str,
    work: Callable[[str, WorkerContext], Manifest | None],
) -> Manifest | None:
    """One delivery of any job kind: count it, finish at once if the artifact exists,
    stop at the attempt cap, run `work`, and record SUCCEEDED or FAILED. Returns the
    manifest `work` stored; None when the job ended otherwise or, staged, when later
    stage jobs finish it (workers/pipeline.py)."""
    ctx = dataclasses.replace(ctx, store=ctx.store.tenant(namespace))
    store = ctx.store
    attempt = store.incr_attempts(key)
    try:
        if store.get_manifest(key) is not None:
            store.update_job(key, state=JobState.SUCCEEDED, stage="done")
            return None
        if attempt > ctx.settings.max_attempts:
            raise JobFailed(
                "TOO_MANY_ATTEMPTS",
                f"the job was delivered {attempt} times; a worker was lost on each earlier try",
            )
        store.update_job(
            key, state=JobState.RUNNING, stage="decode", worker=ctx.name, started=time.time()
        )
        manifest = work(key, ctx)
    except JobFailed as e:
        _fail(key, ctx, e.code, str(e))
        return None
    if manifest is None:
        return None
    store.update_job(
        key,
        state=JobState.SUCCEEDED,
        stage="done",
        timings=manifest.timings,
        artifact_bytes=manifest.total_bytes(),
    )
    store.expire_job(key, ctx.settings.done_ttl_s)
    return manifest


def fail_job(key: str, ctx: WorkerContext, code: str, message: str, namespace: str = "") -> None:
    """Marks a job FAILED from outside `run_job` (a time limit hit, say)."""
    _fail(key, dataclasses.replace(ctx, store=ctx.store.tenant(namespace)), code, message)


def _fail(key: str, ctx: WorkerContext, code: str, message: str) -> None:
    log.warning("job key=%s failed: %s: %s", keys.short(key), code, message[-500:])
    ctx.store.fail_job(key, code, message, ctx.settings.failed_ttl_s)


def _load_request(key: str, store: Store) -> farm_pb2.CompileRequest:
    """The stored request, which must hash to `key` in the store's namespace."""
    data = store.get_request(key)
    if data is None:
        raise JobFailed("REQUEST_EXPIRED", "the compile request is no longer in the cache")
    request = farm_pb2.CompileRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as e:
        raise JobFailed("MALFORMED_REQUEST", f"cannot parse the compile request: {e}") from e
    if keys.compute_key(request, store.namespace) != key:
        raise JobFailed("MALFORMED_REQUEST", "the stored request does not match its key")
    return request


def _check_build(request: farm_pb2.CompileRequest, local: Fingerprint) -> None:
    wanted = requested_fingerprint(request)
    have = local.to_dict()
    diff = [
        f"{k}: wanted {wanted[k]!r}, worker has {have.get(k)!r}"
        for k in wanted
        if wanted[k] != have.get(k)
    ]
    if diff:
        raise JobFailed(
            "BUILD_MISMATCH", "this worker cannot build for the request: " + "; ".join(diff)
        )


@dataclass
class Prepared:
    """A job's request, checked and decoded: what every compile path starts from."""

    request: farm_pb2.CompileRequest
    decoded: DecodedGraph
    inductor_options: dict[str, Any]
    decode_s: float
    began: float
    """`time.perf_counter()` when this job began."""

    def redecoded(self) -> Prepared:
        """The same, decoded afresh: a compile that gave up leaves guards in its ShapeEnv."""
        return dataclasses.replace(self, decoded=decode_graph(self.request.graph))


def prepare(key: str, ctx: WorkerContext) -> Prepared:
    """Loads the job's request, refuses a build mismatch, decodes the graph and checks
    its options; raises JobFailed."""
    t0 = time.perf_counter()
    request = _load_request(key, ctx.store)
    _check_build(request, ctx.fingerprint)
    try:
        decoded = decode_graph(request.graph)
    except GraphError as e:
        raise JobFailed("INVALID_GRAPH", str(e)) from e
    t_decode = time.perf_counter() - t0
    try:
        inductor_options = options.check_options(
            request.options.mode, [(o.name, o.json_value) for o in request.options.inductor]
        )
    except options.OptionNotAllowed as e:
        raise JobFailed("OPTION_NOT_ALLOWED", str(e)) from e
    return Prepared(request, decoded, inductor_options, t_decode, t0)


def _compile_and_store(key: str, ctx: WorkerContext) -> Manifest | None:
    job = prepare(key, ctx)
    ctx.store.update_job(key, stage="compile")
    if ctx.settings.test_delay_s > 0:  # test hook: a compile in flight that tests can watch
        time.sleep(ctx.settings.test_delay_s)
    if ctx.settings.pipeline == "staged" and ctx.send is not None:
        from workers import lowering  # it builds on this module

        return lowering.decompose_or_lower(key, ctx, job)
    return compile_whole(key, ctx, job)


def compile_whole(key: str, ctx: WorkerContext, job: Prepared) -> Manifest:
    """The whole-graph compile, in this job, to the stored and signed manifest."""
    request, decoded = job.request, job.decoded
    ctx.store.update_job(key, stage="compile")
    mark = shape_guards.snapshot(decoded.shape_env)
    try:
        with cpu_time_limit(ctx.settings.compile_cpu_limit_s):
            result = compile_graph(
                decoded.gm,
                decoded.example_inputs,
                fake_mode=decoded.fake_mode,
                dynamic=request.options.dynamic,
                mode=request.options.mode,
                inductor_options=job.inductor_options,
            )
    except CompileFailed as e:
        raise as_job_failure(e, ctx) from e
    guards = added_guards(decoded, mark)
    size = len(result.payload) + sum(len(k.source) + len(k.binary) for k in result.kernels)
    if size > ctx.settings.max_artifact_bytes:
        raise JobFailed(
            "ARTIFACT_TOO_LARGE",
            f"the artifact is {size} bytes; the farm stores at most {ctx.settings.max_artifact_bytes}",
        )
    ctx.store.update_job(key, stage="store")
    t1 = time.perf_counter()
    manifest = _store(key, ctx, result, {"decode": job.decode_s, **result.timings})
    manifest = dataclasses.replace(manifest, guards=guards)
    timings = {
        **manifest.timings,
        "store": time.perf_counter() - t1,
        "total": time.perf_counter() - job.began,
    }
    manifest = dataclasses.replace(manifest, timings=timings)
    if ctx.signer is not None:
        manifest = ctx.signer.sign(manifest, ctx.settings.signature_ttl_s)
    ctx.store.put_manifest(manifest)  # last: a reader that sees it finds every blob
    return manifest


def as_job_failure(e: CompileFailed, ctx: WorkerContext) -> JobFailed:
    """A compile's failure as the job's: COMPILE_TIMEOUT when a time limit caused it."""
    if cause_of(e, ctx.timeout_errors) is not None:
        return JobFailed("COMPILE_TIMEOUT", "the compile ran past the farm's time limit")
    return JobFailed("COMPILE_ERROR", str(e))


def added_guards(decoded: DecodedGraph, mark: tuple) -> tuple[list, ...]:
    """The shape guards the compile added, over the client's symbol names: in a local
    torch.compile they would be Dynamo's guards, so they travel with the artifact."""
    names = {expr: name for name, expr in decoded.symbols.items() if expr.is_Symbol}
    try:
        return tuple(
            shape_guards.encode(e, names)
            for e in shape_guards.added_since(decoded.shape_env, mark)
        )
    except shape_guards.GuardError as e:
        raise JobFailed(
            "UNSHIPPABLE_GUARD", f"the compile added a shape guard the farm cannot ship: {e}"
        ) from e


def _put(store: Store, data: bytes) -> BlobRef:
    ref = BlobRef(blob_digest(data), len(data))
    store.put_blob(ref.digest, data)
    return ref


def _store(
    key: str, ctx: WorkerContext, result: CompileResult, timings: dict[str, float]
) -> Manifest:
    kernels = tuple(
        KernelRef(
            name=k.name,
            kind=k.kind,
            source=_put(ctx.store, k.source),
            binary=_put(ctx.store, k.binary),
        )
        for k in result.kernels
    )
    return Manifest(
        key=key,
        fingerprint=ctx.fingerprint.to_dict(),
        payload=_put(ctx.store, result.payload),
        kernels=kernels,
        timings=timings,
        worker=ctx.name,
        created=time.time(),
        tenant=ctx.store.namespace,
        toolchain=probed_toolchain(),
    )
