"""Text a farm sends reaches the user's terminal and logs: the SDK's errors (whose
fallback warnings log them) and the CLI's tables. A hostile farm, or anyone on a
plaintext channel, must not rewrite that terminal with escape sequences (a title, a
cleared line, a forged "hit" line): control characters become spaces. A hostile farm on
loopback, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from sdk.client import FarmClient
from sdk.errors import FarmError
from sdk.settings import SDKSettings
from torchfarm import tables
from torchfarm.v1 import farm_pb2, farm_pb2_grpc

HOSTILE = "\x1b]0;owned\x07\x1b[2K\rcompiled\x9b2J\x00 fine\nsecond line"


class Hostile(farm_pb2_grpc.CompileFarmServicer):
    def Submit(self, request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, HOSTILE)


@pytest.fixture
def hostile_farm() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    farm_pb2_grpc.add_CompileFarmServicer_to_server(Hostile(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"grpc://127.0.0.1:{port}"
    server.stop(0)


def test_a_farms_error_text_loses_its_control_characters(hostile_farm):
    client = FarmClient(hostile_farm, SDKSettings(remote=hostile_farm))
    with pytest.raises(FarmError) as raised:
        client.submit(farm_pb2.CompileRequest())
    message = str(raised.value)
    assert "compiled" in message and "fine" in message
    assert not any(c in message for c in "\x1b\x07\r\x9b\x00"), repr(message)
    assert "\nsecond line" in message  # a compile error's lines stay lines


def test_a_table_cell_is_one_printable_line():
    out = tables.table([["w1" + HOSTILE, 3]], ["WORKER", "JOBS"], right=["JOBS"])
    assert not any(c in out for c in "\x1b\x07\r\x9b\x00"), repr(out)
    assert len(out.splitlines()) == 2 and "second line" in out
