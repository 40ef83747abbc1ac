"""The SDK's thin gRPC layer: one channel per farm, deadlines, retries, status mapping.

Nothing here knows about torch. Every call has a deadline; a status code becomes one
`sdk.errors` class, so the backend decides on fallback from the class alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import grpc

from sdk.errors import (
    ArtifactRejected,
    ConfigError,
    FarmError,
    FarmUnavailable,
    GraphRejected,
    RemoteCompileError,
    RequestTooLarge,
)
from sdk.settings import SDKSettings
from torchfarm.v1 import farm_pb2, farm_pb2_grpc

log = logging.getLogger(__name__)

# Transient UNAVAILABLE (a coordinator restart, a dropped connection) is retried by the
# channel itself. Submit is idempotent on its key, so retrying it is safe.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "torchfarm.v1.CompileFarm"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def parse_address(remote: str) -> str:
    """"grpc://host:port" or "host:port" → "host:port"."""
    address = remote.removeprefix("grpc://")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in address:
        raise ConfigError(f"farm address {remote!r} is not grpc://host:port")
    return address


def _map_error(e: grpc.RpcError, what: str) -> FarmError:
    code = e.code()
    detail = f"{what}: {e.details()}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return GraphRejected(detail, code.name)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestTooLarge(detail, code.name)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return FarmUnavailable(detail, code.name)
    if code == grpc.StatusCode.NOT_FOUND:
        return RemoteCompileError(detail, code.name)
    return FarmUnavailable(detail, code.name)


class FarmClient:
    def __init__(self, remote: str, settings: SDKSettings):
        self.address = parse_address(remote)
        self.settings = settings
        opts = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.enable_retries", 1),
        ]
        self.channel = grpc.insecure_channel(self.address, options=opts)
        self.stub = farm_pb2_grpc.CompileFarmStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def connect(self) -> None:
        """Fails fast with FarmUnavailable when the farm does not answer."""
        try:
            grpc.channel_ready_future(self.channel).result(
                timeout=self.settings.connect_timeout_s
            )
        except grpc.FutureTimeoutError as e:
            raise FarmUnavailable(
                f"farm at {self.address} did not answer within "
                f"{self.settings.connect_timeout_s:.0f}s"
            ) from e

    def submit(self, request: farm_pb2.CompileRequest) -> farm_pb2.SubmitReply:
        self.connect()
        try:
            return self.stub.Submit(request, timeout=self.settings.rpc_timeout_s)
        except grpc.RpcError as e:
            raise _map_error(e, "submit") from e

    def wait(
        self, key: str, on_status: Callable[[farm_pb2.JobStatus], None] | None = None
    ) -> farm_pb2.JobStatus:
        """Watches the job until it ends; raises RemoteCompileError if it failed."""
        deadline = time.monotonic() + self.settings.compile_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FarmUnavailable(
                    f"compile of {key[:12]} did not finish within "
                    f"{self.settings.compile_timeout_s:.0f}s"
                )
            try:
                for status in self.stub.Watch(farm_pb2.JobRef(key=key), timeout=remaining):
                    if on_status is not None:
                        on_status(status)
                    if status.state == farm_pb2.SUCCEEDED:
                        return status
                    if status.state == farm_pb2.FAILED:
                        raise RemoteCompileError(
                            f"the farm could not compile the graph "
                            f"({status.error_code}): {status.message}",
                            status.error_code,
                        )
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise _map_error(e, "watch") from e
                # The coordinator went away mid-watch; the job lives on in Redis.
                log.info("watch of %s interrupted (%s); resuming", key[:12], e.details())
                time.sleep(0.5)

    def fetch(self, key: str) -> tuple[bytes, dict[str, bytes]]:
        """Streams the artifact: the manifest bytes and every blob, by digest."""
        manifest: bytes | None = None
        parts: dict[str, list[bytes]] = {}
        received = 0
        try:
            for chunk in self.stub.FetchArtifact(
                farm_pb2.ArtifactRef(key=key), timeout=self.settings.fetch_timeout_s
            ):
                if chunk.WhichOneof("kind") == "manifest":
                    manifest = chunk.manifest
                    continue
                blob = chunk.blob
                received += len(blob.data)
                if received > self.settings.max_artifact_bytes:
                    raise ArtifactRejected(
                        f"artifact {key[:12]} exceeds {self.settings.max_artifact_bytes} bytes"
                    )
                pieces = parts.setdefault(blob.digest, [])
                if blob.offset != sum(len(p) for p in pieces):
                    raise ArtifactRejected(f"artifact {key[:12]} arrived out of order")
                pieces.append(blob.data)
        except grpc.RpcError as e:
            raise _map_error(e, "fetch") from e
        if manifest is None:
            raise ArtifactRejected(f"artifact {key[:12]} came without a manifest")
        return manifest, {d: b"".join(p) for d, p in parts.items()}
