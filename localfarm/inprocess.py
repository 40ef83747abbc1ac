"""An in-process client: the SDK's `StubClient` (what `FarmClient` is over a channel) on
a stub that calls the coordinator's servicer in this process, as httpx's MockTransport
stands in for the network.

Everything above the stub runs as it does over gRPC: the client's deadlines, its
mapping of status codes and `torchfarm-reason` to `sdk.errors`, its watch and its
chunked fetch; below it, the servicer's translation to the `Farm` and its mapping of
domain errors to status codes. Requests and replies are serialized and parsed on the
way, so a message that would not survive the wire does not survive here either. What is
left out is the network itself: channels, TLS, the auth interceptor (calls run as the
open farm's tenant) and message size limits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

from sdk.client import StubClient
from sdk.settings import SDKSettings
from services.coordinator.farm import Farm
from services.coordinator.servicer import CompileFarmServicer


class InProcessRpcError(grpc.RpcError):
    """What the servicer's abort raises: a status code, details and trailing metadata,
    read as the SDK reads a real `grpc.RpcError`."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple = ()):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailing = code, details, tuple(trailing_metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


class _Context:
    """The part of `grpc.aio.ServicerContext` the servicer uses."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        raise InProcessRpcError(code, details, trailing_metadata)


def _over_the_wire(message: Any) -> Any:
    return type(message).FromString(message.SerializeToString())


@contextlib.contextmanager
def _event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop for one call, shut down as `asyncio.run` shuts its own down: a watch
    abandoned mid-stream leaves no async generator or thread behind."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _until(loop: asyncio.AbstractEventLoop, awaitable: Any, timeout: float | None) -> Any:
    try:
        return loop.run_until_complete(asyncio.wait_for(awaitable, timeout))
    except TimeoutError:
        raise InProcessRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


class InProcessStub:
    """`CompileFarmStub`'s methods, served by `servicer`, each call on an event loop of
    its own in the calling thread.

    `after_submit`, if given, runs after every Submit: an inline dispatcher's `run`,
    say, so that the job has ended before the client watches it."""

    def __init__(self, servicer: CompileFarmServicer, after_submit: Callable[[], Any] | None = None):
        self.servicer = servicer
        self.after_submit = after_submit

    def _unary(self, method: Callable[..., Any], request: Any, timeout: float | None) -> Any:
        with _event_loop() as loop:
            reply = _until(loop, method(_over_the_wire(request), _Context()), timeout)
        return _over_the_wire(reply)

    def _stream(self, method: Callable[..., AsyncIterator[Any]], request: Any, timeout: float | None) -> Iterator[Any]:
        with _event_loop() as loop:
            replies = method(_over_the_wire(request), _Context())
            deadline = None if timeout is None else loop.time() + timeout
            try:
                while True:
                    left = None if deadline is None else deadline - loop.time()
                    try:
                        reply = _until(loop, replies.__anext__(), left)
                    except StopAsyncIteration:
                        return
                    yield _over_the_wire(reply)
            finally:
                loop.run_until_complete(replies.aclose())  # type: ignore[attr-defined]

    def Submit(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        reply = self._unary(self.servicer.Submit, request, timeout)
        if self.after_submit is not None:
            self.after_submit()
        return reply

    def GetJob(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.GetJob, request, timeout)

    def GetFarmStatus(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.GetFarmStatus, request, timeout)

    def CompileKernel(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.CompileKernel, request, timeout)

    def ListArtifacts(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.ListArtifacts, request, timeout)

    def EvictArtifacts(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.EvictArtifacts, request, timeout)

    def ExplainMiss(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.ExplainMiss, request, timeout)

    def PutPrecompiled(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.PutPrecompiled, request, timeout)

    def ExplainPrecompiledMiss(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
        return self._unary(self.servicer.ExplainPrecompiledMiss, request, timeout)

    def Watch(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Iterator[Any]:
        return self._stream(self.servicer.Watch, request, timeout)

    def FetchArtifact(self, request: Any, timeout: float | None = None, metadata: Any = ()) -> Iterator[Any]:
        return self._stream(self.servicer.FetchArtifact, request, timeout)


class InProcessClient(StubClient):
    """A `CompileClient` whose calls reach `farm` in this process, with no channel."""

    ADDRESS = "in-process"
    """What errors and trust messages name as the farm's address."""

    def __init__(
        self,
        farm: Farm,
        settings: SDKSettings | None = None,
        after_submit: Callable[[], Any] | None = None,
    ):
        stub = InProcessStub(CompileFarmServicer(farm, farm.settings), after_submit)
        super().__init__(self.ADDRESS, settings or SDKSettings(remote=self.ADDRESS), stub)

    def on_this_machine(self) -> bool:
        return True
