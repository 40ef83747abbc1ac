"""A software build, as the farm routes on it: torch (version and git), Triton, Python,
platform and C++ compiler.

Two builds of one torch version can generate different code (torch-facts.md), so a job
must reach a worker of the client's exact build. The build's digest, six hex digits of
a SHA-256, goes into the queue name ("cpu.avx512.b3f9c21", torchfarm/wire/routing.py): short
and bounded for Prometheus labels and KEDA triggers, and stable, since it depends on
nothing but the fields below. Workers register the same fields in their heartbeat
(workers/lifecycle.py); the coordinator computes the digest of each request's build and of
each worker's, and never needs torch to do it.

The target's own fields (device, arch, ISA) are not here: the queue name carries them.

A build holds only what changes an artifact of its target. Triton generates no code of
a CPU or MPS artifact (Inductor's C++ and Metal backends; `cpu_backend` is not an option
a request may set, torchfarm/wire/options.py), so the build of a CPU artifact names no
Triton: a CPU client without Triton, or with another patch release, gets the same key
and the same workers as one with the workers' Triton.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from torchfarm.v1 import farm_pb2
from torchfarm.wire.routing import served_targets

__all__ = [
    "FIELDS", "TRITON_DEVICES", "digest", "is_digest", "names_triton", "label", "of_request", "of_worker",
    "served_builds", "unrun_message", "unserved_message",
]

FIELDS = ("torch_version", "torch_git", "triton_version", "python", "platform", "compiler")
"""What makes a build: `Fingerprint`'s fields less the target's (torchfarm/fx/fingerprint.py)."""

TRITON_DEVICES = frozenset({"cuda", "rocm", "xpu"})
"""Target devices whose artifacts hold Triton kernels: their build names Triton's version."""


def names_triton(device: str) -> bool:
    """Whether the build of an artifact for `device` names the Triton version."""
    return device in TRITON_DEVICES


DIGEST_HEX = 6
"""Hex digits of the digest in queue names: 16.7 million builds before a likely clash
between two in one fleet of a few; a clash would still end BUILD_MISMATCH on the worker."""


def digest(build: Mapping[str, str]) -> str:
    """The build's short digest, "3f9c21": the same on every machine for the same fields."""
    canonical = json.dumps({k: str(build.get(k, "")) for k in FIELDS}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_HEX]


def is_digest(text: str) -> bool:
    """Whether `text` is a digest `digest` could return: DIGEST_HEX lowercase hex digits."""
    return len(text) == DIGEST_HEX and all(c in "0123456789abcdef" for c in text)


def of_request(request: farm_pb2.CompileRequest) -> dict[str, str]:
    """The build a compile request asks for (its compiler travels in the target)."""
    b = request.build
    return {
        "torch_version": b.torch_version, "torch_git": b.torch_git,
        "triton_version": b.triton_version, "python": b.python, "platform": b.platform,
        "compiler": request.target.compiler,
    }


def of_worker(worker: Mapping[str, Any]) -> dict[str, str] | None:
    """The build a worker's heartbeat record registers; None for a worker that registers
    none (one from before builds were routed on)."""
    fingerprint = worker.get("fingerprint")
    if not isinstance(fingerprint, Mapping):
        return None
    return {k: str(fingerprint.get(k, "")) for k in FIELDS}


def label(build: Mapping[str, str]) -> str:
    """A build for people: "torch 2.13.0+cpu (git 1a2b3c4d), triton 3.7.0, py3.11,
    linux-x86_64, gcc 12.2.0 ... [b3f9c21]"."""
    git = str(build.get("torch_git", ""))[:8]
    parts = [f"torch {build.get('torch_version') or '?'}" + (f" (git {git})" if git else "")]
    parts.append(f"triton {build.get('triton_version')}" if build.get("triton_version") else "no triton")
    parts += [f"py{build.get('python') or '?'}", str(build.get("platform") or "?")]
    parts.append(str(build.get("compiler") or "no compiler"))
    return ", ".join(parts) + f" [b{digest(build)}]"


def served_builds(workers: Mapping[str, Mapping[str, Any]], target: str, kind: str) -> dict[str, dict[str, str]]:
    """Digest → build, of the live workers that do `kind` jobs for `target`."""
    found: dict[str, dict[str, str]] = {}
    for w in workers.values():
        build = of_worker(w)
        if build is not None and kind in served_targets(dict(w)).get(target, ()):
            found[digest(build)] = build
    return found


def unserved_message(target: str, wanted: Mapping[str, str], served: Mapping[str, Mapping[str, str]]) -> str:
    """Why a compile for `wanted` cannot be queued: names the build and lists those served."""
    listed = "; ".join(label(b) for _, b in sorted(served.items())) or "none"
    return (
        f"no live worker compiles graphs for target {target} with build {label(wanted)}; "
        f"builds served for {target}: {listed}. Run the client on one of those builds, "
        "or start a worker of this build"
    )


def unrun_message(target: str, wanted: Mapping[str, str], pool: set[str]) -> str:
    """Why a compile for `wanted` is not queued for a pool of `target` that is scaled
    down: names the build and the digests of those the pool runs."""
    listed = ", ".join(f"b{d}" for d in sorted(pool))
    return (
        f"no worker compiles graphs for target {target} with build {label(wanted)}; the "
        f"farm's pool for {target}, none of it live now, runs builds {listed}. Run the "
        "client on one of those builds, or have the farm's operator add this build's workers"
    )
