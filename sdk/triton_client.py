"""`sdk.compile_kernel`: one Triton kernel compiled by the farm for an explicit GPU target.

    k = sdk.compile_kernel(
        source, "add_kernel", target="cuda:sm_90",
        signature="*fp32,*fp32,*fp32,i32,constexpr", constexprs={"BLOCK": 1024},
        remote="grpc://farm:50051",
    )
    open("add_kernel.cubin", "wb").write(k.binary)

The source is sent as text and parsed, never executed, on the farm
(torchfarm/kernels/triton_check.py; docs/targets.md). It is checked here first with the same
checker, so a bad kernel fails before a round trip. The reply is trusted as an artifact
is (sdk/trust.py): its manifest must be signed by a pinned farm key for the key this
client computes from its own request, in its namespace, for the target and Triton asked
for, and name the binary, assembly and metadata by digest; the binary must be code for
the target (torchfarm/kernels/kernel_artifact.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sdk import settings as sdk_settings
from sdk.client import FarmClient
from sdk.errors import ConfigError, KernelRejected
from sdk.metrics import rejected
from sdk.trust import Trust, untrusted_message
from torchfarm.kernels import kernel_artifact, triton_check, triton_request
from torchfarm.v1 import farm_pb2
from torchfarm.wire import targets
from torchfarm.wire.codes import Reason, Rejection


@dataclass(frozen=True)
class CompiledKernel:
    key: str
    target: str
    kind: str
    """"cubin" or "hsaco"."""
    binary: bytes
    assembly: str
    """PTX (cuda) or AMDGCN (rocm) text."""
    metadata: dict[str, Any]
    """Triton's metadata: name, num_warps, shared memory, target, ..."""
    cache_hit: bool
    worker: str
    triton_version: str
    compile_seconds: float


def compile_kernel(
    source: str,
    name: str,
    *,
    target: str,
    signature: str | list[str] | dict[str, str],
    constexprs: dict[str, Any] | None = None,
    num_warps: int = 0,
    num_stages: int = 0,
    triton_version: str | None = None,
    remote: str | None = None,
    label: str = "",
    timeout_s: float | None = None,
) -> CompiledKernel:
    """Compiles the `@triton.jit` function `name` in `source` for `target` on the farm.

    `signature` lists every parameter's Triton type, positionally ("*fp32,i32,constexpr")
    or by name; `constexprs` gives the constexpr values. `triton_version` defaults to the
    locally installed Triton; pass "" to take whatever the farm's workers run.
    `timeout_s` (default TORCHFARM_KERNEL_TIMEOUT_S) bounds the call.
    Raises KernelRejected (source not allowed, Triton's compile error), FarmUnavailable
    (no live worker compiles kernels for the target), ArtifactRejected (no key is known
    for the farm, or the reply is not the signed kernel asked for: module docstring),
    ConfigError (bad arguments).
    """
    try:
        request = triton_request.build_kernel_request(
            source, name, target=target, signature=signature, constexprs=constexprs,
            num_warps=num_warps, num_stages=num_stages, triton_version=triton_version,
            label=label,
        )
    except triton_check.KernelRejected as e:
        raise KernelRejected(str(e), Reason.INVALID_KERNEL) from e
    except (targets.TargetError, triton_request.KernelRequestError) as e:
        raise ConfigError(str(e)) from e
    settings = sdk_settings.load()
    settings = dataclasses.replace(
        settings, remote=remote or settings.remote, kernel_timeout_s=timeout_s or settings.kernel_timeout_s
    )
    if not settings.remote:
        raise ConfigError("no farm address: pass remote= or set TORCHFARM_REMOTE")
    client = FarmClient(settings.remote, settings)
    try:
        trust = Trust.from_settings(settings, client.address)
        if not trust.loads_anything:
            raise rejected(Rejection.UNTRUSTED_FARM, untrusted_message(client.address))
        reply = client.compile_kernel(request)
    finally:
        client.close()
    return from_reply(reply, request, trust)


def from_reply(reply: farm_pb2.KernelReply, request: farm_pb2.KernelRequest, trust: Trust) -> CompiledKernel:
    """The reply as a CompiledKernel, once it is the kernel `request` asked for, as
    `trust` requires (module docstring); ArtifactRejected otherwise."""
    try:
        checked = kernel_artifact.check_reply(
            reply, request, namespace=trust.namespace,
            trusted=trust.keys if trust.verifies_signatures else None,
        )
    except kernel_artifact.KernelRefused as e:
        raise rejected(e.reason, str(e)) from e
    manifest = checked.manifest
    return CompiledKernel(
        key=manifest.key,
        target=manifest.fingerprint["target"],
        kind=checked.kind,
        binary=checked.binary,
        assembly=checked.assembly,
        metadata=checked.metadata,
        cache_hit=reply.cache_hit,
        worker=manifest.worker,
        triton_version=checked.triton_version,
        compile_seconds=manifest.timings.get("kernel", 0.0),
    )
