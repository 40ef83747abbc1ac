"""What the compile sandbox applies for each device kind: the memory rlimit, and the
device nodes bubblewrap binds in.

A CUDA context reserves far more virtual address space than it uses. Seen on an idle
141 GB H200: under the sandbox's RLIMIT_AS of 4 GiB, CUDA's start failed with "CUDA
error: out of memory". The reservation is a PROT_NONE mapping, which RLIMIT_DATA does
not count (Linux counts only private writable mappings), while every heap allocation
and private writable mapping of a compile (Python objects, sympy, the compiler's own)
still does. So a GPU kind's memory is bounded by RLIMIT_DATA instead: the same number,
counted against what a runaway compile actually grows. tests/unit/test_sandbox_limits.py
shows both halves on a CPU (a 64 GiB PROT_NONE reservation passes RLIMIT_DATA and fails
RLIMIT_AS; a 2 GiB allocation fails both); scripts/gpu_check.sh starts CUDA and runs a
Triton kernel under the GPU policy on a real GPU. RLIMIT_AS stays for the CPU, where
it also bounds shared and read-only mappings.

bubblewrap's `--dev /dev` is a minimal /dev without the GPU's nodes: a GPU kind binds
the NVIDIA (`/dev/nvidia*`, `/dev/nvidia-caps`), AMD (`/dev/kfd`) and DRM (`/dev/dri`)
nodes that exist, read-write (`--dev-bind`), as CUDA and HIP open them read-write.
"""

from __future__ import annotations

import glob
import resource
from dataclasses import dataclass

GPU_KINDS = ("cuda", "rocm", "xpu")
"""Device kinds whose runtime reserves address space and opens device nodes."""

_GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/kfd", "/dev/dri")


@dataclass(frozen=True)
class LimitPolicy:
    device: str
    """The device kind compiles run for: "cpu", "cuda", "rocm", "xpu", "mps"."""
    memory_rlimit: str
    """The rlimit that bounds a sandboxed process's memory: "as" (RLIMIT_AS, the whole
    address space) or "data" (RLIMIT_DATA: heap and private writable mappings)."""
    device_nodes: tuple[str, ...]
    """Glob patterns of the device nodes bound into a bubblewrap sandbox."""

    def nodes(self) -> tuple[str, ...]:
        """The device nodes that exist here, in a stable order."""
        found = (p for pattern in self.device_nodes for p in sorted(glob.glob(pattern)))
        return tuple(dict.fromkeys(found))


def policy_for(device: str) -> LimitPolicy:
    """The policy of a sandbox whose compiles run for `device` kind."""
    if device in GPU_KINDS:
        return LimitPolicy(device, "data", _GPU_NODES)
    return LimitPolicy(device, "as", ())


def memory_rlimit(kind: str) -> int:
    """The `resource` constant a policy's `memory_rlimit` ("as" or "data") names."""
    return resource.RLIMIT_DATA if kind == "data" else resource.RLIMIT_AS
