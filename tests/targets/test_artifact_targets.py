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
from torchfarm.kernels import kernel_artifact, triton_request
from torchfarm.trust.signing import TrustedKeys
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys, targets
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
    """A manifest that names an sm_80 cubin as the kernel for another target (a worker's
    bug, or a worker of the wrong arch) is refused by the binary's own header."""
    source = (Path(__file__).parent / "kernels" / "add_kernel.py").read_text()
    sm80 = compile_kernel(_kernel_request(source, "cuda:sm_80"), targets.parse("cuda:sm_80"))
    for target in ("cuda:sm_80", "cuda:sm_90", "rocm:gfx942"):
        req = _kernel_request(source, target)
        key = keys.compute_kernel_key(req)
        manifest, blobs = kernel_artifact.build_manifest(
            key, "", target=target, triton_version="3.7.0", name="add_kernel", kind="cubin",
            binary=sm80.binary, assembly=sm80.assembly, metadata=sm80.metadata, worker="w", seconds=0.0,
        )
        reply = farm_pb2.KernelReply(
            key=key, kind="cubin", binary=sm80.binary, assembly=sm80.assembly,
            metadata_json=blobs[manifest.payload.digest].decode(), triton_version="3.7.0",
            manifest=manifest.to_json(),
        )
        if target == "cuda:sm_80":
            assert from_reply(reply, req, DEV).binary == sm80.binary
        else:
            with pytest.raises(ArtifactRejected, match=f"cubin for sm_80, not code for {target}"):
                from_reply(reply, req, DEV)


def _kernel_request(source: str, target: str) -> farm_pb2.KernelRequest:
    return triton_request.build_kernel_request(
        source, "add_kernel", target=target, signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 128}, triton_version="3.7.0",
    )