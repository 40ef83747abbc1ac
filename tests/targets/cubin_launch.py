"""Runs a Triton cubin the farm returned on this machine's GPU, through the CUDA driver
API alone (libcuda's cuModuleLoadData and cuLaunchKernel): nothing of the local Triton
compiles or caches it, so what runs is the farm's binary. GPU machines only
(tests/targets/test_gpu.py, scripts/gpu_check.sh)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

KERNELS = Path(__file__).resolve().parent / "kernels"


def _check(libcuda: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        libcuda.cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: CUDA error {result} ({(name.value or b'?').decode()})")


def launch_cubin(binary: bytes, metadata: dict[str, Any], grid: int, args: list[torch.Tensor | int]) -> None:
    """Loads `binary` into torch's current CUDA context and launches its kernel on
    `grid` blocks with `args` (tensors as pointers, ints as i32), then waits for it.
    Triton 3.x kernels take two hidden pointers after their own arguments (global and
    profile scratch), passed as null: a kernel that needs scratch is refused."""
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if int(metadata.get(scratch) or 0):
            raise ValueError(f"this launcher gives no scratch memory; the kernel wants {scratch}")
    libcuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.init()
    torch.cuda.current_stream().synchronize()  # the primary context exists and is current
    values: list[ctypes.c_uint64 | ctypes.c_int32] = [
        ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int32(a) for a in args
    ]
    values += [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(libcuda, libcuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(binary)), "cuModuleLoadData")
    try:
        name = str(metadata["name"]).encode()
        _check(libcuda, libcuda.cuModuleGetFunction(ctypes.byref(function), module, name), "cuModuleGetFunction")
        threads = 32 * int(metadata["num_warps"])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(libcuda, libcuda.cuLaunchKernel(
            function, grid, 1, 1, threads, 1, 1, int(metadata.get("shared") or 0), stream, params, None,
        ), "cuLaunchKernel")
        torch.cuda.synchronize()
    finally:
        libcuda.cuModuleUnload(module)


def load_kernel_module(name: str) -> ModuleType:
    """tests/targets/kernels/<name>.py imported here, to compile its kernel with the local Triton."""
    spec = importlib.util.spec_from_file_location(f"farm_test_kernel_{name}", KERNELS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
