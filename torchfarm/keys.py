"""The farm's cache key: one digest over everything that decides what an artifact is.

The key covers the graph (ops, arguments and the input metadata on its placeholders),
the torch and Triton builds, the target (device kind, GPU arch or CPU ISA, compiler)
and the compile options. Inductor's own cache key leaves the CPU ISA out, and an
artifact built for AVX-512 then loads under AVX2 and returns wrong numbers
(shared/notes/torch-facts.md), so every one of these fields is in.

The request's `label` is free text for logs and is deliberately not part of the key.
"""

from __future__ import annotations

import hashlib
import json

from torchfarm.v1 import farm_pb2, graph_pb2

KEY_VERSION = "torchfarm.key/1"
"""Changes whenever the key's inputs change, so old and new keys never collide."""


def graph_digest(graph: graph_pb2.Graph) -> str:
    """A digest of the graph's deterministic protobuf encoding."""
    return "sha256:" + hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def _canonical(request: farm_pb2.CompileRequest) -> dict:
    target, build, options = request.target, request.build, request.options
    return {
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


def compute_key(request: farm_pb2.CompileRequest) -> str:
    """The hex SHA-256 that names the request's artifact in the cache."""
    body = json.dumps(
        {"version": KEY_VERSION, **_canonical(request)}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(body.encode()).hexdigest()


def short(key: str) -> str:
    """The first 12 hex digits, for log lines."""
    return key[:12]
