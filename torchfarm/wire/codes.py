"""The typed contract of failures and stages, torch-free: the enums of farm.proto as
Python enums, and next to each, the table of what its members mean for the client.

- `JobError`: why a job ended FAILED (`JobStatus.error_code` carries the name, and job
  records in Redis store it). `JOB_ERRORS` says whether each is retryable and whether
  the client falls back to a local compile.
- `Reason`: why the coordinator refused a call (the `torchfarm-reason` trailing
  metadata carries the name). `REASONS` gives each its gRPC status, and whether the
  client retries and falls back.
- `Stage`: where a job is (`JobStatus.stage` carries the name, lower case).
- `Rejection`: why an artifact was refused (ArtifactRejected's `code`, lower case).

Each member's value is the string records and metadata carry (so a member can go
wherever the name went), and `number` its proto value; a unit test checks that every
proto value has a member and a table entry, and the reverse.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from torchfarm.v1 import farm_pb2


class _ProtoEnum(enum.StrEnum):
    """A proto enum's values by name: a member is the string records and metadata
    carry, and `number` is its value on the wire."""

    @property
    def number(self) -> int:
        return _PROTO[type(self)].Value(self.name)


class JobError(_ProtoEnum):
    """farm.proto's JobError.Code, without UNSPECIFIED; the value is the name."""

    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    BUILD_MISMATCH = "BUILD_MISMATCH"
    INVALID_GRAPH = "INVALID_GRAPH"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    REQUEST_EXPIRED = "REQUEST_EXPIRED"
    TOO_MANY_ATTEMPTS = "TOO_MANY_ATTEMPTS"
    ARTIFACT_TOO_LARGE = "ARTIFACT_TOO_LARGE"
    OPTION_NOT_ALLOWED = "OPTION_NOT_ALLOWED"
    PLAN_EXPIRED = "PLAN_EXPIRED"
    KERNELS_LOST = "KERNELS_LOST"
    UNSHIPPABLE_GUARD = "UNSHIPPABLE_GUARD"
    INVALID_KERNEL = "INVALID_KERNEL"
    KERNEL_COMPILE_ERROR = "KERNEL_COMPILE_ERROR"
    KERNEL_TIMEOUT = "KERNEL_TIMEOUT"
    WRONG_TARGET = "WRONG_TARGET"
    RECORD_TAMPERED = "RECORD_TAMPERED"
    INVALID_KERNEL_SPEC = "INVALID_KERNEL_SPEC"
    RANK_SPECIFIC = "RANK_SPECIFIC"
    WORKER_FAULT = "WORKER_FAULT"


class Reason(_ProtoEnum):
    """farm.proto's Failure.Reason, without UNSPECIFIED; the value is the name."""

    INTERNAL = "INTERNAL"
    INVALID_REQUEST = "INVALID_REQUEST"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    TENANT_QUEUE_FULL = "TENANT_QUEUE_FULL"
    NO_WORKER = "NO_WORKER"
    NOT_FOUND = "NOT_FOUND"
    ARTIFACT_CORRUPT = "ARTIFACT_CORRUPT"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    UNKNOWN_TARGET = "UNKNOWN_TARGET"
    OPTION_NOT_ALLOWED = "OPTION_NOT_ALLOWED"
    GRAPH_TOO_LARGE = "GRAPH_TOO_LARGE"
    DISALLOWED_OP = "DISALLOWED_OP"
    INVALID_GRAPH = "INVALID_GRAPH"
    INVALID_KERNEL = "INVALID_KERNEL"
    KERNEL_COMPILE_ERROR = "KERNEL_COMPILE_ERROR"
    KERNEL_FAILED = "KERNEL_FAILED"
    KERNEL_TIMEOUT = "KERNEL_TIMEOUT"
    KERNEL_EVICTED = "KERNEL_EVICTED"
    NOTHING_TO_EVICT = "NOTHING_TO_EVICT"
    INVALID_FILTER = "INVALID_FILTER"
    AMBIGUOUS_KEY = "AMBIGUOUS_KEY"
    WATCH_LIMIT = "WATCH_LIMIT"
    AUTH_THROTTLED = "AUTH_THROTTLED"
    BUILD_NOT_SERVED = "BUILD_NOT_SERVED"
    STORAGE_QUOTA = "STORAGE_QUOTA"
    UPLOAD_RATE = "UPLOAD_RATE"
    EXPLAIN_RATE = "EXPLAIN_RATE"
    FETCH_LIMIT = "FETCH_LIMIT"
    LISTING_LIMIT = "LISTING_LIMIT"


