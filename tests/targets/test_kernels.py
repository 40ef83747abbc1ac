"""Triton kernels compiled on this CPU-only machine for GPUs, and the checks that keep the
client's source from running: torchfarm/kernels/triton_check.py (static, also on the coordinator)
and workers/triton_compile.py (name resolution against the installed Triton, then the compile).
"""

from __future__ import annotations

import struct
import types
from pathlib import Path

import pytest

from torchfarm.kernels import elf, triton_check, triton_request
from torchfarm.kernels.triton_check import KernelRejected
from torchfarm.wire import keys, targets
from workers.triton_compile import compile_kernel

SOURCE = (Path(__file__).parent / "kernels" / "add_kernel.py").read_text()
SIGNATURE = "*fp32,*fp32,*fp32,i32,constexpr"


def request(source: str = SOURCE, target: str = "cuda:sm_90", **kw):
    return triton_request.build_kernel_request(
        source, "add_kernel", target=target, signature=kw.pop("signature", SIGNATURE),
        constexprs=kw.pop("constexprs", {"BLOCK": 256}), **kw,
    )


def elf_header(binary: bytes) -> tuple[int, int, int]:
    """(e_machine, e_flags, EI_ABIVERSION) of an ELF64 little-endian file."""
    assert binary[:4] == b"\x7fELF" and binary[4] == 2 and binary[5] == 1
    (machine,) = struct.unpack_from("<H", binary, 18)
    (flags,) = struct.unpack_from("<I", binary, 48)
    return machine, flags, binary[8]


@pytest.mark.parametrize("arch", [90, 80])
def test_cpu_only_machine_makes_a_cubin_for_the_sm_arch(arch):
    r = compile_kernel(request(target=f"cuda:sm_{arch}"), targets.parse(f"cuda:sm_{arch}"))
    machine, flags, abi = elf_header(r.binary)
    assert machine == elf.EM_CUDA == 190
    assert (flags & 0xFF if abi < 8 else (flags >> 8) & 0xFF) == arch  # EF_CUDA_SM
    assert r.kind == "cubin" and f".target sm_{arch}" in r.assembly
    assert r.metadata["name"] == "add_kernel" and r.metadata["target"]["arch"] == arch


def test_cpu_only_machine_makes_an_hsaco_for_gfx942():
    r = compile_kernel(request(target="rocm:gfx942"), targets.parse("rocm:gfx942"))
    machine, flags, _ = elf_header(r.binary)
    assert machine == elf.EM_AMDGPU == 224
    assert flags & 0xFF == 0x04C  # EF_AMDGPU_MACH_AMDGCN_GFX942
    assert r.kind == "hsaco" and "gfx942" in r.assembly
    assert r.metadata["target"] == {"backend": "hip", "arch": "gfx942", "warp_size": 64}


def test_elf_check_refuses_the_wrong_arch():
    cubin = compile_kernel(request(target="cuda:sm_80"), targets.parse("cuda:sm_80")).binary
    assert elf.check_binary(cubin, "cuda", "sm_80").arch == "sm_80"
    with pytest.raises(elf.NotAKernel, match="cubin for sm_80, not code for cuda:sm_90"):
        elf.check_binary(cubin, "cuda", "sm_90")
    with pytest.raises(elf.NotAKernel, match="not code for rocm:gfx942"):
        elf.check_binary(cubin, "rocm", "gfx942")
    with pytest.raises(elf.NotAKernel, match="not an ELF"):
        elf.inspect_binary(b"#!/bin/sh\n" * 10)


