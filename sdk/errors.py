"""The SDK's error tree. Each error says whether the SDK may fall back to a local compile.

    FarmError                  .fallback
    ├── FarmUnavailable        True    farm unreachable, no worker for the target, deadline
    │   └── JobLost            True    the job vanished (Redis restarted); resubmitted first
    ├── Unauthenticated        True    the farm refused the token (or none was set)
    ├── GraphRejected          True    the farm cannot take this graph (op or option not
    │                                  allowed, over the node or rank limit, ...)
    ├── RequestTooLarge        True    over the farm's request size limit
    ├── QuotaExceeded          True    the tenant has its quota of compiles in flight
    ├── RemoteCompileError     True    the compile failed on the farm (compile error,
    │                                  timeout, artifact too large); carries its code
    ├── ArtifactRejected       True    the artifact failed verification; never loaded
    ├── KernelRejected         True    the farm refused or could not compile a Triton kernel
    │                                  (source not allowed, Triton's compile error)
    └── ConfigError            False   bad arguments or settings; always raised

`code` is the farm's stable reason when it gave one (`torchfarm-reason` trailing
metadata, or the job's error code: COMPILE_TIMEOUT, ARTIFACT_TOO_LARGE, ...), else the
gRPC status name.

With `fallback="local"` the backend compiles a graph locally on any error whose
`fallback` is True, with one warning; with `fallback="error"` every error is raised.
"""

from __future__ import annotations


class FarmError(Exception):
    fallback = True

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class FarmUnavailable(FarmError):
    pass


class JobLost(FarmUnavailable):
    pass


class Unauthenticated(FarmError):
    pass


class GraphRejected(FarmError):
    pass


class QuotaExceeded(FarmError):
    pass


class RequestTooLarge(FarmError):
    pass


class RemoteCompileError(FarmError):
    pass


class ArtifactRejected(FarmError):
    pass


class KernelRejected(FarmError):
    pass


class ConfigError(FarmError):
    fallback = False
