"""torchfarm SDK: `sdk.compile(model, remote="grpc://farm:50051")` where you wrote
`torch.compile(model)`.

This package imports nothing from services/ or workers/. `sdk.compile` is imported
on first use, so the gRPC layer (`sdk.client`, `sdk.errors`) loads without torch.
"""

from typing import Any

from sdk.errors import (
    ArtifactRejected,
    ConfigError,
    FarmBug,
    FarmError,
    FarmUnavailable,
    GraphRejected,
    JobLost,
    KernelRejected,
    NoWorker,
    QuotaExceeded,
    RemoteCompileError,
    RequestTooLarge,
    Unauthenticated,
)
from sdk.kernel_client import compile_kernel

__all__ = [
    "ArtifactRejected",
    "ConfigError",
    "FarmBug",
    "FarmError",
    "FarmUnavailable",
    "GraphRejected",
    "JobLost",
    "KernelRejected",
    "NoWorker",
    "QuotaExceeded",
    "RemoteCompileError",
    "RequestTooLarge",
    "Unauthenticated",
    "compile",
    "compile_kernel",
    "export",
    "wait_ready",
    "warm",
]


def __getattr__(name: str) -> Any:
    if name == "compile":
        from sdk.api import compile

        return compile
    if name == "export":
        from sdk.exports import export

        return export
    if name == "wait_ready":
        from sdk.nonblocking import wait_ready

        return wait_ready
    if name == "warm":
        from sdk.warming import warm

        return warm
    raise AttributeError(f"module 'sdk' has no attribute {name!r}")