class Stage(_ProtoEnum):
    """farm.proto's Stage.Name, without UNSPECIFIED; the value is the name in lower
    case, as records and `JobStatus.stage` carry it: "compile"."""

    DECODE = "decode"
    COMPILE = "compile"
    DECOMPOSING = "decomposing"
    LOWERING = "lowering"
    KERNELS = "kernels"
    ASSEMBLING = "assembling"
    EXPORT = "export"
    STORE = "store"
    DONE = "done"


HANDED_ON = frozenset({Stage.LOWERING, Stage.KERNELS, Stage.ASSEMBLING})
"""Stages of a staged job after its graph job has ended: later stage jobs finish it."""


class Rejection(_ProtoEnum):
    """farm.proto's ArtifactRejection.Reason, without UNSPECIFIED; the value is the name
    in lower case, the `code` of sdk.errors.ArtifactRejected and a metrics label. Every
    one falls back (sdk/errors.py), so it needs no table."""

    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    INVALID = "invalid"
    MISMATCH = "mismatch"
    FINGERPRINT = "fingerprint"
    DIGEST = "digest"
    MALFORMED = "malformed"
    UNTRUSTED_FARM = "untrusted_farm"
    CORRUPT = "corrupt"
    TOO_LARGE = "too_large"
    GUARDS = "guards"
    WRONG_ARCH = "wrong_arch"
    BAD_KERNEL = "bad_kernel"
    KERNEL_INSTALL = "kernel_install"
    DESERIALIZE = "deserialize"
    ISA = "isa"


_PROTO: dict[type[_ProtoEnum], EnumTypeWrapper] = {
    JobError: farm_pb2.JobError.Code,
    Reason: farm_pb2.Failure.Reason,
    Stage: farm_pb2.Stage.Name,
    Rejection: farm_pb2.ArtifactRejection.Reason,
}
"""Each enum's proto counterpart."""


@dataclass(frozen=True)
class JobErrorInfo:
    retryable: bool
    """The failure came from the farm's state, not the request: the same request may
    succeed once the failed record expires (the worker's failed_ttl_s)."""
    fallback: bool = True
    """With fallback="local" the client compiles the graph locally; False: it raises."""


JOB_ERRORS: dict[JobError, JobErrorInfo] = {
    JobError.COMPILE_ERROR: JobErrorInfo(retryable=False),
    JobError.COMPILE_TIMEOUT: JobErrorInfo(retryable=False),
    JobError.BUILD_MISMATCH: JobErrorInfo(retryable=False),
    JobError.INVALID_GRAPH: JobErrorInfo(retryable=False),
    JobError.MALFORMED_REQUEST: JobErrorInfo(retryable=False),
    JobError.REQUEST_EXPIRED: JobErrorInfo(retryable=True),
    JobError.TOO_MANY_ATTEMPTS: JobErrorInfo(retryable=True),
    JobError.ARTIFACT_TOO_LARGE: JobErrorInfo(retryable=False),
    JobError.OPTION_NOT_ALLOWED: JobErrorInfo(retryable=False),
    JobError.PLAN_EXPIRED: JobErrorInfo(retryable=True),
    JobError.KERNELS_LOST: JobErrorInfo(retryable=True),
    JobError.UNSHIPPABLE_GUARD: JobErrorInfo(retryable=False),
    JobError.INVALID_KERNEL: JobErrorInfo(retryable=False),
    JobError.KERNEL_COMPILE_ERROR: JobErrorInfo(retryable=False),
    JobError.KERNEL_TIMEOUT: JobErrorInfo(retryable=False),
    JobError.WRONG_TARGET: JobErrorInfo(retryable=True),
    # Someone wrote to the farm's Redis: nothing was signed; an operator must look.
    JobError.RECORD_TAMPERED: JobErrorInfo(retryable=False),
    JobError.INVALID_KERNEL_SPEC: JobErrorInfo(retryable=False),
    # Not a failure of the graph: the SDK submits it again keyed with its rank.
    JobError.RANK_SPECIFIC: JobErrorInfo(retryable=False),
    # A bug of the farm's (workers/runtime.py record_fault): the worker's log has the
    # traceback; the same request likely meets it again.
    JobError.WORKER_FAULT: JobErrorInfo(retryable=False),
}
"""Every job error's meaning for the client. None raises: a graph the farm could not
compile still compiles locally, with a warning (sdk/errors.py RemoteCompileError)."""


