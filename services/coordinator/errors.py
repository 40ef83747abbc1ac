"""The coordinator's error tree. The servicer maps each class to one gRPC status code.

    CoordinatorError
    ├── InvalidRequest      INVALID_ARGUMENT   malformed graph, disallowed op, unknown device
    ├── RequestTooLarge     RESOURCE_EXHAUSTED over a size limit
    ├── NoWorker            UNAVAILABLE        no live worker serves the target
    ├── NotFound            NOT_FOUND          no such job or artifact
    └── BackendUnavailable  UNAVAILABLE        Redis or the broker cannot be reached
"""


class CoordinatorError(Exception):
    pass


class InvalidRequest(CoordinatorError):
    pass


class RequestTooLarge(CoordinatorError):
    pass


class NoWorker(CoordinatorError):
    pass


class NotFound(CoordinatorError):
    pass


class BackendUnavailable(CoordinatorError):
    pass
