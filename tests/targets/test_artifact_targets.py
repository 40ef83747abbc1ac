"""An artifact built for one target is refused on another, before anything is loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sdk import artifact
from sdk.errors import ArtifactRejected
from sdk.triton_client import from_reply
from sdk.trust import Trust
from torchfarm.fx.fingerprint import fingerprint_for, local_fingerprint, resolve
from torchfarm.kernels import triton_request
from torchfarm.trust.signing import TrustedKeys
from torchfarm.v1 import farm_pb2
from torchfarm.wire import targets
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest
from workers.triton_compile import compile_kernel

KEY = "ab" * 32
PAYLOAD = b"an Inductor artifact that must never be deserialized here"
DEV = Trust(keys=TrustedKeys({}), namespace="", unsigned=True)
"""A development farm named in TORCHFARM_TRUST_UNSIGNED: only the target checks apply."""


def _manifest_for(fp) -> tuple[bytes, dict[str, bytes]]:
    ref = BlobRef(blob_digest(PAYLOAD), len(PAYLOAD))
    m = Manifest(key=KEY, fingerprint=fp.to_dict(), payload=ref, worker="w")
    return m.to_json(), {ref.digest: PAYLOAD}


def test_cpu_isa_mismatch_is_refused():
    local = local_fingerprint()
    other_isa = "avx512" if local.isa != "avx512" else "avx2"
    built = dataclasses.replace(local, isa=other_isa)
    data, blobs = _manifest_for(built)
    with pytest.raises(ArtifactRejected, match=f"isa '{other_isa}' != local '{local.isa}'"):
        artifact.verify(data, blobs, KEY, local, DEV)
    data, blobs = _manifest_for(local)
    assert artifact.verify(data, blobs, KEY, local, DEV).key == KEY  # its own target loads


def test_gpu_arch_mismatch_is_refused():
    sm90, sm80 = fingerprint_for(resolve("cuda:sm_90")), fingerprint_for(resolve("cuda:sm_80"))
    data, blobs = _manifest_for(sm90)
    with pytest.raises(ArtifactRejected, match="arch 'sm_90' != local 'sm_80'"):
        artifact.verify(data, blobs, KEY, sm80, DEV)
    gfx = fingerprint_for(resolve("rocm:gfx942"))
    with pytest.raises(ArtifactRejected, match="device 'cuda' != local 'rocm'"):
        artifact.verify(data, blobs, KEY, gfx, DEV)
    assert artifact.verify(data, blobs, KEY, sm90, DEV).fingerprint["arch"] == "sm_90"


def test_a_gpu_artifact_never_loads_on_the_cpu():
    data, blobs = _manifest_for(fingerprint_for(resolve("cuda:sm_90")))
    with pytest.raises(ArtifactRejected, match="device 'cuda' != local 'cpu'"):
        artifact.verify(data, blobs, KEY, local_fingerprint(), DEV)


def test_a_kernel_binary_for_another_arch_is_refused():
    source = (Path(__file__).parent / "kernels" / "add_kernel.py").read_text()
    req = triton_request.build_kernel_request(
        source, "add_kernel", target="cuda:sm_80", signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 128},
    )
    r = compile_kernel(req, targets.parse("cuda:sm_80"))
    reply = farm_pb2.KernelReply(key=KEY, kind="cubin", binary=r.binary)
    assert from_reply(reply, "cuda:sm_80").binary == r.binary
    with pytest.raises(ArtifactRejected, match="cubin for sm_80, not code for cuda:sm_90"):
        from_reply(reply, "cuda:sm_90")
    with pytest.raises(ArtifactRejected, match="not code for rocm:gfx942"):
        from_reply(reply, "rocm:gfx942")
