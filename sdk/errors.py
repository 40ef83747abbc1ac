"""The SDK's error tree. Each error says whether the SDK may fall back to a local compile.

    FarmError                  .fallback
    ├── FarmUnavailable        True    farm unreachable, no worker for the target, deadline
    ├── GraphRejected          True    the farm cannot take this graph (op not allowed, ...)
    ├── RequestTooLarge        True    over the farm's size limits
    ├── RemoteCompileError     True    the compile failed on the farm; carries its message
    ├── ArtifactRejected       True    the artifact failed verification; never loaded
    └── ConfigError            False   bad arguments to sdk.compile; always raised

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


class GraphRejected(FarmError):
    pass


class RequestTooLarge(FarmError):
    pass


class RemoteCompileError(FarmError):
    pass


class ArtifactRejected(FarmError):
    pass


class ConfigError(FarmError):
    fallback = False
