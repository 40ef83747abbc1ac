"""The worker runtime every job kind shares, free of Celery: one delivery of a job
(`run_delivery`: count it, finish at once if its result exists, stop at the attempt cap,
run the work, record SUCCEEDED or FAILED), the worker's context, loading a stored
request and checking it against its key and this worker's build, and the job's error.

Celery delivers at least once, so every delivery is idempotent: a redelivered job whose
result already exists finishes at once, and blobs are written by content digest.
Each job belongs to a tenant namespace; everything it reads and writes goes through
`Store.tenant(namespace)`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from torchfarm.fx.fingerprint import Fingerprint
from torchfarm.fx.torch_library import job_scope as use_standins_for_job
from torchfarm.fx.torch_library import use_installed as use_installed_ops
from torchfarm.graph.graph_errors import GraphError
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.storage.store import JobState, Store
from torchfarm.trust.seal import Seal
from torchfarm.trust.signing import Signer
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, options
from torchfarm.wire.codes import JobError, Stage
from torchfarm.wire.manifest import BlobRef, blob_digest
from workers.executor import Executor
from workers.inprocess import InProcessExecutor
from workers.job import JobFailed, Prepared
from workers.sandbox import Sandbox, SandboxExecutor
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)


@dataclass(frozen=True)
class WorkerContext:
    settings: WorkerSettings
    store: Store
    fingerprint: Fingerprint
    name: str
    signer: Signer | None = None
    """Signs every manifest; None leaves artifacts unsigned (clients pinning keys refuse them)."""
    seal: Seal | None = None
    """Seals the records this worker hands to others through Redis, and checks theirs;
    None (a development farm) trusts Redis."""
    timeout_errors: tuple[type[BaseException], ...] = ()
    """The task runner's time-limit exceptions (Celery's soft limit): a compile that
    failed because of one fails COMPILE_TIMEOUT, even if Inductor wrapped it."""
    retried_errors: tuple[type[BaseException], ...] = ()
    """The exceptions the task runner runs a task again for (a lost Redis or broker
    connection, torchfarm/celeryconf.py): they leave a job's delivery as they are."""
    timed_out: Callable[[], bool] = lambda: False
    """Whether the task runner's time limit fired during this task (workers/limits.py's
    `SOFT_LIMIT`): a compile that failed after it fails COMPILE_TIMEOUT, even where torch
    caught the limit's exception and failed with another."""
    send: Callable[[str, list[Any], str], None] | None = None
    """Sends a stage job (Celery task name, arguments, queue) of a staged compile
    (workers/jobs/); None allows only the whole-graph path."""
    sandbox: Sandbox | None = None
    """The worker's sandbox (workers/sandbox/process.py), a child without secrets, for
    `executor`; None runs every step in this process (TORCHFARM_SANDBOX=off, the fakes)."""

    @functools.cached_property
    def executor(self) -> Executor:
        """Where the compile steps on a tenant's input run (workers/executor.py): in the
        sandbox's child, or in this process without a sandbox."""
        return executor_for(self.settings, self.sandbox, self.timeout_errors, self.timed_out)

    @property
    def runner_errors(self) -> tuple[type[BaseException], ...]:
        """The task runner's own exceptions, which leave a job's delivery as they are:
        any other fails the job at once (`record_fault`)."""
        return (*self.timeout_errors, *self.retried_errors)

    def __post_init__(self) -> None:
        # Operator-configured packages register their ops before any graph decodes.
        use_installed_ops(self.settings.installed_op_modules)


def executor_for(
    settings: WorkerSettings, sandbox: Sandbox | None, timeout_errors: tuple[type[BaseException], ...] = (),
    timed_out: Callable[[], bool] = lambda: False,
) -> Executor:
    """A worker's executor. With a sandbox every step runs in its child, except on a
    worker that lowers a GPU's graphs without the GPU (workers/gpuless.py): its fakes
    live in this process, so Inductor runs here and only the kernel compiles go to the
    sandbox."""
    if sandbox is None:
        return InProcessExecutor(settings.compile_cpu_limit_s, timeout_errors, timed_out)
    boxed = SandboxExecutor(sandbox, settings.max_artifact_bytes, settings.installed_op_modules, timeout_errors)
    if settings.lower_without_gpu:
        return InProcessExecutor(settings.compile_cpu_limit_s, timeout_errors, timed_out, kernels=boxed)
    return boxed


