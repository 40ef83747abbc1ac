"""A GPU worker's warm-up: the GPU path, in the process that will use it.

What a GPU job would otherwise pay first, and what fails there if the GPU path is
broken: a CUDA (or HIP) context, Triton's driver and its launcher stub (a small C
module Triton builds and loads once per cache dir), and one Triton compile and launch.
The kernel's answer is checked, so a warm-up that returns proves the path runs.

Only call this in a process that will not fork afterwards (a pool process, the device
probe's child: workers/gpu_probe.py), never in a worker's main process or a sandbox
forkserver: CUDA started there breaks every child they fork.
"""

from __future__ import annotations

import logging
import time

import torch
import triton
import triton.language as tl

from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)

GPU_KINDS = ("cuda", "rocm")
"""Device kinds whose path this warms: both run torch.cuda and Triton."""


@triton.jit
def _add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803  (Triton's constexpr style)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)


def warm_gpu(target: Target) -> dict[str, float]:
    """Starts the device's context, compiles and runs one Triton kernel on it, checks
    its answer; returns the seconds each step took. Raises if any step fails."""
    if target.device not in GPU_KINDS:
        raise RuntimeError(f"no GPU path to warm for {target}")
    t0 = time.perf_counter()
    torch.cuda.init()
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    out = torch.empty_like(x)
    _add_one[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    if not torch.equal(out, x + 1):
        raise RuntimeError("the warm-up's Triton kernel gave a wrong answer")
    seconds = {"context": t1 - t0, "triton_first_launch": t2 - t1}
    log.info("warmed the GPU path for %s: context %.2fs, first Triton kernel %.2fs",
             target, seconds["context"], seconds["triton_first_launch"])
    return seconds
