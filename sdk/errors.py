"""The SDK's error tree. Each error says whether the SDK may fall back to a local compile.

    FarmError                  .fallback
    ├── FarmUnavailable        True    farm unreachable or its backend down (retried by the
    │   │                              channel first), deadline
    │   ├── NoWorker           True    no worker serves the target (FAILED_PRECONDITION;
    │   │                              never retried)
    │   └── JobLost            True    the job vanished (Redis restarted); resubmitted first
    ├── FarmBug                True    the farm answered INTERNAL: a bug in the farm, not an
    │                                  outage. Its message names the request's key and asks
    │                                  for a report; the fallback warns every time
    ├── Unauthenticated        True    the farm refused the token (or none was set)
    ├── GraphRejected          True    the farm cannot take this graph (op or option not
    │                                  allowed, over the node or rank limit, ...)
    ├── RequestTooLarge        True    over the farm's request size limit
    ├── QuotaExceeded          True    the tenant has its quota of compiles in flight
    ├── RemoteCompileError     True    the compile failed on the farm (compile error,
    │                                  timeout, artifact too large); carries its code and,
    │                                  from torchfarm/wire/codes.py, whether it is `retryable`
    ├── ArtifactRejected       True    the artifact failed verification; never loaded
    ├── KernelRejected         True    the farm refused or could not compile a Triton kernel
    │                                  (source not allowed, Triton's compile error)
    └── ConfigError            False   bad arguments or settings; always raised
        └── CompileArgumentError   an argument torch.compile refuses too; also the
                                   TypeError and RuntimeError torch.compile raises

`code` is the farm's stable reason when it gave one (a `torchfarm.wire.codes.Reason` name
from the `torchfarm-reason` trailing metadata, or a `torchfarm.wire.codes.JobError` name:
COMPILE_TIMEOUT, ARTIFACT_TOO_LARGE, ...), else the gRPC status name. What each code
means (retried, falls back) is the table in torchfarm/wire/codes.py.

With `fallback="local"` the backend compiles a graph locally on any error whose
`fallback` is True, with one warning; with `fallback="error"` every error is raised.
"""

from __future__ import annotations

from torchfarm.wire.codes import JOB_ERRORS, JobError
from torchfarm.wire.labels import printable


class FarmError(Exception):
    fallback = True

    def __init__(self, message: str, code: str = ""):
        # Much of a message is the farm's text, which a warning writes to a terminal.
        super().__init__(printable(message))
        self.code = code


class FarmUnavailable(FarmError):
    pass


class NoWorker(FarmUnavailable):
    pass


class JobLost(FarmUnavailable):
    pass


class FarmBug(FarmError):
    """The farm failed on its own bug (INTERNAL). Not an outage: it is reported, with
    the key, every time it happens."""

    def __init__(self, message: str, key: str = "", code: str = "INTERNAL"):
        named = f"key {key}" if key else "the request (key unknown)"
        super().__init__(
            f"{message} -- this is a bug in the compile farm, not an outage; please report "
            f"it with {named} (the coordinator's log has its traceback)",
            code,
        )
        self.key = key


class Unauthenticated(FarmError):
    pass


class GraphRejected(FarmError):
    pass


class QuotaExceeded(FarmError):
    pass


class RequestTooLarge(FarmError):
    pass


class RemoteCompileError(FarmError):
    retryable = False
    """The job's failure was the farm's state, not the graph: the same request may
    succeed later (torchfarm/wire/codes.py JOB_ERRORS)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message, code)
        info = JOB_ERRORS.get(JobError(code)) if code in JobError.__members__ else None
        if info is not None:
            self.retryable, self.fallback = info.retryable, info.fallback


class ArtifactRejected(FarmError):
    pass


class KernelRejected(FarmError):
    pass


class ConfigError(FarmError):
    fallback = False


class CompileArgumentError(ConfigError, TypeError, RuntimeError):
    """An `sdk.compile` argument that `torch.compile` refuses too (an unknown keyword,
    mode with options): code that catches torch.compile's TypeError or RuntimeError
    around the call catches it."""
