"""The SDK's verify-before-load: signature, key, namespace, fingerprint, digests, and the
policy for a farm whose artifacts cannot be verified. Nothing here deserializes."""

from __future__ import annotations

import dataclasses

import pytest

from sdk import artifact
from sdk.errors import ArtifactRejected
from sdk.settings import SDKSettings
from sdk.trust import Trust, is_loopback
from torchfarm.fx.fingerprint import Fingerprint
from torchfarm.trust import tokens
from torchfarm.trust.signing import Signer, TrustedKeys
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest

FP = Fingerprint(
    torch_version="2.13.0+cpu", torch_git="abc", triton_version="3.7.0", python="3.11",
    platform="linux-x86_64", device="cpu", arch="", isa="avx512", compiler="g++ 12",
)
KEY = "a" * 64
PAYLOAD = b"not really a pickle"


def _artifact(signer: Signer | None, tenant: str = "alice", fp: Fingerprint = FP) -> tuple[bytes, dict]:
    m = Manifest(
        key=KEY, fingerprint=fp.to_dict(), payload=BlobRef(blob_digest(PAYLOAD), len(PAYLOAD)),
        worker="w", created=1.0, tenant=tenant,
    )
    if signer is not None:
        m = signer.sign(m)
    return m.to_json(), {blob_digest(PAYLOAD): PAYLOAD}


@pytest.fixture
def signer():
    return Signer.generate()


def _trust(signer: Signer | None, namespace: str = "alice", unsigned: bool = False) -> Trust:
    keys = TrustedKeys.parse(signer.trusted_entry()) if signer else TrustedKeys({})
    return Trust(keys=keys, namespace=namespace, unsigned=unsigned)


def _reason(fn) -> str:
    with pytest.raises(ArtifactRejected) as info:
        fn()
    return info.value.code


def test_signed_artifact_for_this_key_tenant_and_machine_is_accepted(signer):
    m = artifact.verify(*_artifact(signer), KEY, FP, _trust(signer))
    assert m.tenant == "alice"


def test_refusals_each_with_a_reason(signer):
    t = _trust(signer)
    assert _reason(lambda: artifact.verify(*_artifact(None), KEY, FP, t)) == "unsigned"
    assert _reason(lambda: artifact.verify(*_artifact(Signer.generate()), KEY, FP, t)) == "unknown_key"
    assert _reason(lambda: artifact.verify(*_artifact(signer, tenant="bob"), KEY, FP, t)) == "mismatch"
    assert _reason(lambda: artifact.verify(*_artifact(signer), "b" * 64, FP, t)) == "mismatch"
    other = dataclasses.replace(FP, isa="avx2")
    assert _reason(lambda: artifact.verify(*_artifact(signer, fp=other), KEY, FP, t)) == "invalid"
    manifest, blobs = _artifact(signer)
    blobs = {d: b"X" * len(b) for d, b in blobs.items()}
    assert _reason(lambda: artifact.verify(manifest, blobs, KEY, FP, t)) == "digest"
    assert _reason(lambda: artifact.verify(b"\x80pickle", {}, KEY, FP, t)) == "malformed"


def test_no_known_key_loads_only_from_a_farm_named_as_unsigned():
    manifest, blobs = _artifact(None, tenant="")
    artifact.verify(manifest, blobs, KEY, FP, _trust(None, namespace="", unsigned=True))
    other = _trust(None, namespace="", unsigned=False)
    assert not other.loads_anything
    assert _reason(lambda: artifact.verify(manifest, blobs, KEY, FP, other)) == "untrusted_farm"


def test_pinned_keys_refuse_unsigned_even_from_a_farm_named_as_unsigned(signer):
    manifest, blobs = _artifact(None)
    t = _trust(signer, unsigned=True)
    assert _reason(lambda: artifact.verify(manifest, blobs, KEY, FP, t)) == "unsigned"


def test_trust_from_settings_reads_namespace_from_token(signer):
    tok = tokens.new_token("team-a")
    inline = ",".join(f"{k}={v}" for k, v in signer.trusted_entry().items())
    t = Trust.from_settings(SDKSettings(token=tok, trusted_keys=inline), "farm.example:50051")
    assert t.namespace == "team-a" and t.verifies_signatures and not t.unsigned


@pytest.mark.parametrize(
    "address, loop",
    [("127.0.0.1:1", True), ("127.9.9.9:1", True), ("localhost:1", True), ("[::1]:1", True),
     ("10.0.0.1:1", False), ("farm:1", False)],
)
def test_loopback(address, loop):
    assert is_loopback(address) is loop
