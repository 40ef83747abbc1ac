from __future__ import annotations

import pytest

from torchfarm.wire.manifest import BlobRef, KernelRef, Manifest, ManifestError, blob_digest, check_blobs


def _manifest(payload: bytes, src: bytes, binary: bytes) -> Manifest:
    ref = lambda b: BlobRef(blob_digest(b), len(b))  # noqa: E731
    return Manifest(
        key="k" * 64,
        fingerprint={"isa": "avx512"},
        payload=ref(payload),
        kernels=(KernelRef("kern", "cpp", ref(src), ref(binary)),),
        timings={"compile": 1.5},
        worker="w",
        created=1.0,
    )


def test_round_trip_and_blobs():
    m = _manifest(b"payload", b"src", b"bin")
    again = Manifest.from_json(m.to_json())
    assert again == m
    assert [b.size for b in m.blobs()] == [7, 3, 3]
    check_blobs(m, {blob_digest(x): x for x in (b"payload", b"src", b"bin")})


def test_tampered_blob_is_refused():
    m = _manifest(b"payload", b"src", b"bin")
    blobs = {blob_digest(x): x for x in (b"payload", b"src", b"bin")}
    blobs[blob_digest(b"bin")] = b"BIN"
    with pytest.raises(ManifestError, match="does not match"):
        check_blobs(m, blobs)
    del blobs[blob_digest(b"bin")]
    with pytest.raises(ManifestError, match="missing"):
        check_blobs(m, blobs)


NESTED = b'{"format": "torchfarm.artifact/1", "key": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
"""Written to the cache Redis by whoever can write it: json's decoder recurses per level."""


@pytest.mark.parametrize("data", [b"", b"{}", b"[1]", b'{"format": "other/9"}', b"\xff", NESTED])
def test_malformed_manifest(data):
    with pytest.raises(ManifestError):
        Manifest.from_json(data)
