"""Experimental: lower graphs for a CUDA GPU on a worker that has none.

Off unless TORCHFARM_LOWER_WITHOUT_GPU=1, and only with a CUDA build of torch. What
was found, step by step (torch 2.14.1+cu130, Triton 3.8.0, no GPU and no driver; the
full account is in docs/targets.md, "Lowering for a GPU without one"):

1. Fake tensors on "cuda", AOTAutograd and Inductor's lowering run as they are, until
   `DeviceProperties.create` (torch/_inductor/runtime/hints.py) asks
   `torch.cuda.get_device_properties`, whose `_lazy_init` fails: "Found no NVIDIA
   driver on your system". We answer from a table (or TORCHFARM_GPU_PROPERTIES_FILE).
2. Triton codegen asks `triton.runtime.driver.active` for the target
   (torch/utils/_triton.py `triton_backend`): "0 active drivers". We set a driver
   that names the target and can do nothing else.
3. `standalone_compile` forces `triton.autotune_at_compile_time` on
   (`_standalone_context`), and the autotune block runs the kernels; we turn it off,
   so Inductor keeps every config and the client's GPU picks one at first launch.
   `triton_helpers.set_driver_to_gpu` would reject our driver; it becomes a no-op.
4. Triton then compiles every kernel to a cubin for the target (ptxas from the wheel),
   and `CachingAutotuner._make_launchers` tries to load them onto the device
   (`DeviceGuard` → `torch.cuda._lazy_init`, the same error). We skip making launchers:
   nothing runs here, and the client makes its own when it loads the artifact.

With these four, `standalone_compile(..., aot=True)` returned and `serialize()` gave an
artifact with the cubins bundled (tests/targets/test_gpuless.py). Whether it loads and
runs correctly has not been checked on a GPU: treat its artifacts as unverified until
scripts/gpu_check.sh (or a GPU client) has loaded one. Device properties enter the
generated code (reduction splits use the SM count), so the table must describe the
fleet's GPUs; an artifact for a 132-SM H100 still runs on a 114-SM one, with other
splits than its own lowering would choose.

Every patch is process-wide and irreversible, which is why a worker lowers for at most
one such target and does nothing else (workers/serving.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import types
from typing import Any

from torchfarm.fx.internals import resolve
from torchfarm.wire import targets
from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)

DEVICE_PROPERTIES: dict[str, dict[str, Any]] = {
    "sm_80": {"name": "NVIDIA A100-SXM4-80GB", "multi_processor_count": 108,
              "max_threads_per_multi_processor": 2048, "shared_memory_per_block_optin": 166912,
              "L2_cache_size": 40 * 2**20, "total_memory": 80 * 2**30},
    "sm_86": {"name": "NVIDIA A10", "multi_processor_count": 72,
              "max_threads_per_multi_processor": 1536, "shared_memory_per_block_optin": 101376,
              "L2_cache_size": 6 * 2**20, "total_memory": 24 * 2**30},
    "sm_89": {"name": "NVIDIA L4", "multi_processor_count": 58,
              "max_threads_per_multi_processor": 1536, "shared_memory_per_block_optin": 101376,
              "L2_cache_size": 48 * 2**20, "total_memory": 24 * 2**30},
    "sm_90": {"name": "NVIDIA H100 80GB HBM3", "multi_processor_count": 132,
              "max_threads_per_multi_processor": 2048, "shared_memory_per_block_optin": 232448,
              "L2_cache_size": 50 * 2**20, "total_memory": 80 * 2**30},
}
"""Per-arch properties of one common GPU each (published data sheets); the rest below."""

_COMMON = {
    "regs_per_multiprocessor": 65536, "max_threads_per_block": 1024, "warp_size": 32,
    "shared_memory_per_block": 49152, "gcnArchName": "", "is_integrated": False, "uuid": "",
}


class GpulessError(RuntimeError):
    pass


def device_properties(target: Target, properties_file: str = "") -> types.SimpleNamespace:
    if properties_file:
        with open(properties_file) as f:
            given = json.load(f)
    elif target.arch.rstrip("af") in DEVICE_PROPERTIES:
        given = DEVICE_PROPERTIES[target.arch.rstrip("af")]
    else:
        raise GpulessError(
            f"no built-in device properties for {target}; give TORCHFARM_GPU_PROPERTIES_FILE"
        )
    cap = targets.cuda_capability(target)
    return types.SimpleNamespace(**{**_COMMON, **given, "major": cap // 10, "minor": cap % 10})


@functools.cache
def install(target: Target, properties_file: str = "") -> None:
    """Makes this process lower for `target` as if its GPU were device 0. Irreversible."""
    import torch

    if target.device != "cuda":
        raise GpulessError(f"lowering without a GPU is for CUDA targets, not {target}")
    if not torch.version.cuda:
        raise GpulessError("lowering without a GPU needs a CUDA build of torch")
    if torch.cuda.is_available():
        raise GpulessError("this machine has a GPU; serve its own target instead")
    props = device_properties(target, properties_file)
    cap = (props.major, props.minor)
    _patch_torch_cuda(props, cap)
    _patch_triton_driver(target)
    _patch_inductor()
    log.warning(
        "lowering for %s WITHOUT a GPU (device properties of %r): artifacts are unverified "
        "until a GPU loads one", target, props.name,
    )


def _patch_torch_cuda(props: types.SimpleNamespace, cap: tuple[int, int]) -> None:
    import torch
    device_interface = resolve("device_interface")

    def get_props(device: Any = None) -> Any:  # stands in for torch's _CudaDeviceProperties
        return props

    torch.cuda.get_device_properties = get_props
    torch.cuda.get_device_capability = lambda device=None: cap
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    iface: Any = device_interface.CudaInterface  # its methods are replaced
    iface.get_device_properties = staticmethod(get_props)
    iface.get_compute_capability = staticmethod(lambda device=None: cap[0] * 10 + cap[1])
    iface.current_device = staticmethod(lambda: 0)
    iface.device_count = staticmethod(lambda: 1)
    iface.is_available = staticmethod(lambda: True)
    worker = getattr(iface, "Worker", None)
    if worker is not None:
        worker.get_device_properties = staticmethod(get_props)
        worker.current_device = staticmethod(lambda: 0)


class _TargetOnlyDriver:
    """A Triton driver that names the target and refuses everything else."""

    def __init__(self, target: Target):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", targets.cuda_capability(target), 32)
        self.backend = "cuda"

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cuda", 0)

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    def is_active(self) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def __getattr__(self, name: str) -> Any:
        raise GpulessError(f"no GPU here: Triton asked its driver for {name!r}")


def _patch_triton_driver(target: Target) -> None:
    from triton.runtime import driver

    driver.set_active(_TargetOnlyDriver(target))


def _patch_inductor() -> None:
    triton_helpers, triton_heuristics = resolve("triton_helpers"), resolve("triton_heuristics")
    triton_helpers.set_driver_to_gpu = lambda: None
    triton_heuristics.CachingAutotuner._make_launchers = lambda self: None
    standalone = resolve("standalone_compile_module")
    original = resolve("standalone_context")  # InternalMissing, by name, on torch 2.11

    @contextlib.contextmanager
    def without_autotune(*args: Any, **kwargs: Any):
        with original(*args, **kwargs):
            with resolve("inductor_config").patch("triton.autotune_at_compile_time", False):
                yield

    standalone._standalone_context = without_autotune
