"""What a client that cannot reach the farm is told. A TLS client at a farm that serves
plain gRPC (or the reverse) connects and then fails its handshake: before, it was told
the farm "did not answer", which sends a user to check a farm that is running, and
gRPC's C-core printed each failed handshake on stderr, outside Python's logging."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from localfarm.stack import free_port
from sdk.client import FarmClient
from sdk.errors import FarmUnavailable
from sdk.settings import SDKSettings
from tests.conftest import ROOT


@pytest.fixture
def plain_server():
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_tls_to_a_plain_farm_says_it_answered_and_what_to_change(plain_server):
    client = FarmClient(f"grpcs://{plain_server}", SDKSettings(connect_timeout_s=1))
    with pytest.raises(FarmUnavailable, match=r"accepts connections.*use grpc://") as failed:
        client.connect()
    assert "TORCHFARM_CONNECT_TIMEOUT_S" in str(failed.value)


def test_a_port_nobody_listens_on_did_not_answer():
    client = FarmClient(f"grpc://127.0.0.1:{free_port()}", SDKSettings(connect_timeout_s=0.5))
    with pytest.raises(FarmUnavailable, match=r"did not answer within 0.5s \(TORCHFARM_CONNECT_TIMEOUT_S\)$"):
        client.connect()


def test_the_sdk_keeps_grpcs_own_handshake_lines_off_stderr(plain_server):
    code = (
        "import sdk, grpc\n"
        f"channel = grpc.secure_channel({plain_server!r}, grpc.ssl_channel_credentials())\n"
        "try:\n"
        "    grpc.channel_ready_future(channel).result(timeout=1.5)\n"
        "except grpc.FutureTimeoutError:\n"
        "    print('timed out')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "timed out"
    assert "Handshake failed" not in out.stderr, out.stderr
