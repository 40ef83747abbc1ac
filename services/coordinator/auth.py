"""Who is calling: bearer tokens checked in a server interceptor, and optional (mutual) TLS.

Every call to the farm's service must carry `authorization: Bearer <token>` metadata
(gRPC call credentials on a TLS channel, or plain metadata on a loopback one). The
interceptor looks the token up in the `TokenTable` (reloaded when its file changes,
tokensource.py) and answers UNAUTHENTICATED when it is missing, unknown or expired,
before the servicer sees the request. The standard health service stays open, so
probes and load balancers need no token. Failures only are throttled (ratelimit.py): a
call whose token does not verify, from an address or naming a tenant that has failed too
often lately, is answered RESOURCE_EXHAUSTED (AUTH_THROTTLED); a call whose token
verifies is never throttled. The address is the peer's, or behind a trusted proxy the
client's it forwards (proxies.py).

**An unauthenticated request is never read.** grpc.aio runs the interceptor with the
call's metadata only, before any message arrives; a *unary* handler then has grpc read
the whole request (up to `max_receive_message_length`: max_request_bytes and a margin,
server.py) before it is called. So a refusal is a *request-streaming* handler of the
method's response shape that answers without iterating its requests: grpc never reads
the message into the application, and
a request over the size limit is answered UNAUTHENTICATED, not RESOURCE_EXHAUSTED
(tests/integration/test_auth_limits.py). What the server's HTTP/2 layer takes in before
the reply resets the stream is bounded by flow control, not by us: gRPC core's initial
stream window is 64 KiB, and its BDP probing can widen a connection's window to a few
MiB on a fast link. grpc Python exposes no per-call receive limit, so an authenticated
call gets the server's whole receive limit, and a smaller limit for unauthenticated
calls than that window is not something grpc Python can enforce.

The tenant the token maps to reaches the servicer through a context variable, set
around the handler, and becomes the namespace of the call's keys and Redis entries.

The same wrapper turns a request that does not parse as its protobuf message into a
clean INVALID_ARGUMENT (gRPC itself would answer UNKNOWN), so no byte string a client
can send reaches the servicer unparsed or ends in anything but a status.

With no tokens file the farm is open: every call is the unnamed tenant, and the
coordinator logs a warning at start. That is for `torchfarm up` on one machine.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from services.coordinator import metrics
from services.coordinator.proxies import TrustedProxies, bucket_of, forwarded_for
from services.coordinator.ratelimit import TokenBuckets, peer_host
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.tokensource import TokenSource
from torchfarm.trust.tokens import OPEN, Tenant, TokenError, TokenRefused, TokenTable, namespace_of
from torchfarm.wire.codes import Reason

log = logging.getLogger(__name__)

_CALLER: contextvars.ContextVar[Tenant] = contextvars.ContextVar("torchfarm_caller", default=OPEN)

OPEN_SERVICES = ("grpc.health.v1.Health",)
"""Services callable without a token."""

REASON_KEY = "torchfarm-reason"
"""Trailing metadata key with the stable reason of an error (errors.py)."""


def caller() -> Tenant:
    """The tenant of the call being handled (OPEN on a farm without tokens)."""
    return _CALLER.get()


def load_tokens(settings: CoordinatorSettings) -> TokenSource | None:
    """The token table's source, or None for an open farm (logged loudly)."""
    if not settings.tokens_file:
        log.warning(
            "AUTHENTICATION IS OFF: no TORCHFARM_TOKENS_FILE, so anyone who reaches %s can "
            "compile and fetch artifacts. Fine on loopback; never on a shared network.",
            settings.listen,
        )
        return None
    TokenTable.from_file(settings.tokens_file)  # a farm does not start with a broken table
    return TokenSource(settings.tokens_file, settings.tokens_check_s)


def failure_limiter(settings: CoordinatorSettings) -> TokenBuckets:
    return TokenBuckets(settings.auth_failure_burst, settings.auth_failure_per_s)


def trusted_proxies(settings: CoordinatorSettings) -> TrustedProxies:
    return TrustedProxies.parse(settings.trusted_proxies)


def server_credentials(settings: CoordinatorSettings) -> grpc.ServerCredentials | None:
    """TLS credentials when a certificate is configured (mutual when a client CA is)."""
    if not settings.tls_cert_file:
        return None
    chain = Path(settings.tls_cert_file).read_bytes()
    key = Path(settings.tls_key_file).read_bytes()
    ca = Path(settings.tls_client_ca_file).read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=ca is not None)


