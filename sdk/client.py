"""The SDK's thin gRPC layer: one channel per farm, deadlines, retries, status mapping.

`CompileClient` is what the backend asks of a farm; `StubClient` implements it over
any object with the gRPC stub's methods, and `FarmClient` is that over a real channel
(localfarm/inprocess.py puts a servicer in this process behind the same stub).

Nothing here knows about torch. Every call has a deadline; a status code (and the
farm's `torchfarm-reason` trailing metadata) becomes one `sdk.errors` class, so the
backend decides on fallback from the class alone.

Credentials: the tenant token goes on every call as `authorization: Bearer <token>`,
as gRPC call credentials on a TLS channel ("grpcs://host:port", or any address with
TORCHFARM_TLS_CA_FILE), and as plain call metadata on a plaintext one. A token sent in
plaintext to another machine can be read on the wire: the SDK warns once.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import grpc

from sdk import wake
from sdk.blobcache import BlobCache
from sdk.direct import Link, download_all
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
from sdk.progress import GraphTrack
from sdk.settings import SDKSettings
from sdk.trust import is_loopback
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire.codes import REASONS, RETRYABLE_STATUSES, Reason, Rejection

log = logging.getLogger(__name__)

# Transient UNAVAILABLE (a coordinator restart, a dropped connection, Redis down) is
# retried by the channel itself, and nothing else: the retryable refusals of
# torchfarm/wire/codes.py. "No worker serves this target" is FAILED_PRECONDITION, which a
# retry cannot mend. Submit is idempotent on its key, so retrying it is safe.
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
                    "retryableStatusCodes": list(RETRYABLE_STATUSES),
                },
            }
        ]
    }
)


REASON_KEY = "torchfarm-reason"
"""Trailing metadata with the farm's stable reason for an error."""


def parse_remote(remote: str) -> tuple[str, bool]:
    """"grpc://host:port", "grpcs://host:port" or "host:port" → ("host:port", tls)."""
    tls = remote.startswith("grpcs://")
    address = remote.removeprefix("grpcs://").removeprefix("grpc://")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in address:
        raise ConfigError(
            f"farm address {remote!r} is not grpc://host:port, grpcs://host:port or host:port"
        )
    return address, tls


def parse_address(remote: str) -> str:
    """"grpc://host:port", "grpcs://host:port" or "host:port" → "host:port"."""
    return parse_remote(remote)[0]


def _accepts_connections(address: str) -> bool:
    """Whether a TCP connection to "host:port" opens within a second."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except (OSError, ValueError):
        return False
    return True


def _reason(e: grpc.RpcError) -> str:
    try:
        # grpc's stubs type the items as objects with .key and .value; they are (key, value) pairs.
        for k, v in cast("tuple[tuple[str, Any], ...]", e.trailing_metadata() or ()):
            if k == REASON_KEY:
                return str(v)
    except Exception:  # a locally generated error may carry no metadata at all
        pass
    return ""


_FARM_BUGS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
"""Statuses of a call the farm failed on its own bug (an unexpected exception)."""


def _map_error(e: grpc.RpcError, what: str, key: str = "") -> FarmError:
    """The SDK error for a failed call; `key`, when known, is named in a farm bug's."""
    error = _error_of(e, what, key)
    if error.code in Reason.__members__:
        error.fallback = REASONS[Reason(error.code)].fallback
    return error


_QUOTAS = frozenset({
    Reason.TENANT_QUEUE_FULL, Reason.AUTH_THROTTLED, Reason.STORAGE_QUOTA, Reason.UPLOAD_RATE, Reason.WATCH_LIMIT,
    Reason.EXPLAIN_RATE,
    Reason.FETCH_LIMIT, Reason.LISTING_LIMIT,
})
"""RESOURCE_EXHAUSTED reasons that are a tenant's quota or rate, not the request's size."""


