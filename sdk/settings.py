"""The SDK's settings: TORCHFARM_* variables, overridden by `sdk.compile`'s arguments."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SDKSettings:
    remote: str = ""
    """The farm's address, "grpc://host:port"; empty means compile locally."""
    fallback: str = "local"
    """"local": compile a graph locally when the farm cannot; "error": raise instead."""
    connect_timeout_s: float = 3.0
    """How long to wait for the farm's channel to connect before falling back."""
    rpc_timeout_s: float = 30.0
    """Deadline of each unary call (submit, job status)."""
    compile_timeout_s: float = 900.0
    """How long to wait for one graph's compile on the farm, queueing included."""
    fetch_timeout_s: float = 300.0
    """Deadline for streaming one artifact."""
    max_message_bytes: int = 64 * 1024 * 1024
    """gRPC send and receive limit, matching the coordinator's."""
    max_artifact_bytes: int = 2 * 1024 * 1024 * 1024
    """Largest artifact the SDK accepts; a bigger manifest is refused before streaming."""
