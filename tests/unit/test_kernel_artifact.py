"""A Triton kernel from the farm is trusted as an artifact is: its signed manifest must
answer the client's own request, and every byte of the reply must be what it names.

Before kernels had manifests, a reply's binary was checked for its ELF target only: a
farm impostor, or whoever could write `tf:kernel:` in Redis, chose the code."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from torchfarm.kernels import elf, kernel_artifact, triton_request
from torchfarm.kernels.kernel_artifact import KernelRefused
from torchfarm.trust.signing import Signer, TrustedKeys
from torchfarm.v1 import farm_pb2
from torchfarm.wire import keys
from torchfarm.wire.codes import Rejection

SOURCE = '''import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
'''
NAMESPACE = "team-a"
SIGNER = Signer.generate()
PINNED = TrustedKeys.parse(SIGNER.trusted_entry())


def cubin(sm: int, body: bytes = b"the kernel's code") -> bytes:
    """An ELF64 header that reads as a cubin for sm_<sm>, then `body`."""
    header = bytearray(64)
    header[:9] = b"\x7fELF\x02\x01\x01\x00\x07"  # ELF64, little-endian, CUDA ABI version 7
    struct.pack_into("<H", header, 18, elf.EM_CUDA)
    struct.pack_into("<I", header, 48, sm)
    return bytes(header) + body


def request(triton_version: str = "3.7.0") -> farm_pb2.KernelRequest:
    return triton_request.build_kernel_request(
        SOURCE, "add_kernel", target="cuda:sm_80", signature="*fp32,*fp32,*fp32,i32,constexpr",
        constexprs={"BLOCK": 128}, triton_version=triton_version,
    )


def reply_for(req: farm_pb2.KernelRequest, *, signer: Signer | None = SIGNER, namespace: str = NAMESPACE,
              binary: bytes | None = None, version: str = "3.7.0") -> farm_pb2.KernelReply:
    """The reply an honest farm gives: what the worker stores, as the coordinator sends it."""
    built = farm_pb2.KernelRequest()
    built.CopyFrom(req)
    built.triton_version = version
    key = keys.compute_kernel_key(built, namespace)
    binary = binary if binary is not None else cubin(80)
    manifest, blobs = kernel_artifact.build_manifest(
        key, namespace, target="cuda:sm_80", triton_version=version, name="add_kernel",
        kind="cubin", binary=binary, assembly=".target sm_80\n", metadata={"num_warps": 4},
        worker="gpu0", seconds=0.5,
    )
    if signer is not None:
        manifest = signer.sign(manifest)
    ref = manifest.kernels[0]
    return farm_pb2.KernelReply(
        key=key, kind=ref.kind, binary=blobs[ref.binary.digest],
        assembly=blobs[ref.source.digest].decode(), metadata_json=blobs[manifest.payload.digest].decode(),
        triton_version=version, worker=manifest.worker, manifest=manifest.to_json(),
    )


def check(reply: farm_pb2.KernelReply, req: farm_pb2.KernelRequest | None = None,
          trusted: TrustedKeys | None = PINNED) -> kernel_artifact.CheckedKernel:
    return kernel_artifact.check_reply(reply, req or request(), namespace=NAMESPACE, trusted=trusted)


def refusal(reply: farm_pb2.KernelReply, req: farm_pb2.KernelRequest | None = None,
            trusted: TrustedKeys | None = PINNED) -> Rejection:
    with pytest.raises(KernelRefused) as e:
        check(reply, req, trusted)
    return e.value.reason


def test_an_honest_signed_reply_is_accepted():
    k = check(reply_for(request()))
    assert k.binary == cubin(80) and k.kind == "cubin" and k.info.arch == "sm_80"
    assert k.metadata == {"num_warps": 4} and k.assembly == ".target sm_80\n"
    assert k.triton_version == "3.7.0" and k.manifest.worker == "gpu0"


def test_another_binary_for_the_same_arch_is_refused():
    """The hole: a cubin for the right arch, but not the one the worker built and signed."""
    honest = reply_for(request())
    swapped = farm_pb2.KernelReply()
    swapped.CopyFrom(honest)
    swapped.binary = cubin(80, b"code the farm never compiled")
    assert elf.check_binary(swapped.binary, "cuda", "sm_80").arch == "sm_80"  # the old check passes
    assert refusal(swapped) == Rejection.DIGEST


@pytest.mark.parametrize("field, value", [("assembly", ".target sm_80\n// edited\n"), ("metadata_json", '{"num_warps":8}')])
def test_edited_assembly_or_metadata_is_refused(field, value):
    reply = reply_for(request())
    setattr(reply, field, value)
    assert refusal(reply) == Rejection.DIGEST


def test_a_manifest_without_a_pinned_signature_is_refused():
    assert refusal(reply_for(request(), signer=None)) == Rejection.UNSIGNED
    assert refusal(reply_for(request(), signer=Signer.generate())) == Rejection.UNKNOWN_KEY
    no_manifest = reply_for(request())
    no_manifest.ClearField("manifest")
    assert refusal(no_manifest) == Rejection.MALFORMED


def test_a_development_farm_named_unsigned_needs_no_signature_but_the_same_digests():
    assert check(reply_for(request(), signer=None), trusted=None).binary == cubin(80)
    swapped = reply_for(request(), signer=None, binary=cubin(80))
    swapped.binary = cubin(80, b"other")
    assert refusal(swapped, trusted=None) == Rejection.DIGEST


def test_a_signed_kernel_for_another_request_namespace_or_version_is_refused():
    other = request()
    other.constexprs[0].json_value = "256"  # another kernel, validly signed for its own key
    assert refusal(reply_for(other)) == Rejection.MISMATCH  # its key is not this request's
    re_keyed = reply_for(other)
    re_keyed.key = reply_for(request()).key  # named as ours: the signature covers the key
    assert refusal(re_keyed) == Rejection.MISMATCH
    assert refusal(reply_for(request(), namespace="team-b")) == Rejection.MISMATCH
    # The request pinned Triton 3.7.0; a farm that answers with another is refused.
    assert refusal(reply_for(request(), version="3.6.0")) == Rejection.MISMATCH


def test_a_request_that_leaves_the_version_to_the_farm_takes_the_signed_one():
    loose = request(triton_version="")
    k = check(reply_for(loose, version="3.6.0"), req=loose)
    assert k.triton_version == "3.6.0"
    assert k.manifest.key == keys.compute_kernel_key(request("3.6.0"), NAMESPACE)


def test_a_binary_for_another_arch_is_refused_even_when_signed():
    assert refusal(reply_for(request(), binary=cubin(90))) == Rejection.WRONG_ARCH


def test_a_manifest_of_another_kind_is_refused():
    reply = reply_for(request(), signer=None)
    body = json.loads(reply.manifest)
    body["kind"] = "export"
    reply.manifest = json.dumps(body).encode()
    assert refusal(reply, trusted=None) == Rejection.MISMATCH


def test_the_manifest_round_trips_through_the_record():
    manifest, _ = kernel_artifact.build_manifest(
        "k" * 64, "", target="rocm:gfx942", triton_version="3.7.0", name="f", kind="hsaco",
        binary=b"x", assembly="", metadata={}, worker="w", seconds=1.0,
    )
    signed = SIGNER.sign(manifest)
    assert dataclasses.replace(type(signed).from_json(signed.to_json()), created=signed.created) == signed
