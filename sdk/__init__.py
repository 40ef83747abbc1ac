"""torchfarm SDK: `sdk.compile(model, remote="grpc://farm:50051")` where you wrote
`torch.compile(model)`.

This package imports nothing from services/ or workers/.
"""

from sdk.api import compile
from sdk.errors import (
    ArtifactRejected,
    ConfigError,
    FarmError,
    FarmUnavailable,
    GraphRejected,
    RemoteCompileError,
    RequestTooLarge,
)

__all__ = [
    "ArtifactRejected",
    "ConfigError",
    "FarmError",
    "FarmUnavailable",
    "GraphRejected",
    "RemoteCompileError",
    "RequestTooLarge",
    "compile",
]