class Outcome(Protocol):
    """What a job's work returns when it ended the job: a manifest, or a kernel record."""

    @property
    def timings(self) -> dict[str, float]: ...  # read-only: manifests and records are frozen

    def total_bytes(self) -> int: ...


@dataclass(frozen=True)
class Delivery:
    """How one job kind's deliveries are counted and recorded."""

    worker: str
    max_attempts: int
    done_ttl_s: int
    failed_ttl_s: int
    redact: Callable[[str], str] = str
    """What a failure's message becomes before it is recorded for the client."""
    runner_errors: tuple[type[BaseException], ...] = ()
    """The task runner's own exceptions (its time limit, a lost connection it runs the
    task again for): they leave the delivery as they are. Any other exception fails the
    job at once."""

    @classmethod
    def of(cls, ctx: WorkerContext) -> Delivery:
        s = ctx.settings
        return cls(ctx.name, s.max_attempts, s.done_ttl_s, s.failed_ttl_s, runner_errors=ctx.runner_errors)


def run_delivery(
    key: str, store: Store, delivery: Delivery,
    finished: Callable[[Store], bool], work: Callable[[Store], Outcome | None],
) -> Outcome | None:
    """One delivery of any job kind, in the tenant view `store`: count it, finish at once
    if `finished` (the result exists), stop at the attempt cap, run `work`, and record
    SUCCEEDED or FAILED. Returns what `work` stored; None when the job ended otherwise
    or, staged, when later stage jobs finish it (workers/jobs/)."""
    attempt = store.incr_attempts(key)
    if attempt == 0:  # its record expired in the queue: no one waits for it
        log.warning("job %s: its record expired before this delivery; dropped", key[:12])
        return None
    try:
        if finished(store):
            store.update_job(key, state=JobState.SUCCEEDED, stage=Stage.DONE)
            return None
        if attempt > delivery.max_attempts:
            raise JobFailed(
                JobError.TOO_MANY_ATTEMPTS,
                f"the job was delivered {attempt} times; a worker was lost on each earlier try",
            )
        store.update_job(
            key, state=JobState.RUNNING, stage=Stage.DECODE, worker=delivery.worker, started=time.time()
        )
        with use_standins_for_job():  # one tenant's custom ops never reach another's job
            outcome = work(store)
    except JobFailed as e:
        record_failure(key, store, e.code, delivery.redact(str(e)), delivery.failed_ttl_s)
        return None
    except delivery.runner_errors:
        raise
    except Exception as e:  # noqa: BLE001 - a fault of the farm's own: its client learns now, not when the job goes stale
        record_fault(key, store, e, delivery.failed_ttl_s, delivery.redact)
        return None
    if outcome is None:
        return None
    store.update_job(
        key, state=JobState.SUCCEEDED, stage=Stage.DONE, timings=outcome.timings,
        artifact_bytes=outcome.total_bytes(),
    )
    store.expire_job(key, delivery.done_ttl_s)
    return outcome


def in_tenant(ctx: WorkerContext, namespace: str) -> WorkerContext:
    """The context with its store in the tenant `namespace`."""
    return dataclasses.replace(ctx, store=ctx.store.tenant(namespace))


def fail_job(key: str, ctx: WorkerContext, code: JobError, message: str, namespace: str = "") -> None:
    """Marks a job FAILED from outside its delivery (a time limit hit, say)."""
    record_failure(key, ctx.store.tenant(namespace), code, message, ctx.settings.failed_ttl_s)


def record_fault(key: str, store: Store, error: Exception, ttl_s: int, redact: Callable[[str], str] = str) -> None:
    """Fails the job for an exception no step expected (a bug of the farm's, a
    RecursionError on a deep record): at once, rather than leaving it RUNNING until the
    coordinator finds it stale and every later delivery does the same."""
    log.error("job key=%s: the worker failed unexpectedly", keys.short(key), exc_info=error)
    message = f"the worker failed unexpectedly: {type(error).__name__}: {str(error)[:500]}"
    record_failure(key, store, JobError.WORKER_FAULT, redact(message), ttl_s)


def record_failure(key: str, store: Store, code: JobError, message: str, ttl_s: int) -> None:
    log.warning("job key=%s failed: %s: %s", keys.short(key), code.name, _abridged(message))
    store.fail_job(key, code.name, message, ttl_s)


