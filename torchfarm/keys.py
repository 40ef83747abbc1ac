"""The farm's cache key: one digest over everything that decides what an artifact is.

The key covers the graph (ops, arguments and the input metadata on its placeholders),
the torch and Triton builds, the target (device kind, GPU arch or CPU ISA, compiler)
and the compile options. Inductor's own cache key leaves the CPU ISA out, and an
artifact built for AVX-512 then loads under AVX2 and returns wrong numbers
(shared/notes/torch-facts.md), so every one of these fields is in.

The tenant's cache namespace is in the key too, so two tenants never share a key, and
hence an artifact, unless the operator gives them one namespace (torchfarm/tokens.py).

The request's `label` is free text for logs and is deliberately not part of the key.
"""

from __future__ import annotations

import hashlib
import json

from torchfarm.v1 import farm_pb2, graph_pb2

KEY_VERSION = "torchfarm.key/2"
"""Changes whenever the key's inputs change, so old and new keys never collide."""


def graph_digest(graph: graph_pb2.Graph) -> str:
    """A digest of the graph's deterministic protobuf encoding."""
    return "sha256:" + hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def _canonical(request: farm_pb2.CompileRequest, namespace: str) -> dict:
    target, build, options = request.target, request.build, request.options
    return {
        "namespace": namespace,
        "graph": graph_digest(request.graph),
        "target": {
            "device": target.device,
            "arch": target.arch,
            "isa": target.isa,
            "compiler": target.compiler,
        },
        "build": {
            "torch_version": build.torch_version,
            "torch_git": build.torch_git,
            "triton_version": build.triton_version,
            "python": build.python,
            "platform": build.platform,
        },
        "options": {
            "mode": options.mode,
            "dynamic": options.dynamic,
            "inductor": sorted((o.name, o.json_value) for o in options.inductor),
        },
    }


def compute_key(request: farm_pb2.CompileRequest, namespace: str = "") -> str:
    """The hex SHA-256 that names the request's artifact in `namespace` of the cache."""
    body = json.dumps(
        {"version": KEY_VERSION, **_canonical(request, namespace)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()


def short(key: str) -> str:
    """The first 12 hex digits, for log lines."""
    return key[:12]


KERNEL_KEY_VERSION = "torchfarm.kernel/1"
"""Changes whenever the kernel key's inputs change."""


def compute_kernel_key(request: farm_pb2.KernelRequest, namespace: str = "") -> str:
    """The hex SHA-256 that names a compiled Triton kernel in `namespace` of the cache.

    It covers the tenant's namespace (as `compute_key`), the source text, the function's name, the signature (in order), the
    constexpr values (canonical JSON), the target, the compile options and the Triton
    version: everything that decides the binary. The label is not part of it.
    """
    body = {
        "version": KERNEL_KEY_VERSION,
        "namespace": namespace,
        "source": "sha256:" + hashlib.sha256(request.source.encode()).hexdigest(),
        "name": request.name,
        "signature": [[a.name, a.type] for a in request.signature],
        "constexprs": sorted(
            (o.name, json.dumps(json.loads(o.json_value), sort_keys=True))
            for o in request.constexprs
        ),
        "target": {"device": request.target.device, "arch": request.target.arch},
        "options": {
            "num_warps": request.options.num_warps,
            "num_stages": request.options.num_stages,
        },
        "triton_version": request.triton_version,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
