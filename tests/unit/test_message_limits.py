"""The server's receive limit follows the largest request the farm accepts, so grpc refuses
an oversized message while reading it: at 64 MiB for every method, a 60 MiB Submit was read
and parsed whole before the farm compared it with its 16 MiB limit, and eight at once added
~880 MiB to the coordinator. The server caps its calls in flight. What the SDK says when
grpc itself refuses: the limit, by name."""

from __future__ import annotations

import pytest

from sdk.client import StubClient
from sdk.errors import FarmUnavailable, RequestTooLarge
from sdk.settings import SDKSettings
from services.coordinator import server
from services.coordinator.settings import CoordinatorSettings
from tests.rpc_errors import Exhausted
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import Reason


def test_a_message_grpc_refused_for_its_size_is_request_too_large():
    """grpc itself answers RESOURCE_EXHAUSTED, with no farm reason, for a message over the
    server's receive limit: the SDK names the limit, as for the farm's own refusal."""

    class _Stub:
        def __init__(self, details: str):
            self.details = details

        def Submit(self, request, timeout, metadata):
            raise Exhausted("", self.details)

    def refused(details: str) -> RequestTooLarge:
        with pytest.raises(RequestTooLarge) as raised:
            StubClient("127.0.0.1:1", SDKSettings(), _Stub(details)).submit(farm_pb2.CompileRequest())
        assert raised.value.code == Reason.REQUEST_TOO_LARGE and raised.value.fallback
        return raised.value

    server_side = str(refused("SERVER: Received message larger than max (20971520 vs. 16842752)"))
    assert "16842752" in server_side and "TORCHFARM_MAX_REQUEST_BYTES" in server_side
    client_side = str(refused("CLIENT: Sent message larger than max (80000000 vs. 67108864)"))
    assert "67108864" in client_side and "TORCHFARM_MAX_MESSAGE_BYTES" in client_side


def test_a_farm_at_its_most_calls_is_unavailable_not_a_size_refusal():
    class _Stub:
        def GetFarmStatus(self, request, timeout, metadata):
            raise Exhausted("", "Concurrent RPC limit exceeded!")

    with pytest.raises(FarmUnavailable) as raised:
        StubClient("127.0.0.1:1", SDKSettings(), _Stub()).status()
    assert raised.value.fallback


def test_the_server_receives_no_more_than_the_farm_accepts():
    settings = CoordinatorSettings(max_request_bytes=16 << 20)
    options = dict(server.grpc_options(settings))
    receive = options["grpc.max_receive_message_length"]
    assert settings.max_request_bytes < receive <= settings.max_request_bytes + (1 << 20)
    assert options["grpc.max_send_message_length"] == settings.max_message_bytes  # artifacts, kernels
    # max_message_bytes still caps it, where an operator set it lower.
    low = CoordinatorSettings(max_request_bytes=16 << 20, max_message_bytes=1 << 20)
    assert dict(server.grpc_options(low))["grpc.max_receive_message_length"] == 1 << 20


def test_the_server_caps_concurrent_calls():
    assert server.max_concurrent_rpcs(CoordinatorSettings(max_concurrent_rpcs=100)) == 100
    assert server.max_concurrent_rpcs(CoordinatorSettings(max_concurrent_rpcs=0)) is None
    assert server.max_concurrent_rpcs(CoordinatorSettings()) >= 1024  # generous by default