ESCAPES = {
    # Each is valid Triton and, compiled by Triton as is, would run Python on the worker:
    # the frontend calls any callable it reaches at compile time.
    "getattr builtin": "    pid = getattr(tl, 'core')\n",
    "exec": "    pid = exec('import os')\n",
    "dunder": "    pid = tl.__dict__\n",
    "private": "    pid = tl.core._unwrap_if_constexpr(1)\n",
    "lambda": "    pid = (lambda: 1)()\n",
    "format traversal": "    pid = '{0.__class__}'.format(n)\n",
    "call a local": "    f = tl.program_id\n    pid = f(0)\n",
    "huge power": "    pid = 2 ** 10 ** 10\n",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escapes_are_refused_before_anything_runs(name):
    src = SOURCE.replace("    pid = tl.program_id(0)\n", ESCAPES[name])
    with pytest.raises(KernelRejected):
        triton_check.check_kernel_source(src, "add_kernel")


@pytest.mark.parametrize(
    "header, message",
    [
        ("import os\n", "import of 'os'"),
        ("from triton.runtime import driver\n", "import from 'triton.runtime'"),
        ("open('/tmp/x', 'w')\n", "only imports of triton and one @triton.jit"),
    ],
)
def test_module_level_code_is_refused(header, message):
    with pytest.raises(KernelRejected, match=message):
        triton_check.check_kernel_source(header + SOURCE, "add_kernel")


def test_decorators_defaults_and_annotations_are_restricted():
    with pytest.raises(KernelRejected, match="exactly one decorator"):
        triton_check.check_kernel_source(
            SOURCE.replace("@triton.jit", "@triton.autotune(configs=[], key=[])\n@triton.jit"), "add_kernel"
        )
    with pytest.raises(KernelRejected, match="defaults must be"):
        triton_check.check_kernel_source(
            SOURCE.replace("BLOCK: tl.constexpr)", "BLOCK: tl.constexpr = print('x'))"), "add_kernel"
        )
    with pytest.raises(KernelRejected, match="only tl.constexpr annotations"):
        triton_check.check_kernel_source(SOURCE.replace("n, BLOCK", "n: open, BLOCK"), "add_kernel")


@pytest.mark.parametrize(
    "line",
    [
        "    pid = tl.core.builtins.exec('1')\n",  # triton.language.core imports builtins
        "    pid = tl.core.inspect.getsource(tl)\n",
        "    pid = tl.core.knobs.compilation\n",
        "    pid = tl.core.partial(tl.program_id, 0)()\n",
        "    pid = tl.core\n",  # a module held in a local
        "    pid = triton.runtime.driver\n",
    ],
)
def test_names_that_leave_triton_language_are_refused_on_the_worker(line):
    src = SOURCE.replace("    pid = tl.program_id(0)\n", line)
    try:
        triton_check.check_kernel_source(src, "add_kernel")  # structurally fine, or not
    except KernelRejected:
        return
    with pytest.raises(KernelRejected, match="outside triton.language|not something a kernel may use|not available|"
                                             "only by its own path"):
        compile_kernel(request(src), targets.parse("cuda:sm_90"))


def test_signature_and_options_are_checked():
    with pytest.raises(KernelRejected, match="tl.constexpr; its type must be 'constexpr'"):
        request(signature="*fp32,*fp32,*fp32,i32,i32")
    with pytest.raises(KernelRejected, match="unknown Triton type"):
        request(signature="*fp32,*fp32,*float,i32,constexpr")
    with pytest.raises(KernelRejected, match="has no value"):
        request(constexprs={})
    with pytest.raises(KernelRejected, match="num_warps"):
        request(num_warps=3)
    with pytest.raises(triton_request.KernelRequestError, match="5 parameters"):
        request(signature="*fp32,i32")
    named = request(signature="n=i32,x_ptr=*fp32,y_ptr=*fp32,out_ptr=*fp32,BLOCK=constexpr")
    assert [a.name for a in named.signature] == ["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK"]


def test_triton_compile_errors_are_reported_not_raised_raw():
    from workers.triton_compile import KernelCompileError

    broken = SOURCE.replace("x + y", "x + tl.zeros((3,), dtype=tl.float32)")
    with pytest.raises(KernelCompileError):
        compile_kernel(request(broken), targets.parse("cuda:sm_90"))


def test_kernel_key_covers_what_decides_the_binary():
    base = request(triton_version="3.7.0")
    k = keys.compute_kernel_key(base)
    assert keys.compute_kernel_key(request(triton_version="3.7.0", label="other")) == k
    for other in (
        request(target="cuda:sm_80", triton_version="3.7.0"),
        request(constexprs={"BLOCK": 512}, triton_version="3.7.0"),
        request(num_warps=8, triton_version="3.7.0"),
        request(triton_version="3.6.0"),
        request(SOURCE.replace("x + y", "y + x"), triton_version="3.7.0"),
    ):
        assert keys.compute_kernel_key(other) != k
    assert keys.compute_kernel_key(base, "alice") != k


def test_building_and_compiling_calls_neither_exec_nor_eval(monkeypatch):
    """The function object comes from a compiled code object, not from running the def."""
    import builtins

    real_exec, real_eval = builtins.exec, builtins.eval

    def client_code(code) -> bool:
        if isinstance(code, types.CodeType):
            return code.co_filename.startswith("<torchfarm-kernel") or code.co_name == "add_kernel"
        return "add_kernel" in str(code) or "tl.program_id" in str(code)

    def guarded(real):
        def call(code, *args, **kwargs):
            # Triton itself execs (module imports, dataclass __init__s); never the client's code.
            assert not client_code(code), f"exec/eval of the client's kernel: {code!r}"
            return real(code, *args, **kwargs)

        return call

    src = SOURCE.replace("x + y", "x * y")  # not in Triton's in-process caches yet
    monkeypatch.setattr(builtins, "exec", guarded(real_exec))
    monkeypatch.setattr(builtins, "eval", guarded(real_eval))
    r = compile_kernel(request(src), targets.parse("cuda:sm_80"))
    assert elf.inspect_binary(r.binary).arch == "sm_80"
