"""Reads the target architecture out of a GPU kernel binary's ELF header.

A cubin is an ELF file with `e_machine` EM_CUDA (190) and the SM version in `e_flags`;
an hsaco is an ELF file with EM_AMDGPU (224) and the gfx processor in `e_flags`
(`EF_AMDGPU_MACH`). Workers check every kernel they produce against the target it was
asked for before it enters the cache, and clients check again before they write it,
so a binary for the wrong architecture is refused rather than loaded.

Sources: CUDA's elf.h as LLVM mirrors it (`EF_CUDA_SM` in llvm/BinaryFormat/ELF.h:
the SM is the low byte for ELF ABI version < 8, bits 8-15 from ABI version 8 on) and
LLVM's AMDGPUUsage ("ELF header", EF_AMDGPU_MACH_* values).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EM_CUDA = 190
"""ELF e_machine of an NVIDIA cubin."""

EM_AMDGPU = 224
"""ELF e_machine of an AMD GPU code object (hsaco)."""

AMDGPU_MACH = {
    0x02C: "gfx900", 0x02F: "gfx906", 0x030: "gfx908", 0x031: "gfx909", 0x033: "gfx1010",
    0x035: "gfx1012", 0x036: "gfx1030", 0x03F: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100",
    0x044: "gfx1101", 0x045: "gfx1102", 0x046: "gfx1103", 0x048: "gfx1200", 0x04B: "gfx941",
    0x04C: "gfx942", 0x04E: "gfx1201", 0x04F: "gfx950",
}
"""EF_AMDGPU_MACH_AMDGCN_* (the low byte of e_flags) → gfx processor name."""

_EF_AMDGPU_MACH_MASK = 0x0FF


class NotAKernel(ValueError):
    """The bytes are not a GPU ELF object this module knows."""


@dataclass(frozen=True)
class KernelBinaryInfo:
    machine: int
    """e_machine: EM_CUDA or EM_AMDGPU."""
    kind: str
    """"cubin" or "hsaco"."""
    arch: str
    """"sm_90", "gfx942"; for an AMD processor missing from AMDGPU_MACH, "mach:0x.."."""
    flags: int
    """The raw e_flags."""


def inspect_binary(data: bytes) -> KernelBinaryInfo:
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise NotAKernel("not an ELF file")
    ei_class, ei_data, abi_version = data[4], data[5], data[8]
    if ei_data != 1:
        raise NotAKernel("not a little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    if ei_class == 2:  # ELF64: e_flags after e_entry, e_phoff, e_shoff (8 bytes each)
        if len(data) < 64:
            raise NotAKernel("truncated ELF64 header")
        (flags,) = struct.unpack_from("<I", data, 48)
    elif ei_class == 1:
        (flags,) = struct.unpack_from("<I", data, 36)
    else:
        raise NotAKernel(f"unknown ELF class {ei_class}")
    if machine == EM_CUDA:
        sm = (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
        return KernelBinaryInfo(machine, "cubin", f"sm_{sm}", flags)
    if machine == EM_AMDGPU:
        mach = flags & _EF_AMDGPU_MACH_MASK
        return KernelBinaryInfo(machine, "hsaco", AMDGPU_MACH.get(mach, f"mach:0x{mach:03x}"), flags)
    raise NotAKernel(f"ELF machine {machine} is neither CUDA ({EM_CUDA}) nor AMDGPU ({EM_AMDGPU})")


def check_binary(data: bytes, device: str, arch: str) -> KernelBinaryInfo:
    """The binary's header info if it is code for `device`/`arch`; NotAKernel otherwise.

    "sm_90a" is checked as sm_90: the "a" (arch-specific features) is not in e_flags.
    """
    info = inspect_binary(data)
    want_kind = {"cuda": "cubin", "rocm": "hsaco"}.get(device)
    want_arch = arch.rstrip("af") if device == "cuda" else arch
    if info.kind != want_kind or info.arch != want_arch:
        raise NotAKernel(f"binary is a {info.kind} for {info.arch}, not code for {device}:{arch}")
    return info