def _error_of(e: grpc.RpcError, what: str, key: str) -> FarmError:
    code = e.code()
    reason = _reason(e) or code.name
    detail = f"{what}: {e.details()}"
    if code in _FARM_BUGS:
        return FarmBug(f"{what}: the farm failed with {code.name}: {e.details()}", key, reason)
    if code == grpc.StatusCode.FAILED_PRECONDITION and reason == Reason.NO_WORKER:
        return NoWorker(detail, reason)
    if code == grpc.StatusCode.FAILED_PRECONDITION and reason == Reason.BUILD_NOT_SERVED:
        return FarmUnavailable(detail, reason)  # waiting wakes no pool of another build
    if code == grpc.StatusCode.ABORTED:
        return RemoteCompileError(detail, reason)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return GraphRejected(detail, reason)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if reason in _QUOTAS:
            return QuotaExceeded(detail, reason)
        return _exhausted(e, detail, reason)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return Unauthenticated(f"{detail} (check TORCHFARM_TOKEN)", reason)
    if code == grpc.StatusCode.DATA_LOSS:
        return ArtifactRejected(detail, Rejection.CORRUPT)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return FarmUnavailable(detail, reason)
    if code == grpc.StatusCode.NOT_FOUND:
        return RemoteCompileError(detail, reason)
    return FarmUnavailable(detail, reason)


def _exhausted(e: grpc.RpcError, detail: str, reason: str) -> FarmError:
    """RESOURCE_EXHAUSTED that is no tenant's quota: a message over a size limit, or, from
    grpc itself with no farm reason, a message over its limit or a farm at its most calls."""
    details = e.details() or ""
    if reason != grpc.StatusCode.RESOURCE_EXHAUSTED.name:
        return RequestTooLarge(detail, reason)
    limit = re.search(r"larger than max \(\d+ vs\. (\d+)\)", details)
    if limit is None:  # grpc's "Concurrent RPC limit exceeded!": the farm is busy
        return FarmUnavailable(detail, reason)
    if details.startswith("SERVER:"):
        # The coordinator's receive limit follows its request limit: a request well over
        # it is refused while grpc reads it, before the farm's own check.
        return RequestTooLarge(
            f"{detail}: the farm receives at most {limit[1]} bytes (the coordinator's "
            "TORCHFARM_MAX_REQUEST_BYTES and a margin)", Reason.REQUEST_TOO_LARGE,
        )
    return RequestTooLarge(f"{detail}: this client sends and receives at most {limit[1]} bytes "
                           "(TORCHFARM_MAX_MESSAGE_BYTES)", Reason.REQUEST_TOO_LARGE)


def _read(path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from e


TLS_TO_PLAIN = (
    "it may serve plain gRPC (use grpc://), or a certificate this machine does not trust "
    "(TORCHFARM_TLS_CA_FILE)"
)
"""What to change when a TLS channel reaches a farm but its handshake fails."""


def uses_tls(remote: str, settings: SDKSettings) -> bool:
    """A "grpcs://" address, or any address with TORCHFARM_TLS_CA_FILE set."""
    return parse_remote(remote)[1] or bool(settings.tls_ca_file)


def make_channel(
    remote: str, settings: SDKSettings, options: list[tuple[str, Any]]
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """The channel to the farm, and the metadata each call must add (the token, when it
    cannot travel as call credentials)."""
    address = parse_address(remote)
    if uses_tls(remote, settings):
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(settings.tls_ca_file),
            private_key=_read(settings.tls_key_file),
            certificate_chain=_read(settings.tls_cert_file),
        )
        if settings.token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(settings.token)
            )
        return grpc.secure_channel(address, creds, options=options), ()
    if settings.token and not is_loopback(address):
        log.warning(
            "torchfarm: sending the token to %s in plaintext; use grpcs:// or "
            "TORCHFARM_TLS_CA_FILE on any network you do not trust", address,
        )
    metadata = (("authorization", f"Bearer {settings.token}"),) if settings.token else ()
    return grpc.insecure_channel(address, options=options), metadata


