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
import os
import platform
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

_COMPILER_PROBE_TIMEOUT_S = 30.0
"""Upper bound for one `c++ --version` / `-Q --help=target` probe."""


@dataclass(frozen=True)
class Fingerprint:
    torch_version: str
    """`torch.__version__`, e.g. "2.13.0+cpu"."""
    torch_git: str
    """`torch.version.git_version`: two builds of one version can differ."""
    triton_version: str
    """The installed Triton distribution's version; "" when it is not installed."""
    python: str
    """Major.minor of the interpreter, e.g. "3.11"."""
    platform: str
    """`sys.platform` and machine, e.g. "linux-x86_64"."""
    device: str
    """"cpu", "cuda", ..."""
    arch: str
    """GPU architecture ("sm_90"); "" on cpu."""
    isa: str
    """ATen's CPU vector ISA, lower case ("avx512", "avx2", "default")."""
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
    """This process's fingerprint. Cached: ATen reads ATEN_CPU_CAPABILITY once at start."""
    import torch

    return Fingerprint(
        torch_version=torch.__version__,
        torch_git=torch.version.git_version,
        triton_version=_distribution_version("triton"),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        platform=f"{sys.platform}-{platform.machine()}",
        device=device,
        arch=_device_arch(device),
        isa=torch.backends.cpu.get_cpu_capability().lower(),
        compiler=_compiler_identity(),
    )


def _distribution_version(name: str) -> str:
    # Importing triton costs seconds and is not needed to know its version.
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _device_arch(device: str) -> str:
    if device == "cpu":
        return ""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if torch.version.hip:
            return str(props.gcnArchName).split(":")[0]
        return f"sm_{props.major}{props.minor}"
    return ""


def _compiler_identity() -> str:
    """`<version line>; -march=<flag> (<resolved>)`, or "" when Inductor finds no compiler."""
    # torch 2.13: cpp_builder.get_cpp_compiler() is what CppBuilder invokes for every
    # kernel; _get_cpu_arch_cflags() is where its -march flag comes from.
    from torch._inductor import cpp_builder

    try:
        compiler = cpp_builder.get_cpp_compiler()
    except Exception as e:  # InvalidCxxCompiler: such a client can load no C++ kernel
        log.warning("no C++ compiler for Inductor: %s", e)
        return ""
    version = _run([compiler, "--version"]).splitlines()
    identity = version[0].strip() if version else compiler
    arch_flags = cpp_builder._get_cpu_arch_cflags(compiler)
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
    env = {**os.environ, "LC_ALL": "C"}
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=_COMPILER_PROBE_TIMEOUT_S
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