def _bearer(metadata: tuple[Any, ...] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = str(value).partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Admits a call only with a known, unexpired bearer token, and records its tenant.

    Only failures are throttled: a call whose token verifies is admitted whatever
    others sent from its address or in its tenant's name."""

    def __init__(
        self, tokens: TokenSource | None, limiter: TokenBuckets | None = None,
        trusted_proxies: TrustedProxies | None = None,
    ):
        self.tokens = tokens
        self.limiter = limiter if limiter is not None else TokenBuckets(burst=30, per_s=0.5)
        self.proxies = trusted_proxies if trusted_proxies is not None else TrustedProxies()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        service = handler_call_details.method.lstrip("/").rpartition("/")[0]
        handler = await continuation(handler_call_details)
        if handler is None or service in OPEN_SERVICES:
            return handler
        if self.tokens is None:
            return _as_tenant(handler, OPEN)
        metadata = handler_call_details.invocation_metadata
        token = _bearer(metadata)
        if token is None:
            return self._refusal(
                handler, _Failure(handler_call_details.method, metadata, None, "missing",
                                  "no credentials: send 'authorization: Bearer <token>' (set TORCHFARM_TOKEN)"),
            )
        try:
            tenant = self.tokens.table().check(token)
        except TokenRefused as e:
            return self._refusal(handler, _Failure(handler_call_details.method, metadata, _claimed(token), e.reason, str(e)))
        return _as_tenant(handler, tenant)

    def _buckets(self, context: grpc.aio.ServicerContext[Any, Any], failure: _Failure) -> list[str]:
        """The limiter's buckets a failed call drains: its client's address, and the
        tenant its token names (so guesses from many addresses run dry too)."""
        address = bucket_of(self.proxies.client(peer_host(context.peer()), forwarded_for(failure.metadata)))
        return [f"address:{address}"] + ([f"tenant:{failure.claimed}"] if failure.claimed else [])

    def _refusal(self, handler: grpc.RpcMethodHandler[Any, Any], failure: _Failure) -> grpc.RpcMethodHandler[Any, Any]:
        """A request-streaming handler of the method's response shape that answers
        UNAUTHENTICATED (or RESOURCE_EXHAUSTED) without reading the request: see the module
        docstring for why that keeps grpc from receiving it."""
        limiter = self.limiter

        async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> None:
            buckets = self._buckets(context, failure)
            if not all(limiter.allowed(b) for b in buckets):
                metrics.AUTH_FAILURES.labels(reason="throttled").inc()
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "too many failed authentication attempts from this address or for this "
                    "tenant lately; retry later",
                    trailing_metadata=((REASON_KEY, Reason.AUTH_THROTTLED.value),),
                )
            for bucket in buckets:
                limiter.failed(bucket)
            log.warning("refused a call to %s from %s: %s token", failure.method, buckets[0], failure.reason)
            metrics.AUTH_FAILURES.labels(reason=failure.reason).inc()
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, failure.message,
                trailing_metadata=((REASON_KEY, Reason.UNAUTHENTICATED.value),),
            )

        async def stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[None]:
            await unary(requests, context)
            yield None  # pragma: no cover - abort raised

        if handler.unary_stream is not None:
            return grpc.stream_stream_rpc_method_handler(stream, None, handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(unary, None, handler.response_serializer)


@dataclass(frozen=True)
class _Failure:
    """A call refused for its credentials, as the refusal needs it."""

    method: str
    metadata: tuple[Any, ...] | None
    claimed: str | None
    """The namespace its token names, when it is shaped like a token."""
    reason: str
    message: str


def _claimed(token: str) -> str | None:
    try:
        return namespace_of(token)
    except TokenError:
        return None


class _Malformed:
    def __init__(self, error: str):
        self.error = error


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as e:
            return _Malformed(str(e))

    return parse


async def _reject_malformed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    if isinstance(request, _Malformed):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"the request does not parse: {request.error}",
            trailing_metadata=((REASON_KEY, Reason.MALFORMED_REQUEST.value),),
        )


def _as_tenant(handler: grpc.RpcMethodHandler[Any, Any], tenant: Tenant) -> grpc.RpcMethodHandler[Any, Any]:
    # grpc.aio runs each call in its own task, hence its own copy of the context: the
    # variable set here is seen by this call's handler only, and needs no reset.
    parse = _safe(handler.request_deserializer)
    # grpc's stubs type a handler's behaviours as synchronous; under grpc.aio they are async.
    if handler.unary_unary is not None:
        behavior: Callable[..., Any] = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _reject_malformed(request, context)
            _CALLER.set(tenant)
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, parse, handler.response_serializer)
    if handler.unary_stream is not None:
        stream_behavior: Callable[..., Any] = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await _reject_malformed(request, context)
            _CALLER.set(tenant)
            async for item in stream_behavior(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, parse, handler.response_serializer)
    return handler  # the farm has no client-streaming methods