class CompileClient(Protocol):
    """What the SDK asks of a farm, whatever carries the calls. `FarmClient` carries them
    over gRPC; `localfarm.inprocess.InProcessClient` hands them to a coordinator
    in this process. Each call raises `sdk.errors` classes, never a transport's own."""

    @property
    def address(self) -> str:
        """The farm's "host:port", as errors and trust messages name it."""
        ...

    @property
    def settings(self) -> SDKSettings: ...

    def connect(self) -> None:
        """Fails fast with FarmUnavailable when the farm does not answer."""
        ...

    def close(self) -> None: ...

    def submit(self, request: farm_pb2.CompileRequest, key: str = "") -> farm_pb2.SubmitReply: ...

    def wait(
        self, key: str, on_status: Callable[[farm_pb2.JobStatus], None] | None = None
    ) -> farm_pb2.JobStatus: ...

    def submit_and_wait(
        self, request: farm_pb2.CompileRequest, track: GraphTrack | None = None, key: str = "",
    ) -> tuple[farm_pb2.SubmitReply, farm_pb2.JobStatus | None]: ...

    def fetch(self, key: str) -> tuple[bytes, dict[str, bytes]]: ...

    def put_precompiled(
        self, manifest: bytes, blobs: dict[str, bytes], record: farm_pb2.PrecompiledRecord | None = None
    ) -> str: ...

    def explain_precompiled(self, key: str, record: farm_pb2.PrecompiledRecord) -> farm_pb2.MissExplanation: ...

    def compile_kernel(self, request: farm_pb2.KernelRequest) -> farm_pb2.KernelReply: ...

    def status(self) -> farm_pb2.FarmStatus: ...


