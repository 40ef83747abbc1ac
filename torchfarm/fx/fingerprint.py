"""What this machine builds and loads: the build fingerprint an artifact must match.

Inductor's own caches leave things out that change the generated code (torch-facts.md):
an artifact built under AVX-512 and loaded under `ATEN_CPU_CAPABILITY=avx2` was a cache
hit that returned wrong numbers. So the farm keys artifacts on everything below, and a
client refuses an artifact whose fingerprint is not exactly its own.

`compiler` is more than the version line: Inductor builds every C++ kernel with
`-march=native` unless `TORCHINDUCTOR_CPP_MARCH` says otherwise (torch 2.13,
`cpp_builder._get_cpu_arch_cflags`), so a binary may use any instruction of the CPU that
built it. The flag is part of Inductor's kernel key only as the text "-march=native",
so we resolve it to the CPU model the compiler picks ("znver1", "sapphirerapids") and
put that in the fingerprint. A fleet that wants artifacts to cross CPU models sets
`TORCHINDUCTOR_CPP_MARCH` (e.g. "x86-64-v3") on workers and clients alike.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import platform
import sys
from dataclasses import dataclass

from torchfarm.fx import internals
from torchfarm.wire import builds, targets
from torchfarm.wire.targets import Target, TargetError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Fingerprint:
    torch_version: str
    """`torch.__version__`, e.g. "2.13.0+cpu"."""
    torch_git: str
    """`torch.version.git_version`: two builds of one version can differ."""
    triton_version: str
    """The installed Triton distribution's version on a target whose artifacts hold
    Triton kernels; "" when it is not installed, and on CPU and MPS targets, whose
    artifacts Triton plays no part in (torchfarm/wire/builds.py)."""
    python: str
    """Major.minor of the interpreter, e.g. "3.11"."""
    platform: str
    """`sys.platform` and machine, e.g. "linux-x86_64"."""
    device: str
    """The target's device kind: "cpu", "cuda", "rocm", "mps" or "xpu" (torchfarm/wire/targets.py)."""
    arch: str
    """GPU architecture ("sm_90", "gfx942") or Intel GPU name; "" on cpu and mps."""
    isa: str
    """ATen's CPU vector ISA, lower case ("avx512", "avx2", "default"); the host's, on GPU
    targets too, since a GPU graph may still hold CPU kernels."""
    compiler: str
    """The C++ compiler Inductor would invoke: its version line and resolved -march."""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> Fingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        missing, extra = names - set(data), set(data) - names
        if missing or extra:
            raise ValueError(
                f"fingerprint fields differ: missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        return cls(**{k: str(data[k]) for k in names})


@functools.cache
def local_fingerprint(device: str = "cpu") -> Fingerprint:
    """This process's fingerprint for its own `device` kind ("cpu", "cuda", "rocm", "mps",
    "xpu"; "cuda" on a ROCm build of torch means "rocm"). Cached: ATen reads
    ATEN_CPU_CAPABILITY once at start."""
    return fingerprint_for(local_target(device))


@functools.cache
def fingerprint_for(target: Target) -> Fingerprint:
    """This machine's build (torch, Triton where the target uses it, Python, ISA,
    compiler) with `target`'s device and architecture: what a worker serving `target`
    stamps on its artifacts, and what a client of `target` asks for and accepts."""
    import torch

    return Fingerprint(
        torch_version=torch.__version__,
        torch_git=torch.version.git_version,
        triton_version=_distribution_version("triton") if builds.names_triton(target.device) else "",
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        platform=f"{sys.platform}-{platform.machine()}",
        device=target.device,
        arch=target.arch,
        isa=local_isa(),
        compiler=_compiler_identity(),
    )


def local_isa() -> str:
    """ATen's CPU vector ISA as a target ISA ("avx512", "avx2", "default", "sve256")."""
    import torch

    return targets.normalize_isa(torch.backends.cpu.get_cpu_capability())


def build_fields(fp: Fingerprint) -> dict[str, str]:
    """The fingerprint without device and arch: one worker's build, whatever it serves."""
    return {k: v for k, v in fp.to_dict().items() if k not in ("device", "arch")}


def local_target(device: str | None = None) -> Target:
    """The exact target this machine runs for a device kind (a torch device type works
    too: "cuda" on a ROCm build is "rocm"). None picks the accelerator if there is one,
    else the CPU. Raises TargetError when the machine has no such device."""
    if device is None:
        found = local_targets()
        return found[-1]
    if device == "cpu":
        return targets.make("cpu", local_isa())
    import torch

    if device in ("cuda", "rocm"):
        if not torch.cuda.is_available():
            raise TargetError(f"this machine has no {device} device (torch.cuda.is_available() is False)")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if torch.version.hip:
            return targets.make("rocm", str(props.gcnArchName))
        if device == "rocm":
            raise TargetError("this torch is a CUDA build, not a ROCm one")
        return targets.make("cuda", f"sm_{props.major}{props.minor}")
    if device == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise TargetError("this machine has no mps device")
        return targets.make("mps")
    if device == "xpu":
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            raise TargetError("this machine has no xpu device")
        name = torch.xpu.get_device_properties(torch.xpu.current_device()).name
        return targets.make("xpu", targets.normalize_xpu_name(str(name)))
    raise TargetError(f"unknown device {device!r}; the farm knows {', '.join(targets.DEVICES)}")


def local_targets() -> list[Target]:
    """Every target this machine can run: the CPU first, then its accelerator, if any."""
    import torch

    found = [local_target("cpu")]
    if torch.cuda.is_available():
        found.append(local_target("cuda"))
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        found.append(local_target("xpu"))
    elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        found.append(local_target("mps"))
    return found


def device_kind(example_inputs: object) -> str:
    """The device kind a graph runs on, from its inputs: the first accelerator tensor's
    ("cuda" on a ROCm build is "rocm"), else "cpu"."""
    import torch

    for x in example_inputs if isinstance(example_inputs, (list, tuple)) else ():
        if isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta"):
            kind = x.device.type
            return "rocm" if kind == "cuda" and torch.version.hip else kind
    return "cpu"


def resolve(text: str | Target) -> Target:
    """A user's target: "cuda:sm_90" as given; "cuda" or "cpu" (inexact) as this machine's."""
    target = targets.parse(text) if isinstance(text, str) else text
    return target if target.exact else local_target(target.device)


def _distribution_version(name: str) -> str:
    # Importing triton costs seconds and is not needed to know its version.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _compiler_identity() -> str:
    """`<version line>; -march=<flag> (<resolved>)`, or "" when Inductor finds no compiler."""
    # cpp_builder.get_cpp_compiler() is what CppBuilder invokes for every kernel;
    # internals.cpu_arch_cflags is where its -march flag comes from.
    from torchfarm.fx import toolchain

    cpp_builder = internals.resolve("cpp_builder")
    toolchain.seed_inductor()  # so that a machine's second process asks the compiler nothing
    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as e:  # InvalidCxxCompiler: such a client can load no C++ kernel
        log.warning("no C++ compiler for Inductor: %s", e)
        return ""
    version = _run([compiler, "--version"]).splitlines()
    identity = version[0].strip() if version else compiler
    arch_flags = internals.cpu_arch_cflags(compiler)
    for flag in arch_flags:
        resolved = _resolve_native(compiler, flag) if flag.endswith("=native") else ""
        identity += f"; -{flag}" + (f" ({resolved})" if resolved else "")
    return identity


def _resolve_native(compiler: str, flag: str) -> str:
    """What `-march=native` means on this CPU, as the compiler resolves it (gcc and clang
    both accept `-Q --help=target` only in gcc; clang yields "")."""
    option = flag.split("=", 1)[0]  # "march" or "mcpu"
    for line in _run([compiler, f"-{flag}", "-Q", "--help=target"]).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == f"-{option}=":
            return parts[1]
    return ""


def _run(cmd: list[str]) -> str:
    # Answered from this machine's toolchain record once it has been asked (torchfarm/fx/toolchain.py).
    from torchfarm.fx import toolchain

    return toolchain.record().run(cmd)[1]
