"""The coordinator's error tree. Each error carries `reason`, a `torchfarm.wire.codes.Reason`;
the servicer answers with that reason's gRPC status (`torchfarm.wire.codes.REASONS`) and
sends its name in the `torchfarm-reason` trailing metadata.

    CoordinatorError
    ├── InvalidRequest      INVALID_ARGUMENT    malformed graph, disallowed op or option,
    │                                           graph over a size limit, unknown device
    ├── RequestTooLarge     RESOURCE_EXHAUSTED  over the request size limit
    ├── TenantQueueFull     RESOURCE_EXHAUSTED  the tenant has its quota of jobs in flight
    │                                           (graph and kernel), or of Watch streams
    │                                           (reason WATCH_LIMIT) or FetchArtifact
    │                                           streams (FETCH_LIMIT) open at once, or of
    │                                           miss explanations a minute (EXPLAIN_RATE)
    ├── StorageFull         RESOURCE_EXHAUSTED  an upload over the tenant's stored-bytes
    │                                           quota or the cache's room (STORAGE_QUOTA),
    │                                           or its upload rate (UPLOAD_RATE)
    ├── NoWorker            FAILED_PRECONDITION no live worker serves the target: not
    │                                           retried, unlike an outage
    ├── NotFound            NOT_FOUND           no such job or artifact
    ├── ArtifactCorrupt     DATA_LOSS           a cached blob no longer matches its digest
    ├── KernelFailed        ABORTED             a kernel job failed for the farm's reasons
    └── BackendUnavailable  UNAVAILABLE         Redis or the broker cannot be reached (the
                                                client retries it)

Anything else is a bug: INTERNAL, which the client reports as one, naming the key.
Calls without valid credentials never reach these: the auth interceptor answers them
with UNAUTHENTICATED (services/coordinator/auth.py).
"""

from torchfarm.wire.codes import Reason


class CoordinatorError(Exception):
    reason = Reason.INTERNAL

    def __init__(self, message: str, reason: Reason | None = None):
        super().__init__(message)
        if reason is not None:
            if not isinstance(reason, Reason):
                raise TypeError(f"a coordinator error's reason is a torchfarm.wire.codes.Reason, not {reason!r}")
            self.reason = reason


class InvalidRequest(CoordinatorError):
    reason = Reason.INVALID_REQUEST


class RequestTooLarge(CoordinatorError):
    reason = Reason.REQUEST_TOO_LARGE


class TenantQueueFull(CoordinatorError):
    reason = Reason.TENANT_QUEUE_FULL


class StorageFull(CoordinatorError):
    reason = Reason.STORAGE_QUOTA


class NoWorker(CoordinatorError):
    reason = Reason.NO_WORKER


class NotFound(CoordinatorError):
    reason = Reason.NOT_FOUND


class ArtifactCorrupt(CoordinatorError):
    reason = Reason.ARTIFACT_CORRUPT


class KernelFailed(CoordinatorError):
    reason = Reason.KERNEL_FAILED


class BackendUnavailable(CoordinatorError):
    reason = Reason.BACKEND_UNAVAILABLE