class StubClient:
    """A `CompileClient` over `stub`: any object with `CompileFarmStub`'s methods (each
    taking the request, `timeout` and `metadata`, and raising `grpc.RpcError`), as httpx's
    client sits on a transport. Deadlines, retries on a lost job, the mapping of status
    codes to `sdk.errors` and the chunked fetch live here, above the transport."""

    def __init__(
        self, address: str, settings: SDKSettings, stub: Any, metadata: tuple[tuple[str, str], ...] = ()
    ):
        self.address = address
        self.settings = settings
        self.stub = stub
        self.metadata = metadata
        """What each call adds: the token, where it cannot travel as call credentials."""

    def connect(self) -> None:
        """Nothing to wait for: a stub with no channel answers from its first call."""

    def close(self) -> None:
        """Nothing to close: the stub holds no channel."""

    def submit(self, request: farm_pb2.CompileRequest, key: str = "") -> farm_pb2.SubmitReply:
        """Submits the request; `key` (the one the client expects) is named in a farm bug."""
        self.connect()
        try:
            return cast(farm_pb2.SubmitReply, self.stub.Submit(
                request, timeout=self.settings.rpc_timeout_s, metadata=self.metadata
            ))
        except grpc.RpcError as e:
            raise _map_error(e, "submit", key) from e

    def wait(
        self, key: str, on_status: Callable[[farm_pb2.JobStatus], None] | None = None
    ) -> farm_pb2.JobStatus:
        """Watches the job until it ends; raises RemoteCompileError if it failed. A job
        that waits queued with no live worker for its queue (`JobStatus.unserved`) is
        waited for `wake_timeout_s`, as a target no worker serves is (sdk/wake.py), then
        NoWorker; the job stays queued on the farm for a worker that comes later."""
        deadline = time.monotonic() + self.settings.compile_timeout_s
        unserved_until: float | None = None  # queued with no live worker: when the wait for one ends
        silent_since: float | None = None  # when the farm stopped answering, if it has
        status: farm_pb2.JobStatus  # what the stream yields (the generated stub is untyped)
        while True:
            now = time.monotonic()
            if deadline <= now:
                raise FarmUnavailable(
                    f"compile of {key[:12]} did not finish within {self.settings.compile_timeout_s:g}s "
                    "(TORCHFARM_COMPILE_TIMEOUT_S); the farm goes on with it, so a later run can find it cached",
                    grpc.StatusCode.DEADLINE_EXCEEDED.name,
                )
            if unserved_until is not None and unserved_until <= now:
                raise NoWorker(
                    f"no live worker took the job {key[:12]} within {self.settings.wake_timeout_s:g}s "
                    "(TORCHFARM_WAKE_TIMEOUT_S): every worker of its target is gone or not started "
                    "(torchfarm status lists them); it stays queued, so a worker that starts compiles "
                    "it for a later run", Reason.NO_WORKER,
                )
            ends = min(deadline, unserved_until or deadline)
            try:
                for status in self.stub.Watch(
                    farm_pb2.JobRef(key=key), timeout=ends - now, metadata=self.metadata
                ):
                    silent_since = None
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
                    if not status.unserved:
                        unserved_until = None
                    elif unserved_until is None:
                        unserved_until = time.monotonic() + self.settings.wake_timeout_s
                        log.warning(
                            "torchfarm: the job %s is queued, but no live worker takes its target's "
                            "jobs; waiting up to %gs for one (TORCHFARM_WAKE_TIMEOUT_S)",
                            key[:12], self.settings.wake_timeout_s,
                        )
                        break  # watch again, until that wait ends
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    # The job record is gone: Redis lost it (a restart). Submitting again
                    # is idempotent, so the backend does that.
                    raise JobLost(f"watch: the farm lost the job {key[:12]}", Reason.NOT_FOUND) from e
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and _reason(e) == Reason.WATCH_LIMIT:
                    # This tenant has its most Watch streams open (other graphs, other
                    # processes); the job goes on regardless, so wait and watch again.
                    log.info("watch of %s deferred: %s", key[:12], e.details())
                    time.sleep(1.0)
                    continue
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and ends <= time.monotonic():
                    continue  # this client's own deadline, said above
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise _map_error(e, "watch", key) from e
                # The coordinator went away mid-watch; the job lives on in Redis.
                silent_since = self._farm_silent(key, e, silent_since)
                time.sleep(0.5)

    def _farm_silent(self, key: str, e: grpc.RpcError, since: float | None) -> float:
        """A watch of `key` that the farm did not answer (`e`, UNAVAILABLE): warns at the
        first, raises FarmUnavailable once it has not answered for reconnect_timeout_s
        since `since`. Returns when the silence began."""
        now, wait = time.monotonic(), self.settings.reconnect_timeout_s
        if since is None:
            log.warning("torchfarm: the farm at %s stopped answering while it compiled %s (%s); "
                        "waiting up to %gs for it (TORCHFARM_RECONNECT_TIMEOUT_S)",
                        self.address, key[:12], e.details(), wait)
            return now
        if now - since >= wait:
            raise FarmUnavailable(
                f"the farm at {self.address} stopped answering while it compiled {key[:12]}, "
                f"and did not answer for {wait:g}s (TORCHFARM_RECONNECT_TIMEOUT_S): {e.details()}",
                grpc.StatusCode.UNAVAILABLE.name,
            ) from e
        return since

    def submit_and_wait(
        self, request: farm_pb2.CompileRequest, track: GraphTrack | None = None, key: str = "",
    ) -> tuple[farm_pb2.SubmitReply, farm_pb2.JobStatus | None]:
        """Submits, then waits unless it was a hit (the status is then None), showing the
        job's progress on `track`. A target whose pool is starting or scaled to zero is
        waited for (sdk/wake.py). A job the farm lost (Redis restarted under it) is
        submitted again, up to `max_resubmits` times: the key is the same, so this is
        idempotent. `key` is the one expected, named if the farm fails on a bug."""
        on_status = track.update if track is not None else None
        for attempt in range(self.settings.max_resubmits + 1):
            reply = wake.submit_waking(lambda: self.submit(request, key), self.settings, track)
            if reply.cache_hit:
                return reply, None
            try:
                return reply, self.wait(reply.key, on_status)
            except JobLost:
                if attempt == self.settings.max_resubmits:
                    raise
                log.info("torchfarm: the farm lost job %s; submitting again", reply.key[:12])
        raise AssertionError("unreachable")

    def put_precompiled(
        self, manifest: bytes, blobs: dict[str, bytes], record: farm_pb2.PrecompiledRecord | None = None
    ) -> str:
        """Uploads a precompiled package (sdk/precompile.py), with its key's components
        for explaining later misses; returns its key."""
        self.connect()
        upload = farm_pb2.PrecompiledUpload(
            manifest=manifest,
            blobs=[farm_pb2.PrecompiledBlob(digest=d, data=b) for d, b in blobs.items()],
            record=record,
        )
        try:
            reply = self.stub.PutPrecompiled(upload, timeout=self.settings.rpc_timeout_s, metadata=self.metadata)
        except grpc.RpcError as e:
            raise _map_error(e, "upload of a precompiled package", "") from e
        return cast(str, reply.key)

    def explain_precompiled(self, key: str, record: farm_pb2.PrecompiledRecord) -> farm_pb2.MissExplanation:
        """Why the precompiled `key` missed: the farm's closest package of the same model."""
        self.connect()
        try:
            reply = self.stub.ExplainPrecompiledMiss(
                farm_pb2.PrecompiledMiss(key=key, record=record),
                timeout=self.settings.rpc_timeout_s, metadata=self.metadata,
            )
        except grpc.RpcError as e:
            raise _map_error(e, "explanation of a precompiled miss", key) from e
        return cast("farm_pb2.MissExplanation", reply)

    def fetch(self, key: str) -> tuple[bytes, dict[str, bytes]]:
        """The artifact: the manifest bytes and every blob, by digest. Downloaded from the
        store's pre-signed URLs where the farm offers them, else streamed; a direct
        download that fails falls back to the stream."""
        manifest, blobs, links = self._stream(key, self.settings.direct_downloads)
        if not links:
            return manifest, blobs
        try:
            blobs = download_all(
                links, self.settings.fetch_timeout_s, self._blob_cache(), loopback_ok=self.on_this_machine()
            )
            return manifest, blobs
        except (OSError, ValueError, ArtifactRejected) as e:
            log.warning("torchfarm: direct download of %s failed (%s); streaming it", key[:12], e)
            manifest, blobs, _ = self._stream(key, False)
            return manifest, blobs

    def on_this_machine(self) -> bool:
        """Whether the farm runs on this machine, so that its blob store's links may too."""
        return is_loopback(self.address)

    def _blob_cache(self) -> BlobCache | None:
        if not self.settings.blob_cache_dir:
            return None
        try:
            return BlobCache(self.settings.blob_cache_dir, self.settings.blob_cache_bytes)
        except OSError as e:
            log.warning("torchfarm: blob cache %s unusable (%s); downloading without it",
                        self.settings.blob_cache_dir, e)
            return None

    def _stream(self, key: str, direct: bool) -> tuple[bytes, dict[str, bytes], list[Link]]:
        """The FetchArtifact stream: the manifest, streamed blobs, and any direct links. A
        fetch refused because this tenant has its most fetches open (FETCH_LIMIT: other
        graphs, other processes) is tried again each second, until fetch_timeout_s."""
        deadline = time.monotonic() + self.settings.fetch_timeout_s
        while True:
            try:
                return self._stream_once(key, direct, deadline - time.monotonic())
            except QuotaExceeded as e:
                pause = random.uniform(0.5, 1.5)  # graphs refused together do not return together
                if e.code != Reason.FETCH_LIMIT or time.monotonic() + pause >= deadline:
                    raise
                log.info("fetch of %s deferred: %s", key[:12], e)
                time.sleep(pause)

    def _stream_once(
        self, key: str, direct: bool, timeout_s: float
    ) -> tuple[bytes, dict[str, bytes], list[Link]]:
        manifest: bytes | None = None
        parts: dict[str, list[bytes]] = {}
        links: list[Link] = []
        received = 0
        try:
            for chunk in self.stub.FetchArtifact(
                farm_pb2.ArtifactRef(key=key, direct=direct), timeout=timeout_s,
                metadata=self.metadata,
            ):
                if chunk.WhichOneof("kind") == "manifest":
                    manifest = chunk.manifest
                    continue
                if chunk.WhichOneof("kind") == "link":
                    if not direct:
                        # Nothing is fetched from a URL the client did not ask for: its
                        # direct downloads may be off to keep every byte on this stream.
                        raise ArtifactRejected(
                            f"artifact {key[:12]}: the farm sent a blob link the client did not ask for",
                            Rejection.MALFORMED,
                        )
                    links.append(Link(chunk.link.digest, chunk.link.size, chunk.link.url))
                    received += chunk.link.size
                    if received > self.settings.max_artifact_bytes:
                        raise ArtifactRejected(
                            f"artifact {key[:12]} exceeds {self.settings.max_artifact_bytes} bytes",
                            Rejection.TOO_LARGE,
                        )
                    continue
                blob = chunk.blob
                received += len(blob.data)
                if received > self.settings.max_artifact_bytes:
                    raise ArtifactRejected(
                        f"artifact {key[:12]} exceeds {self.settings.max_artifact_bytes} bytes",
                        Rejection.TOO_LARGE,
                    )
                pieces = parts.setdefault(blob.digest, [])
                if blob.offset != sum(len(p) for p in pieces):
                    raise ArtifactRejected(f"artifact {key[:12]} arrived out of order", Rejection.MALFORMED)
                pieces.append(blob.data)
        except grpc.RpcError as e:
            raise _map_error(e, "fetch", key) from e
        if manifest is None:
            raise ArtifactRejected(f"artifact {key[:12]} came without a manifest", Rejection.MALFORMED)
        return manifest, {d: b"".join(p) for d, p in parts.items()}, links

    def compile_kernel(self, request: farm_pb2.KernelRequest) -> farm_pb2.KernelReply:
        """One Triton kernel, compiled (or found) by the farm; KernelRejected when the farm
        refuses the source or Triton cannot compile it."""
        self.connect()
        try:
            return cast(farm_pb2.KernelReply, self.stub.CompileKernel(
                request, timeout=self.settings.kernel_timeout_s, metadata=self.metadata
            ))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise KernelRejected(f"kernel: {e.details()}", _reason(e) or e.code().name) from e
            raise _map_error(e, "kernel") from e

    def status(self) -> farm_pb2.FarmStatus:
        """The farm's workers (with the targets they serve and their builds), queues, cache."""
        self.connect()
        try:
            return cast(farm_pb2.FarmStatus, self.stub.GetFarmStatus(
                farm_pb2.FarmStatusRequest(), timeout=self.settings.rpc_timeout_s,
                metadata=self.metadata,
            ))
        except grpc.RpcError as e:
            raise _map_error(e, "status") from e


