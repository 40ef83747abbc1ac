"""torchfarm SDK: `sdk.compile(model, remote="grpc://farm:50051")` where you wrote
`torch.compile(model)`.

This package imports nothing from services/ or workers/. `sdk.compile` is imported
on first use, so the gRPC layer (`sdk.client`, `sdk.errors`) loads without torch.
"""

import importlib.util
import os
from typing import Any

# gRPC's C-core logs each failed TLS handshake (every reconnect) on stderr, outside
# Python's logging; the SDK says what failed in its own error. Read when grpc is first
# imported, so set before any of the SDK's modules imports it; a user's value wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

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
from sdk.triton_client import compile_kernel

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
    "farm_backend",
    "wait_ready",
    "warm",
]


def _require_torch(name: str) -> None:
    """A plain `pip install torchfarm` brings no torch; say so, and how to get it, rather
    than fail inside a compile on the first missing module."""
    if importlib.util.find_spec("torch") is None:
        raise ImportError(
            f"sdk.{name} needs torch, which this environment lacks: install the SDK with "
            "pip install 'torchfarm[sdk]' (it pins the torch the farm's workers build with)"
        )


def __getattr__(name: str) -> Any:
    if name in ("compile", "export", "farm_backend", "wait_ready", "warm"):
        _require_torch(name)
    if name == "compile":
        from sdk.api import compile

        return compile
    if name == "farm_backend":
        from sdk.api import farm_backend

        return farm_backend
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