def _abridged(message: str, each: int = 400) -> str:
    """A long message's start (a refusal names its op there) and end (a compile error
    its cause), for a log line."""
    if len(message) <= 2 * each:
        return message
    return f"{message[:each]} [...] {message[-each:]}"


def load_request(key: str, store: Store, kind: type[R], what: str) -> R:
    """The stored request of `key`, a `kind` message; it must hash to `key` in the
    store's namespace, or the job fails MALFORMED_REQUEST."""
    get, key_of = _REQUEST_KINDS[kind]
    data = get(store, key)
    if data is None:
        raise JobFailed(JobError.REQUEST_EXPIRED, f"the {what} request is no longer in the cache")
    request = kind()
    try:
        request.ParseFromString(data)
    except DecodeError as e:
        raise JobFailed(JobError.MALFORMED_REQUEST, f"cannot parse the {what} request: {e}") from e
    if key_of(request, store.namespace) != key:
        raise JobFailed(JobError.MALFORMED_REQUEST, f"the stored {what} request does not match its key")
    return request


_REQUEST_KINDS: dict[type, tuple[Callable[[Store, str], bytes | None], Callable[[Any, str], str]]] = {
    farm_pb2.CompileRequest: (Store.get_request, keys.compute_key),
    farm_pb2.KernelRequest: (Store.get_kernel_request, keys.compute_kernel_key),
}


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


def check_build(request: farm_pb2.CompileRequest, local: Fingerprint) -> None:
    """Refuses a request for another build or target than this worker's: BUILD_MISMATCH."""
    wanted = requested_fingerprint(request)
    have = local.to_dict()
    diff = [
        f"{k}: wanted {wanted[k]!r}, worker has {have.get(k)!r}"
        for k in wanted
        if wanted[k] != have.get(k)
    ]
    if diff:
        raise JobFailed(
            JobError.BUILD_MISMATCH, "this worker cannot build for the request: " + "; ".join(diff)
        )


def check_options(request: farm_pb2.CompileRequest) -> dict[str, Any]:
    """The request's Inductor options, checked against the allow-list, and its autocast."""
    try:
        options.check_autocast([(a.device_type, a.dtype) for a in request.options.autocast])
        options.check_sdpa_backends(list(request.options.sdpa_backends))
        return options.check_options(
            request.options.mode, [(o.name, o.json_value) for o in request.options.inductor]
        )
    except options.OptionNotAllowed as e:
        raise JobFailed(JobError.OPTION_NOT_ALLOWED, str(e)) from e


def prepare(key: str, ctx: WorkerContext) -> Prepared:
    """Loads the job's request, refuses a build mismatch, checks its options and the
    graph (`validate_graph`, torch-free and bounded); raises JobFailed. The graph is
    decoded here only where the compile runs in this process (`Prepared.decoded`); a
    sandboxed compile's child decodes it. The compile runs under the grad mode and
    autocast it was captured in (`global_state.applied`)."""
    t0 = time.perf_counter()
    request = load_request(key, ctx.store, farm_pb2.CompileRequest, "compile")
    check_build(request, ctx.fingerprint)
    inductor_options = check_options(request)
    try:
        validate_graph(request.graph)
    except GraphError as e:
        raise JobFailed(JobError.INVALID_GRAPH, str(e)) from e
    job = Prepared(request, None, inductor_options, 0.0, t0)
    if ctx.executor.decodes_here:
        job.decoded  # noqa: B018  decoded now, so a bad graph fails before the compile starts
    job.decode_s = time.perf_counter() - t0
    return job


def put_blob(store: Store, data: bytes) -> BlobRef:
    """Stores `data` by its digest; its reference."""
    ref = BlobRef(blob_digest(data), len(data))
    store.put_blob(ref.digest, data)
    return ref


def live_job(key: str, ctx: WorkerContext) -> bool:
    """Whether the job is still in flight; a stage job of an ended job is dropped."""
    job = ctx.store.get_job(key)
    if job is None or job.state in JobState.TERMINAL:
        log.info("job key=%s is %s; stage job dropped", keys.short(key), job.state if job else "gone")
        return False
    return True


def get_verified_blob(store: Store, digest: str) -> bytes | None:
    """A blob whose bytes still hash to its digest; None if it is gone. A blob rewritten
    under its digest fails the job: nothing acts on it."""
    data = store.get_blob(digest)
    if data is not None and blob_digest(data) != digest:
        raise JobFailed(JobError.RECORD_TAMPERED, f"blob {digest[:12]} no longer matches its digest")
    return data

