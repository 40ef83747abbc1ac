"""Defence in depth behind graphcheck's text and constant checks: the worker builds no
C++ kernel whose source holds what Inductor never writes and an injection needs (inline
assembly, which can `.incbin` a file into the binary or add an `.init_array` entry; a
constructor attribute). Two holes of one day (a flex attention scale of text, an assert
message with a quote) each wrote such C++ into a kernel the worker built and signed
(torchfarm/fx/cpp_kernels.py `check_sources`, called by the worker's build)."""

from __future__ import annotations

import json

import pytest
import torch

from torchfarm.fx.cpp_kernels import KernelSpecError, check_sources, spec_args
from torchfarm.fx.hooks import checked_aot_sources, record_kernel_loads
from torchfarm.fx.internals import resolve
from workers.compiler import build_kernel

INJECTED = [
    'asm(".incbin \\"/etc/hostname\\"");',
    '__asm__ volatile("nop");',
    "__attribute__((constructor)) static void f() {}",
    'asm(".pushsection .init_array");',
    "__attribute__((__constructor__)) static void f() {}",
    "__attribute__ (( constructor (101) )) static void f() {}",
    "[[gnu::destructor]] static void f() {}",
    'static void (*p)() __attribute__((section(".ctors"))) = 0;',
    'static void (*p)() __attribute__((section(".fini_array"))) = 0;',
    # Spellings the preprocessor or the compiler puts together from parts.
    '#define CAT(a, b) a##b\nCAT(__as, m__)(".inc" "bin \\"/etc/hostname\\"");',
    '#define CAT(a, b) a %:%: b\nCAT(__as, m__)("nop");',
    '__as\\\nm__ volatile("nop");',
    'static void (*p)() __attribute__((section(".init" "_array"))) = 0;',
    'static void (*p)() __attribute__((__section__(".ini" "t_array"))) = 0;',
]


@pytest.mark.parametrize("code", INJECTED)
def test_a_kernel_spec_whose_source_holds_an_injection_is_refused(code):
    args = spec_args({"main_code": f"extern \"C\" void kernel() {{ {code} }}", "device_type": "cpu"})
    spec = json.dumps({"format": "torchfarm.cpp-kernel/1", "cache": "CppCodeCache", "args": args,
                       "output": 0, "outputs": 1}).encode()
    with pytest.raises(KernelSpecError, match="Inductor never writes"):
        build_kernel(spec)


def test_a_load_under_the_hook_is_refused_before_it_builds():
    with record_kernel_loads(), pytest.raises(KernelSpecError, match="Inductor never writes"):
        resolve("CppCodeCache").load_async(f'extern "C" void kernel() {{ {INJECTED[0]} }}')


@pytest.mark.timeout(300)  # a real compile: a minute or more on a loaded machine
def test_the_sources_inductor_writes_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
    with record_kernel_loads() as loads:
        out = torch.compile(model)(torch.randn(4, 8, requires_grad=True))
        out.sum().backward()
    torch._dynamo.reset()
    assert loads
    for load in loads:
        check_sources(load.args)


@pytest.mark.parametrize("code", INJECTED)
def test_an_export_whose_wrapper_holds_an_injection_is_refused_before_it_builds(code):
    # AOTInductor compiles its wrapper and kernels with AotCodeCompiler, not load_async.
    wrapper = f'// Shared constructor for the model.\nextern "C" void run() {{ {code} }}'
    with checked_aot_sources(), pytest.raises(KernelSpecError, match="Inductor never writes"):
        resolve("AotCodeCompiler").compile(
            None, wrapper, "", None, device_type="cpu", additional_files=[]
        )


@pytest.mark.timeout(300)  # a real compile: a minute or more on a loaded machine
def test_the_sources_aot_inductor_writes_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
    program = torch.export.export(model, (torch.randn(4, 8),))
    # Packaging writes the package's metadata into the process's config: patched, it
    # is put back.
    with checked_aot_sources(), resolve("inductor_config").patch({"aot_inductor.metadata": {}}):
        path = resolve("aoti_compile_and_package")(program, package_path=str(tmp_path / "m.pt2"))
    assert (tmp_path / "m.pt2").stat().st_size > 0 and path