class FarmClient(StubClient):
    """The `CompileClient` over gRPC: one channel to the farm at `remote`."""

    def __init__(self, remote: str, settings: SDKSettings):
        opts: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.enable_retries", 1),
        ]
        self.channel, metadata = make_channel(remote, settings, opts)
        self.tls = uses_tls(remote, settings)
        super().__init__(parse_address(remote), settings, farm_pb2_grpc.CompileFarmStub(self.channel), metadata)
        self._ready = False

    def close(self) -> None:
        with _SHARED_LOCK:
            for key in [k for k, c in _SHARED.items() if c is self]:
                del _SHARED[key]
        self.channel.close()

    def connect(self) -> None:
        """Fails fast with FarmUnavailable when the farm does not answer. Once connected,
        later outages surface from the calls themselves (UNAVAILABLE after the channel's
        retries), so the readiness wait, which costs a thread, runs until it first succeeds."""
        if self._ready:
            return
        try:
            grpc.channel_ready_future(self.channel).result(
                timeout=self.settings.connect_timeout_s
            )
            self._ready = True
        except grpc.FutureTimeoutError as e:
            raise FarmUnavailable(self._no_channel()) from e

    def _no_channel(self) -> str:
        """Why no channel came up: nothing listens, or something does that does not
        speak the channel's protocol (TLS to a plain farm, or plain gRPC to a TLS one)."""
        waited = f"within {self.settings.connect_timeout_s:g}s (TORCHFARM_CONNECT_TIMEOUT_S)"
        if not _accepts_connections(self.address):
            return f"farm at {self.address} did not answer {waited}"
        other = TLS_TO_PLAIN if self.tls else "it may serve TLS only (use grpcs://)"
        return (f"farm at {self.address} accepts connections, but no gRPC channel came up {waited}: "
                f"{other}, or it is hung")


_SHARED: dict[tuple[int, SDKSettings], FarmClient] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(settings: SDKSettings) -> FarmClient:
    """This process's client of the farm `settings.remote`, with these settings: one
    channel (one connection, one wait for it to come up) for all of a process's
    `sdk.compile` calls. A model compiled block by block opened one per block. Keyed by
    the process too: a forked child makes its own, as gRPC asks."""
    key = (os.getpid(), settings)
    with _SHARED_LOCK:
        client = _SHARED.get(key)
        if client is None:
            client = _SHARED[key] = FarmClient(settings.remote, settings)
    return client
