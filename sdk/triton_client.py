"""`sdk.compile_kernel`: one Triton kernel compiled by the farm for an explicit GPU target.

    k = sdk.compile_kernel(
        source, "add_kernel", target="cuda:sm_90",
        signature="*fp32,*fp32,*fp32,i32,constexpr", constexprs={"BLOCK": 1024},
        remote="grpc://farm:50051",
    )
    open("add_kernel.cubin", "wb").write(k.binary)

The source is sent as text and parsed, never executed, on the farm
(torchfarm/kernels/triton_check.py; docs/targets.md). It is checked here first with the same
checker, so a bad kernel fails before a round trip, and the reply's binary is checked
against the target (ELF machine and architecture) before it is returned.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from sdk.client import FarmClient
from sdk.errors import ArtifactRejected, ConfigError, KernelRejected
from sdk.settings import SDKSettings
from torchfarm.kernels import elf, triton_check, triton_request
from torchfarm.settings import from_env
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
) -> CompiledKernel:
    """Compiles the `@triton.jit` function `name` in `source` for `target` on the farm.

    `signature` lists every parameter's Triton type, positionally ("*fp32,i32,constexpr")
    or by name; `constexprs` gives the constexpr values. `triton_version` defaults to the
    locally installed Triton; pass "" to take whatever the farm's workers run.
    Raises KernelRejected (source not allowed, Triton's compile error), FarmUnavailable
    (no live worker compiles kernels for the target), ArtifactRejected (the binary is
    not code for the target), ConfigError (bad arguments).
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
    settings = from_env(SDKSettings)
    settings = dataclasses.replace(settings, remote=remote or settings.remote)
    if not settings.remote:
        raise ConfigError("no farm address: pass remote= or set TORCHFARM_REMOTE")
    client = FarmClient(settings.remote, settings)
    try:
        reply = client.compile_kernel(request)
    finally:
        client.close()
    return from_reply(reply, target)


def from_reply(reply: farm_pb2.KernelReply, target: str) -> CompiledKernel:
    """The reply as a CompiledKernel, once its binary is code for `target`."""
    try:
        triton_request.check_reply(reply, target)
    except elf.NotAKernel as e:
        raise ArtifactRejected(f"kernel {reply.key[:12]} refused: {e}", Rejection.WRONG_ARCH) from e
    return CompiledKernel(
        key=reply.key,
        target=str(targets.parse(target)),
        kind=reply.kind,
        binary=reply.binary,
        assembly=reply.assembly,
        metadata=json.loads(reply.metadata_json or "{}"),
        cache_hit=reply.cache_hit,
        worker=reply.worker,
        triton_version=reply.triton_version,
        compile_seconds=reply.compile_seconds,
    )
