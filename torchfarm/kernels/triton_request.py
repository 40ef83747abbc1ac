"""Builds and checks Triton kernel requests; free of torch, used by the SDK
(`sdk.compile_kernel`, which the CLI's `torchfarm kernel compile` calls). Replies are
checked by torchfarm/kernels/kernel_artifact.py.

Errors are `ValueError`s: `targets.TargetError`, `triton_check.KernelRejected`, or
`KernelRequestError` for a malformed signature; the SDK maps them to its own classes.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

from torchfarm.kernels import triton_check
from torchfarm.v1 import farm_pb2
from torchfarm.wire import targets
from torchfarm.wire.labels import clip_label


class KernelRequestError(ValueError):
    """The caller's arguments do not describe the kernel (signature, target kind)."""


def parse_signature(
    text: str | list[str] | dict[str, str], params: tuple[str, ...]
) -> list[tuple[str, str]]:
    """"*fp32,i32,constexpr" (positional), "x=*fp32,n=i32", a list or a dict →
    (name, type) pairs in parameter order."""
    if isinstance(text, dict):
        items = [(str(n), str(t)) for n, t in text.items()]
    else:
        parts = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
        if parts and all("=" in p for p in parts):
            items = [(n.strip(), t.strip()) for n, t in (p.split("=", 1) for p in parts)]
        elif any("=" in p for p in parts):
            raise KernelRequestError("give the signature either positionally or as name=type, not both")
        else:
            if len(parts) != len(params):
                raise KernelRequestError(
                    f"the signature has {len(parts)} types for {len(params)} parameters {list(params)}"
                )
            items = list(zip(params, parts, strict=True))
    by_name = dict(items)
    if set(by_name) != set(params) or len(by_name) != len(items):
        raise KernelRequestError(
            f"signature names {[n for n, _ in items]} do not match the parameters {list(params)}"
        )
    return [(p, by_name[p]) for p in params]


def local_triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return ""


def build_kernel_request(
    source: str,
    name: str,
    *,
    target: str,
    signature: str | list[str] | dict[str, str],
    constexprs: dict[str, Any] | None = None,
    num_warps: int = 0,
    num_stages: int = 0,
    triton_version: str | None = None,
    label: str = "",
) -> farm_pb2.KernelRequest:
    """The KernelRequest, checked as the farm will check it.

    `triton_version=None` asks for the locally installed Triton (the binary must match
    the runtime that will launch it); "" takes whatever the farm's workers run.
    """
    tgt = targets.require_exact(targets.parse(target), "a kernel compile")
    if tgt.device not in targets.KERNEL_DEVICES:
        raise KernelRequestError(
            f"kernels compile for {', '.join(targets.KERNEL_DEVICES)} targets, not {tgt}"
        )
    checked = triton_check.check_kernel_source(source, name)
    pairs = parse_signature(signature, checked.params)
    request = farm_pb2.KernelRequest(
        source=source,
        name=name,
        signature=[farm_pb2.KernelArg(name=n, type=t) for n, t in pairs],
        constexprs=[
            farm_pb2.Option(name=k, json_value=json.dumps(v))
            for k, v in sorted((constexprs or {}).items())
        ],
        target=farm_pb2.Target(device=tgt.device, arch=tgt.arch),
        options=farm_pb2.KernelOptions(num_warps=num_warps, num_stages=num_stages),
        triton_version=local_triton_version() if triton_version is None else triton_version,
        label=clip_label(label),
    )
    triton_check.check_signature(request, checked)
    triton_check.check_options(request.options)
    return request
