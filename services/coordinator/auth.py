"""Who is calling: bearer tokens checked in a server interceptor, and optional (mutual) TLS.

Every call to the farm's service must carry `authorization: Bearer <token>` metadata
(gRPC call credentials on a TLS channel, or plain metadata on a loopback one). The
interceptor looks the token up in the `TokenTable` and answers UNAUTHENTICATED when it
is missing or unknown, before the servicer sees the request. The standard health
service stays open, so probes and load balancers need no token.

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
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from services.coordinator import metrics
from services.coordinator.settings import CoordinatorSettings
from torchfarm.tokens import OPEN, Tenant, TokenTable

log = logging.getLogger(__name__)

_CALLER: contextvars.ContextVar[Tenant] = contextvars.ContextVar("torchfarm_caller", default=OPEN)

OPEN_SERVICES = ("grpc.health.v1.Health",)
"""Services callable without a token."""

REASON_KEY = "torchfarm-reason"
"""Trailing metadata key with the stable reason of an error (errors.py)."""


def caller() -> Tenant:
    """The tenant of the call being handled (OPEN on a farm without tokens)."""
    return _CALLER.get()


def load_tokens(settings: CoordinatorSettings) -> TokenTable | None:
    """The token table, or None for an open farm (logged loudly)."""
    if not settings.tokens_file:
        log.warning(
            "AUTHENTICATION IS OFF: no TORCHFARM_TOKENS_FILE, so anyone who reaches %s can "
            "compile and fetch artifacts. Fine on loopback; never on a shared network.",
            settings.listen,
        )
        return None
    table = TokenTable.from_file(settings.tokens_file)
    log.info("authentication on: %d tokens from %s", len(table), settings.tokens_file)
    return table


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
    """Admits a call only with a known bearer token, and records its tenant."""

    def __init__(self, table: TokenTable | None):
        self.table = table

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        service = handler_call_details.method.lstrip("/").rpartition("/")[0]
        handler = await continuation(handler_call_details)
        if handler is None or service in OPEN_SERVICES:
            return handler
        if self.table is None:
            return _as_tenant(handler, OPEN)
        token = _bearer(handler_call_details.invocation_metadata)
        if token is None:
            metrics.AUTH_FAILURES.labels(reason="missing").inc()
            return _refusal(
                handler, "no credentials: send 'authorization: Bearer <token>' (set TORCHFARM_TOKEN)"
            )
        tenant = self.table.lookup(token)
        if tenant is None:
            metrics.AUTH_FAILURES.labels(reason="invalid").inc()
            log.warning("refused a call to %s: unknown token", handler_call_details.method)
            return _refusal(handler, "the token is not valid on this farm")
        return _as_tenant(handler, tenant)


def _refusal(handler: grpc.RpcMethodHandler[Any, Any], message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the method's own shape that answers UNAUTHENTICATED. It takes the
    request as raw bytes: an unauthenticated request is never even parsed."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, message,
            trailing_metadata=((REASON_KEY, "UNAUTHENTICATED"),),
        )

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
        await unary(request, context)
        yield None  # pragma: no cover - abort raised

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream, None, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)


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
            trailing_metadata=((REASON_KEY, "MALFORMED_REQUEST"),),
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