@dataclass(frozen=True)
class ReasonInfo:
    status: str
    """The gRPC status code's name the coordinator answers with."""
    retryable: bool
    """The client's channel retries the call (sdk/client.py's retry policy retries
    exactly these statuses): the refusal is transient, not about the request."""
    fallback: bool = True
    """With fallback="local" the client compiles the graph locally; False: it raises."""


_INVALID = ReasonInfo("INVALID_ARGUMENT", retryable=False)
_DOWN = ReasonInfo("UNAVAILABLE", retryable=True)

REASONS: dict[Reason, ReasonInfo] = {
    Reason.INTERNAL: ReasonInfo("INTERNAL", retryable=False),
    Reason.INVALID_REQUEST: _INVALID,
    Reason.REQUEST_TOO_LARGE: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    Reason.TENANT_QUEUE_FULL: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    # Not UNAVAILABLE: no worker serves the target at all, so retrying cannot help.
    Reason.NO_WORKER: ReasonInfo("FAILED_PRECONDITION", retryable=False),
    Reason.NOT_FOUND: ReasonInfo("NOT_FOUND", retryable=False),
    Reason.ARTIFACT_CORRUPT: ReasonInfo("DATA_LOSS", retryable=False),
    Reason.BACKEND_UNAVAILABLE: _DOWN,
    Reason.UNAUTHENTICATED: ReasonInfo("UNAUTHENTICATED", retryable=False),
    Reason.MALFORMED_REQUEST: _INVALID,
    Reason.UNKNOWN_TARGET: _INVALID,
    Reason.OPTION_NOT_ALLOWED: _INVALID,
    Reason.GRAPH_TOO_LARGE: _INVALID,
    Reason.DISALLOWED_OP: _INVALID,
    Reason.INVALID_GRAPH: _INVALID,
    Reason.INVALID_KERNEL: _INVALID,
    Reason.KERNEL_COMPILE_ERROR: _INVALID,
    # The kernel job failed for the farm's reasons (the message names its JobError);
    # a retry would join the same failed record, so it is not retried.
    Reason.KERNEL_FAILED: ReasonInfo("ABORTED", retryable=False),
    # The job lives on: a retry joins it and waits again.
    Reason.KERNEL_TIMEOUT: _DOWN,
    # A retry compiles it again.
    Reason.KERNEL_EVICTED: _DOWN,
    Reason.NOTHING_TO_EVICT: _INVALID,
    Reason.INVALID_FILTER: _INVALID,
    Reason.AMBIGUOUS_KEY: _INVALID,
    # The client waits and watches again itself; the job goes on meanwhile.
    Reason.WATCH_LIMIT: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    Reason.AUTH_THROTTLED: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    # Like NO_WORKER: no worker of the client's torch build serves the target.
    Reason.BUILD_NOT_SERVED: ReasonInfo("FAILED_PRECONDITION", retryable=False),
    # The package is not stored; the client runs its frames the normal way.
    Reason.STORAGE_QUOTA: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    Reason.UPLOAD_RATE: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    # The SDK names no reason for that miss; the package is uploaded as ever.
    Reason.EXPLAIN_RATE: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    # Like WATCH_LIMIT: the client waits and fetches again itself, within its fetch deadline.
    Reason.FETCH_LIMIT: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
    # `torchfarm cache ls/evict` says so; the user runs it again when another has ended.
    Reason.LISTING_LIMIT: ReasonInfo("RESOURCE_EXHAUSTED", retryable=False),
}
"""Every refusal's status and meaning for the client."""

RETRYABLE_STATUSES: tuple[str, ...] = tuple(
    sorted({info.status for info in REASONS.values() if info.retryable})
)
"""The gRPC statuses the client's channel retries: those of the retryable reasons."""


def number(kind: type[_ProtoEnum], name: str) -> int:
    """The wire value of a record's stored name; 0 (UNSPECIFIED) for a name this build
    does not know (a newer worker's, or one a test wrote)."""
    try:
        return kind(name).number
    except ValueError:
        return 0
