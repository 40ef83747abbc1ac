"""Inductor's CPU vector-ISA probe, carried in the manifest instead of run on every client.

Every C++ kernel's key and command line hold the chosen ISA's flags, so the first kernel
a process keys calls `pick_vec_isa()`, whose `valid_vec_isa_list()` proves each ISA the
CPU reports by building a test program per ISA and sub-feature (AVX-512 bf16 and VNNI,
AMX tile and fp16) and dlopen'ing it: six builds on an AVX-512 machine with an empty
cache dir (docs/measurements.md). Even `config.cpp.vec_isa_ok=True` keeps the sub-feature builds.

The worker that built the artifact ran that probe. `probe_record()` writes down what it
concluded, per ISA: valid, bf16, amx_fp16; and the ISA it picked with its flags. The
client (`seed`) runs Inductor's own probe code, which checks its own CPU's features
(`torch.cpu._is_avx512_supported` and the rest, read from CPUID, no build), while
`VecISA.check_build`, the one step that starts a compiler, is answered from the record.
Inductor's caches then hold the worker's answers for what this CPU has. If the ISA this
process then picks, or its flags, differ from the worker's, the artifact is refused: its
kernels were built for another ISA (the fingerprint's ISA check stays as it was).

Torch internals relied on (torch 2.13.0, pinned in tests/unit/test_vecisa.py):
`cpu_vec_isa.valid_vec_isa_list` (`functools.cache`), `pick_vec_isa`,
`supported_vec_isa_list`, `invalid_vec_isa`, `VecISA.check_build(self, code)`, the probe
sources `VecISA._avx_code`, `VecAVX512._avx512_bf16_code`,
`VecAVX512VNNI._avx512_vnni_code`, `VecAMX._amx_code`, `VecAMX._amx_fp16_code`, and
the instance flags `_is_avx512_bf16_supported`, `_is_amx_fp16_supported`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from torchfarm.fx.internals import resolve

log = logging.getLogger(__name__)


class ToolchainMismatch(ValueError):
    """The worker's vector-ISA record does not fit this machine, or is malformed."""

PROBE_FORMAT = "torchfarm.vec-isa/1"
"""Schema of the manifest's `toolchain["vec_isa"]` record."""

_lock = threading.Lock()


def probe_record() -> dict[str, Any]:
    """What this process's Inductor concluded about the CPU's vector ISAs (running the
    probe if it has not yet): the record a worker puts in its manifests."""
    v = resolve("cpu_vec_isa")

    valid = v.valid_vec_isa_list()
    picked = v.pick_vec_isa()
    isas = {
        str(isa): {
            "valid": any(isa is ok for ok in valid),
            "bf16": bool(getattr(isa, "_is_avx512_bf16_supported", False)),
            "amx_fp16": bool(getattr(isa, "_is_amx_fp16_supported", False)),
        }
        for isa in v.supported_vec_isa_list
    }
    return {
        "format": PROBE_FORMAT,
        "isas": isas,
        "picked": str(picked),
        "arch_flags": "" if picked is v.invalid_vec_isa else picked.build_arch_flags(),
    }


def known_record() -> dict[str, Any]:
    """`probe_record()` if this process has run the probe, else {} (it runs none)."""
    v = resolve("cpu_vec_isa")

    return probe_record() if v.valid_vec_isa_list.cache_info().currsize else {}


def picked() -> tuple[str, str]:
    """(ISA, its compiler flags) this process's Inductor builds kernels with."""
    v = resolve("cpu_vec_isa")

    isa = v.pick_vec_isa()
    return str(isa), "" if isa is v.invalid_vec_isa else isa.build_arch_flags()


def seed(record: dict[str, Any]) -> None:
    """Fills Inductor's ISA probe caches from a worker's record without building anything,
    then refuses the artifact unless this process picks the worker's ISA and flags."""
    v = resolve("cpu_vec_isa")

    if not isinstance(record, dict) or record.get("format") != PROBE_FORMAT:
        raise ToolchainMismatch(f"unknown vector-ISA record {str(record)[:80]!r}")
    isas = record.get("isas")
    if not isinstance(isas, dict):
        raise ToolchainMismatch("malformed vector-ISA record")
    with _lock:
        if v.valid_vec_isa_list.cache_info().currsize == 0:
            real = v.VecISA.check_build
            v.VecISA.check_build = _replay(isas, real)
            try:
                v.valid_vec_isa_list()
            finally:
                v.VecISA.check_build = real
    mine = picked()
    theirs = (str(record.get("picked")), str(record.get("arch_flags")))
    if mine != theirs:
        raise ToolchainMismatch(
            f"its kernels were built for vector ISA {theirs[0]!r} ({theirs[1]}); this "
            f"machine's Inductor picks {mine[0]!r} ({mine[1]})"
        )


def _replay(isas: dict[str, Any], real: Callable[..., bool]) -> Callable[..., bool]:
    v = resolve("cpu_vec_isa")

    answers = {
        v.VecISA._avx_code: "valid",
        v.VecAVX512VNNI._avx512_vnni_code: "valid",
        v.VecAMX._amx_code: "valid",
        v.VecAVX512._avx512_bf16_code: "bf16",
        v.VecAMX._amx_fp16_code: "amx_fp16",
    }

    def check_build(self: Any, code: str) -> bool:
        entry, field = isas.get(str(self)), answers.get(code)
        if not isinstance(entry, dict) or field is None:
            log.debug("vector-ISA probe of %s not in the artifact's record; building it", self)
            return bool(real(self, code))
        return bool(entry.get(field, False))

    return check_build


def probed_toolchain() -> dict[str, Any]:
    """The manifest's `toolchain` field: what a worker's Inductor probed."""
    return {"vec_isa": probe_record()}
