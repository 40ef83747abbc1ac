"""Artifact signatures: what they bind, rotation by key id, expiry, forgery."""

from __future__ import annotations

import dataclasses
import json

import pytest

from torchfarm.trust.signing import SignatureError, Signer, TrustedKeys
from torchfarm.wire.manifest import BlobRef, KernelRef, Manifest, blob_digest

FP = {"isa": "avx512", "torch_version": "2.13.0+cpu"}


def _manifest(tenant: str = "alice") -> Manifest:
    ref = lambda b: BlobRef(blob_digest(b), len(b))  # noqa: E731
    return Manifest(
        key="k" * 64, fingerprint=dict(FP), payload=ref(b"payload"),
        kernels=(KernelRef("kern", "cpp", ref(b"src"), ref(b"bin")),),
        timings={"compile": 1.25}, worker="w", created=1000.5, tenant=tenant,
    )


@pytest.fixture
def signer():
    return Signer.generate()


@pytest.fixture
def trusted(signer):
    return TrustedKeys.parse(signer.trusted_entry())


def verify(trusted, m, **over):
    args = {"key": "k" * 64, "tenant": "alice", "fingerprint": FP, **over}
    trusted.verify(m, **args)


def test_signature_survives_the_json_round_trip(signer, trusted):
    m = signer.sign(_manifest())
    again = Manifest.from_json(m.to_json())
    assert again == m and again.signature is not None
    verify(trusted, again)


@pytest.mark.parametrize(
    "over, reason",
    [
        ({"key": "j" * 64}, "mismatch"),
        ({"tenant": "bob"}, "mismatch"),
        ({"fingerprint": {**FP, "isa": "avx2"}}, "invalid"),
    ],
)
def test_signature_binds_key_tenant_and_fingerprint(signer, trusted, over, reason):
    with pytest.raises(SignatureError) as info:
        verify(trusted, signer.sign(_manifest()), **over)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "change",
    [
        lambda m: dataclasses.replace(m, payload=BlobRef(blob_digest(b"evil"), 4)),
        lambda m: dataclasses.replace(m, worker="mallory"),
        lambda m: dataclasses.replace(m, fingerprint={**FP, "isa": "avx2"}),
        lambda m: dataclasses.replace(m, kernels=()),
    ],
    ids=["payload", "worker", "fingerprint", "kernels"],
)
def test_any_edit_of_a_signed_manifest_is_refused(signer, trusted, change):
    m = signer.sign(_manifest())
    edited = change(m)
    with pytest.raises(SignatureError, match="does not verify"):
        verify(trusted, edited, fingerprint=edited.fingerprint)


def test_forged_unknown_and_missing_signatures(signer, trusted):
    with pytest.raises(SignatureError) as info:
        verify(trusted, _manifest())
    assert info.value.reason == "unsigned"
    mallory = Signer.generate()
    with pytest.raises(SignatureError) as info:
        verify(trusted, mallory.sign(_manifest()))
    assert info.value.reason == "unknown_key"
    # Mallory's signature under the pinned key's id: a forgery.
    forged = mallory.sign(_manifest())
    forged = dataclasses.replace(forged, signature=dataclasses.replace(forged.signature, key_id=signer.key_id))
    with pytest.raises(SignatureError) as info:
        verify(trusted, forged)
    assert info.value.reason == "invalid"


def test_expired_and_future_signatures(signer, trusted):
    old = signer.sign(_manifest(), ttl_s=10, now=1_000_000)
    with pytest.raises(SignatureError) as info:
        verify(trusted, old)
    assert info.value.reason == "expired"
    future = signer.sign(_manifest(), now=4_000_000_000)
    with pytest.raises(SignatureError) as info:
        verify(trusted, future, now=3_000_000_000)
    assert info.value.reason == "not_yet_valid"
    # The expiry is signed too: pushing it forward breaks the signature.
    pushed = dataclasses.replace(old, signature=dataclasses.replace(old.signature, expires_at=2**40))
    with pytest.raises(SignatureError, match="does not verify"):
        verify(trusted, pushed)


def test_rotation_by_key_id(tmp_path, signer):
    new = Signer.generate()
    pins = tmp_path / "keys.json"
    pins.write_text(json.dumps({**signer.trusted_entry(), **new.trusted_entry()}))
    both = TrustedKeys.load(str(pins))
    verify(both, signer.sign(_manifest()))
    verify(both, new.sign(_manifest()))
    only_new = TrustedKeys.load(inline=",".join(f"{k}={v}" for k, v in new.trusted_entry().items()))
    with pytest.raises(SignatureError):
        verify(only_new, signer.sign(_manifest()))


def test_key_file_round_trip(tmp_path, signer):
    path = tmp_path / "key.pem"
    signer.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    again = Signer.from_file(path)
    assert again.key_id == signer.key_id
    assert Signer.from_file(path, key_id="farm-2026").key_id == "farm-2026"


def test_bad_pins_are_refused():
    with pytest.raises(ValueError):
        TrustedKeys.parse({"k": "not base64!"})
    with pytest.raises(ValueError):
        TrustedKeys.parse({"bad id with spaces": "AAAA"})
    with pytest.raises(ValueError):
        TrustedKeys.load(inline="no-equals-sign")


def test_keygen_never_overwrites_the_live_key(tmp_path, capsys):
    """Step 1 of a rotation (docs/security.md) makes the new key beside the live one: it
    once overwrote signing-key.pem, so a worker restarted before step 3 signed with the
    new key under the old id, and every client refused its artifacts."""
    from cli.main import main

    assert main(["keygen", str(tmp_path), "--key-id", "farm-1"]) == 0
    live = tmp_path / "signing-key.pem"
    before = live.read_bytes()
    assert main(["keygen", str(tmp_path), "--key-id", "farm-2"]) == 0
    assert live.read_bytes() == before
    new = tmp_path / "signing-key-farm-2.pem"
    assert new.stat().st_mode & 0o777 == 0o600
    pins = TrustedKeys.load(str(tmp_path / "trusted-keys.json"))
    verify(pins, Signer.from_file(live, "farm-1").sign(_manifest()))
    verify(pins, Signer.from_file(new, "farm-2").sign(_manifest()))
    assert "TORCHFARM_SIGNING_KEY_FILE=" + str(new) in capsys.readouterr().out
    assert main(["keygen", str(tmp_path), "--key-id", "farm-2"]) != 0  # that id's key is there
    assert new.stat().st_mode & 0o777 == 0o600


def test_a_saved_key_never_replaces_a_file(tmp_path, signer):
    path = tmp_path / "key.pem"
    path.write_text("an operator's file")
    path.chmod(0o644)
    with pytest.raises(FileExistsError):
        signer.save(path)
    assert path.read_text() == "an operator's file"
