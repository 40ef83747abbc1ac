"""TLS and mutual TLS with tokens: the token travels as call credentials over TLS."""

from __future__ import annotations

import json

import pytest

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port
from sdk.client import FarmClient
from sdk.errors import FarmUnavailable
from sdk.settings import SDKSettings
from services.coordinator.settings import CoordinatorSettings
from tests.coordinator_server import running_coordinator
from tests.requests import RELU_QUEUE, relu_request
from tests.tls import make_pki
from torchfarm.trust import tokens

pytestmark = pytest.mark.integration


def _settings(tmp_path, redis_url, pki, mutual: bool) -> tuple[CoordinatorSettings, str]:
    tok = tokens.new_token("alice")
    (tmp_path / "tokens.json").write_text(json.dumps(tokens.table_entry(tok, "alice")))
    settings = CoordinatorSettings(
        listen=f"127.0.0.1:{free_port()}", cache_url=redis_url,
        tokens_file=str(tmp_path / "tokens.json"),
        tls_cert_file=str(pki["server_cert"]), tls_key_file=str(pki["server_key"]),
        tls_client_ca_file=str(pki["ca"]) if mutual else "", grace_s=1,
    )
    return settings, tok


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_with_token(store, tmp_path, redis_url, mutual):
    pki = make_pki(tmp_path)
    settings, tok = _settings(tmp_path, redis_url, pki, mutual)
    store.heartbeat("w1", [RELU_QUEUE, "cpu"], "test", ttl_s=60)
    remote = f"grpcs://{settings.listen}"
    client_cert = {"tls_cert_file": str(pki["client_cert"]), "tls_key_file": str(pki["client_key"])}
    with running_coordinator(settings, InlineDispatcher()):
        ok = FarmClient(remote, SDKSettings(token=tok, tls_ca_file=str(pki["ca"]), connect_timeout_s=5, **client_cert))
        assert ok.submit(relu_request()).key
        # Plaintext to a TLS port never connects.
        plain = FarmClient(f"grpc://{settings.listen}", SDKSettings(token=tok, connect_timeout_s=1))
        with pytest.raises(FarmUnavailable):
            plain.submit(relu_request())
        if mutual:
            anonymous = FarmClient(remote, SDKSettings(token=tok, tls_ca_file=str(pki["ca"]), connect_timeout_s=2))
            with pytest.raises(FarmUnavailable):
                anonymous.submit(relu_request())
