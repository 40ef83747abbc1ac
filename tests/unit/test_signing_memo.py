"""TrustedKeys remembers the signatures that verified (the hit path checks the same one
on every hit), and the memo never vouches for anything that did not verify."""

from __future__ import annotations

import dataclasses

import pytest

from torchfarm.trust.signing import SignatureError, Signer, TrustedKeys
from torchfarm.wire.manifest import BlobRef, Manifest


def _signed() -> tuple[Manifest, TrustedKeys]:
    signer = Signer.generate()
    manifest = Manifest(key="k" * 64, fingerprint={"isa": "avx512"}, payload=BlobRef("sha256:" + "a" * 64, 1),
                        tenant="alice")
    return signer.sign(manifest), TrustedKeys.parse(signer.trusted_entry())


def _verify(trusted: TrustedKeys, m: Manifest, tenant: str = "alice") -> None:
    trusted.verify(m, key=m.key, tenant=tenant, fingerprint=m.fingerprint)


def test_a_verified_signature_is_checked_once(monkeypatch):
    m, trusted = _signed()
    calls = []
    (public,) = trusted.keys.values()
    real = type(public).verify
    monkeypatch.setattr(type(public), "verify", lambda self, *a: calls.append(1) or real(self, *a))
    for _ in range(3):
        _verify(trusted, m)
    assert len(calls) == 1


def test_what_the_memo_holds_never_vouches_for_other_content():
    m, trusted = _signed()
    _verify(trusted, m)  # remembered
    tampered = dataclasses.replace(m, payload=BlobRef("sha256:" + "b" * 64, 1))
    with pytest.raises(SignatureError):
        _verify(trusted, tampered)
    other_fp = dataclasses.replace(m, fingerprint={"isa": "avx2"})
    with pytest.raises(SignatureError):
        _verify(trusted, other_fp)
    with pytest.raises(SignatureError):  # a failure is not remembered as a pass either
        _verify(trusted, tampered)
