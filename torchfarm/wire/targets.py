"""The device target: what a compile or a kernel must run on, as one small value.

Shared by the SDK, the coordinator and the workers, and free of torch and Triton, so
the coordinator can validate and route from the request alone.

Text form (what users type, what errors and `torchfarm status` print):

    cpu:avx512      CPU, with ATen's vector ISA ("avx512", "avx2", "default", "sve256", ...)
    cuda:sm_90      NVIDIA GPU, by compute capability ("sm_80", "sm_90a", "sm_120")
    rocm:gfx942     AMD GPU, by gcnArchName without its feature suffix ("gfx90a", "gfx1100")
    mps             Apple GPU (Metal); one kind, no architecture
    xpu:<name>      Intel GPU, by a normalized device name ("intel-data-center-gpu-max-1550")

A target without its detail ("cpu", "cuda") is *inexact*: it names a device kind and
means "this machine's" when a worker or the SDK resolves it locally
(`torchfarm.fx.fingerprint.local_target`). A compile or kernel request must carry an exact target,
since the generated code differs per ISA and per architecture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # protobuf stays optional for what imports only this module
    from torchfarm.v1 import farm_pb2

DEVICES = ("cpu", "cuda", "rocm", "mps", "xpu")
"""Device kinds the farm knows. Anything else is rejected as INVALID_ARGUMENT."""

TORCH_DEVICE_TYPE = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "mps": "mps", "xpu": "xpu"}
"""The torch device type a target's tensors live on: ROCm builds of torch call theirs "cuda"."""

KERNEL_DEVICES = ("cuda", "rocm")
"""Device kinds Triton compiles kernels for without the device present (explicit GPUTarget)."""

_DETAIL = {
    "cpu": re.compile(r"[a-z][a-z0-9_]{0,31}"),
    "cuda": re.compile(r"sm_[1-9][0-9]{1,2}[af]?"),
    "rocm": re.compile(r"gfx[0-9]{1,2}[0-9a-f]{2}"),
    "xpu": re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}"),
}
"""What the part after the colon may look like, per device kind; mps takes none."""

_DETAIL_NAME = {"cpu": "ISA", "cuda": "sm_XY architecture", "rocm": "gfx architecture", "xpu": "device name"}


class TargetError(ValueError):
    """A target string or message that names no valid target."""


@dataclass(frozen=True, order=True)
class Target:
    device: str
    """"cpu", "cuda", "rocm", "mps" or "xpu"."""
    arch: str = ""
    """GPU architecture ("sm_90", "gfx942") or Intel GPU name; "" on cpu and mps."""
    isa: str = ""
    """CPU vector ISA, for cpu targets only; "" otherwise."""

    @property
    def detail(self) -> str:
        return self.isa if self.device == "cpu" else self.arch

    @property
    def exact(self) -> bool:
        """True when the target names one code generation target (mps has no detail)."""
        return self.device == "mps" or bool(self.detail)

    @property
    def torch_device(self) -> str:
        return TORCH_DEVICE_TYPE[self.device]

    def __str__(self) -> str:
        return f"{self.device}:{self.detail}" if self.detail else self.device


def normalize_isa(raw: str) -> str:
    """ATen's `get_cpu_capability()` as a target ISA: lower case, no spaces ("Z VECTOR")."""
    return raw.lower().replace(" ", "")


def normalize_xpu_name(raw: str) -> str:
    """An Intel GPU's `get_device_properties().name` as a target name."""
    name = re.sub(r"[^a-z0-9_.]+", "-", raw.lower()).strip("-")
    return name[:64] or "unknown"


def make(device: str, detail: str = "") -> Target:
    """A validated target from its device kind and detail (ISA, arch or name)."""
    if device not in DEVICES:
        raise TargetError(f"unknown device {device!r}; the farm knows {', '.join(DEVICES)}")
    if device == "rocm":
        detail = detail.split(":", 1)[0]  # "gfx90a:sramecc+:xnack-" → "gfx90a"
    if detail:
        if device == "mps":
            raise TargetError(f"target 'mps:{detail}': mps takes no architecture")
        if not _DETAIL[device].fullmatch(detail):
            raise TargetError(
                f"target '{device}:{detail}': {detail!r} is not a valid {_DETAIL_NAME[device]}"
            )
    if device == "cpu":
        return Target("cpu", isa=detail)
    return Target(device, arch=detail)


def parse(text: str) -> Target:
    """"cuda:sm_90" → Target("cuda", arch="sm_90"). Raises TargetError."""
    text = text.strip()
    device, _, detail = text.partition(":")
    return make(device.lower(), detail if device.lower() == "xpu" else detail.lower())


def require_exact(target: Target, what: str = "a compile") -> Target:
    if not target.exact:
        raise TargetError(
            f"target {str(target)!r} is not exact: {what} needs the {_DETAIL_NAME[target.device]}"
            f" (e.g. {_EXAMPLE[target.device]})"
        )
    return target


_EXAMPLE = {"cpu": "cpu:avx512", "cuda": "cuda:sm_90", "rocm": "rocm:gfx942", "xpu": "xpu:<name>"}


def from_proto(msg: farm_pb2.Target) -> Target:
    """A `torchfarm.v1.Target` message → Target (compiler is the build's, not the target's)."""
    return make(msg.device, msg.isa if msg.device == "cpu" else msg.arch)


def cuda_capability(target: Target) -> int:
    """"sm_90a" → 90: the arch number Triton's GPUTarget takes."""
    if target.device != "cuda" or not target.arch:
        raise TargetError(f"{target} is not a CUDA architecture")
    return int(target.arch[3:].rstrip("af"))


def warp_size(target: Target) -> int:
    """Threads per warp (wavefront): 64 on CDNA (gfx9xx), 32 on RDNA and on NVIDIA."""
    if target.device == "rocm":
        return 64 if target.arch.startswith("gfx9") else 32
    return 32
