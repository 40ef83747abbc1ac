"""The coordinator's error tree. The servicer maps each class to one gRPC status code,
and sends `reason`, a stable name, in the `torchfarm-reason` trailing metadata.

    CoordinatorError
    ├── InvalidRequest      INVALID_ARGUMENT   malformed graph, disallowed op or option,
    │                                          graph over a size limit, unknown device
    ├── RequestTooLarge     RESOURCE_EXHAUSTED over the request size limit
    ├── TenantQueueFull     RESOURCE_EXHAUSTED the tenant has its quota of jobs in flight
    │                                          (graph and kernel), or of Watch streams
    │                                          (reason WATCH_LIMIT)
    ├── NoWorker            UNAVAILABLE        no live worker serves the target
    ├── NotFound            NOT_FOUND          no such job or artifact
    ├── ArtifactCorrupt     DATA_LOSS          a cached blob no longer matches its digest
    └── BackendUnavailable  UNAVAILABLE        Redis or the broker cannot be reached

Calls without valid credentials never reach these: the auth interceptor answers them
with UNAUTHENTICATED (services/coordinator/auth.py).
"""


class CoordinatorError(Exception):
    reason = "INTERNAL"

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        if reason:
            self.reason = reason


class InvalidRequest(CoordinatorError):
    reason = "INVALID_REQUEST"


class RequestTooLarge(CoordinatorError):
    reason = "REQUEST_TOO_LARGE"


class TenantQueueFull(CoordinatorError):
    reason = "TENANT_QUEUE_FULL"


class NoWorker(CoordinatorError):
    reason = "NO_WORKER"


class NotFound(CoordinatorError):
    reason = "NOT_FOUND"


class ArtifactCorrupt(CoordinatorError):
    reason = "ARTIFACT_CORRUPT"


class BackendUnavailable(CoordinatorError):
    reason = "BACKEND_UNAVAILABLE"
