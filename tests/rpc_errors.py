"""The grpc error a refused call raises, for tests of the SDK's client without a server."""

from __future__ import annotations

import grpc


class Exhausted(grpc.RpcError):
    """RESOURCE_EXHAUSTED with these details, and the farm's reason in the trailing metadata
    (none: grpc's own refusal, such as a message over its size limit)."""

    def __init__(self, reason: str, details: str = "too many"):
        self.reason, self._details = reason, details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("torchfarm-reason", self.reason),) if self.reason else ()
