"""Every torch private internal the farm relies on, with a seam per torch minor version.

The farm supports torch 2.11, 2.12 and 2.13 on Python 3.11 and 3.12 (docs/targets.md).
Public torch APIs are not listed here; these are the names under `torch._inductor`,
`torch._functorch`, `torch._dynamo`, `torch._guards`, `torch._subclasses`, `torch._C`
and `torch.fx.experimental` that the SDK and the workers import, patch or call, each
with the parameters the code assumes, and the module that uses it.

`SEAM` maps a torch (major, minor) to what differs from 2.13, the baseline: an internal
that lives elsewhere (another `Internal`) or is absent (None; its user must then fall
back or refuse, by name). `resolve(name)` gives the object for the running torch.
tests/unit/test_internals.py pins every entry (it exists, and its leading parameters
are as assumed), so a torch upgrade that moves one fails there, named, before any
compile does.

What is verified, and what is not: only torch 2.13.0 is installed here, and every entry
was read from its source. The 2.11 and 2.12 rows of `SEAM` are empty because no
difference is *known*, not because one was checked: `VERIFIED` says which versions were
run. `make test-second-build` (scripts/second_build.sh) runs the unit tests, this
module's pins included, and one end-to-end compile on torch 2.12; it has not been run.

The call sites still import these names directly (moving each import here is a change
to a dozen modules that other work is editing); this module is their inventory, their
seam, and the test that pins them.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = [
    "INTERNALS", "SEAM", "SUPPORTED", "VERIFIED", "Internal", "InternalMissing",
    "check", "internal", "resolve", "torch_minor",
]

SUPPORTED = ((2, 11), (2, 12), (2, 13))
"""Torch minor versions the farm supports (pyproject.toml pins 2.13.0 for CPU)."""

VERIFIED = ((2, 13),)
"""Minor versions whose internals were checked against an installed torch."""


@dataclass(frozen=True)
class Internal:
    module: str
    """The module to import: "torch._inductor.codecache"."""
    attr: str
    """The dotted attribute under it: "CppCodeCache.load_async"; "" for the module itself."""
    params: tuple[str, ...] = ()
    """The leading parameter names the code passes or relies on; () checks none."""
    used_by: str = ""
    """The module that uses it, and how."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module


class InternalMissing(RuntimeError):
    """A torch internal the farm relies on is absent from the running torch."""


def _i(module: str, attr: str = "", params: tuple[str, ...] = (), used_by: str = "") -> Internal:
    return Internal(module, attr, params, used_by)


INTERNALS: dict[str, Internal] = {
    # Compiling and loading artifacts.
    "standalone_compile": _i("torch._inductor", "standalone_compile",
                             ("gm", "example_inputs", "dynamic_shapes", "options", "aot"),
                             "workers/compiler.py: the graph compile"),
    "AOTCompiledArtifact.deserialize": _i("torch._inductor.standalone_compile",
                                          "AOTCompiledArtifact.deserialize", ("result_bytes",),
                                          "sdk/loader.py, workers/compiler.py: load an artifact"),
    "standalone_context": _i("torch._inductor.standalone_compile", "_standalone_context",
                             used_by="workers/gpuless.py: patched to skip autotuning"),
    "list_mode_options": _i("torch._inductor", "list_mode_options", ("mode", "dynamic"),
                            "workers/compiler.py: a mode's Inductor options"),
    "aoti_compile_and_package": _i("torch._inductor", "aoti_compile_and_package",
                                   ("exported_program",), "workers/aoti.py: exports"),
    "aoti_load_package": _i("torch._inductor", "aoti_load_package", ("path",),
                            "sdk/exports.py: load an export"),
    "inductor_config": _i("torch._inductor.config", used_by="sdk/loader.py, workers/priming.py, "
                          "workers/gpuless.py: config.patch"),
    "unsafe_marked_cacheable_functions": _i(
        "torch._inductor.config", "unsafe_marked_cacheable_functions",
        used_by="workers/compiler.py: cond and while_loop cacheable"),
    "autograd_cache_allow_custom_autograd_functions": _i(
        "torch._functorch.config", "autograd_cache_allow_custom_autograd_functions",
        used_by="workers/compiler.py: autograd_function_apply cacheable"),
    # The C++ kernels: how they are built, keyed and found (torchfarm/fx/kernelspec.py).
    "get_cpp_compiler": _i("torch._inductor.cpp_builder", "get_cpp_compiler", (),
                           "torchfarm/fx/fingerprint.py: the compiler in the build"),
    "cpu_arch_cflags": _i("torch._inductor.cpp_builder", "_get_cpu_arch_cflags", ("cpp_compiler",),
                          "torchfarm/fx/fingerprint.py: the -march in the build"),
    "CppBuilder.build": _i("torch._inductor.cpp_builder", "CppBuilder.build", ("self",),
                           "torchfarm/fx/hooks.py: counts compiler runs"),
    "CppCodeCache.load_async": _i("torch._inductor.codecache", "CppCodeCache.load_async",
                                  ("main_code", "device_type", "submit_fn", "extra_flags"),
                                  "torchfarm/fx/kernelspec.py, workers/deferral.py: kernel specs"),
    "precompile_header": _i("torch._inductor.codecache", "_precompile_header",
                            ("header", "hashable_cmd_line"),
                            "torchfarm/fx/kernelspec.py, workers/deferral.py: patched out"),
    "CppPythonBindingsCodeCache.entry_function": _i(
        "torch._inductor.codecache", "CppPythonBindingsCodeCache.entry_function",
        used_by="workers/deferral.py"),
    "PyCodeCache": _i("torch._inductor.codecache", "PyCodeCache", used_by="workers/deferral.py"),
    "torch_key": _i("torch._inductor.codecache", "torch_key", (), "workers/priming.py: warm-up"),
    "triton_key": _i("torch._inductor.codecache", "triton_key", (), "workers/priming.py: warm-up"),
    "valid_vec_isa_list": _i("torch._inductor.cpu_vec_isa", "valid_vec_isa_list", (),
                             "sdk/loader.py: the ISA probe"),
    "pick_vec_isa": _i("torch._inductor.cpu_vec_isa", "pick_vec_isa", (), "workers/priming.py"),
    "fresh_cache": _i("torch._inductor.utils", "fresh_cache", ("cache_entries", "dir", "delete"),
                      "workers/priming.py: warm-up in a throw-away cache"),
    # AOTAutograd's stages: the staged compile's decomposition (workers/aot_seam.py).
    "aot_dispatch_autograd_graph": _i("torch._functorch._aot_autograd.graph_compile",
                                      "aot_dispatch_autograd_graph", used_by="workers/aot_seam.py"),
    "aot_dispatch_base_graph": _i("torch._functorch._aot_autograd.graph_compile",
                                  "aot_dispatch_base_graph", used_by="workers/aot_seam.py"),
    "aot_stage2a_partition": _i("torch._functorch._aot_autograd.graph_compile", "_aot_stage2a_partition",
                                ("fx_g", "joint_inputs", "maybe_subclass_meta", "fw_metadata"),
                                "workers/aot_seam.py"),
    "aot_stage1_graph_capture": _i("torch._functorch._aot_autograd.graph_compile",
                                   "aot_stage1_graph_capture", ("aot_state", "orig_flat_fn"),
                                   "workers/aot_seam.py"),
    "aot_stage2_autograd": _i("torch._functorch._aot_autograd.graph_compile", "aot_stage2_autograd",
                              ("aot_state", "aot_graph_capture"), "workers/aot_seam.py"),
    # Fake tensors, shapes and guards: decoding a graph on the worker, guards on the client.
    "detect_fake_mode": _i("torch._guards", "detect_fake_mode", ("inputs",),
                           "workers/compiler.py, workers/aot_seam.py"),
    "TracingContext.try_get": _i("torch._guards", "TracingContext.try_get", (), "torchfarm/fx/guards.py"),
    "FakeTensorMode": _i("torch._subclasses.fake_tensor", "FakeTensorMode", used_by="torchfarm/fx/decode.py"),
    "FakeTensor": _i("torch._subclasses.fake_tensor", "FakeTensor",
                     used_by="torchfarm/fx/encode.py, workers/compiler.py"),
    "ShapeEnv": _i("torch.fx.experimental.symbolic_shapes", "ShapeEnv", used_by="torchfarm/fx/decode.py"),
    "DimDynamic": _i("torch.fx.experimental.symbolic_shapes", "DimDynamic.DYNAMIC",
                     used_by="torchfarm/fx/decode.py"),
    "ConstantSource": _i("torch._dynamo.source", "ConstantSource", used_by="torchfarm/fx/decode.py"),
    "GlobalStateGuard": _i("torch._C._dynamo.guards", "GlobalStateGuard", used_by="torchfarm/fx/decode.py"),
    "vmap_decrement_nesting": _i("torch._C._functorch", "_vmap_decrement_nesting",
                                 used_by="torchfarm/fx/decode.py"),
    "vmap_current_level": _i("torch._C._functorch", "maybe_current_level", used_by="torchfarm/fx/decode.py"),
    "set_grad_enabled": _i("torch._C", "_set_grad_enabled", used_by="torchfarm/fx/decode.py"),
    "PreserveDispatchKeyGuard": _i("torch._C", "_PreserveDispatchKeyGuard", used_by="torchfarm/fx/decode.py"),
    # Dynamo.
    "dynamo_reset": _i("torch._dynamo", "reset", (), "workers/priming.py"),
    "compilation_time_metrics": _i("torch._dynamo.utils", "compilation_time_metrics",
                                   used_by="workers/compiler.py: compile timings"),
    "CompilePackage": _i("torch._dynamo.package", "CompilePackage",
                         ("self", "fn", "dynamo", "ignore_inlined_sources"),
                         "sdk/precompile.py: install a precompiled package"),
    "CompilePackage.install": _i("torch._dynamo.package", "CompilePackage.install", ("self", "backends"),
                                 "sdk/precompile.py"),
    "CompilePackage.cache_entry": _i("torch._dynamo.package", "CompilePackage.cache_entry", ("self",),
                                     "sdk/precompile.py: what a producer uploads"),
    "DynamoCacheEntry": _i("torch._dynamo.package", "_DynamoCacheEntry", used_by="sdk/precompile.py"),
    "caching_precompile": _i("torch._dynamo.config", "caching_precompile",
                             used_by="sdk/precompile.py: Dynamo records its frames in a package"),
    "frame_counters": _i("torch._dynamo.utils", "counters",
                         used_by="sdk/precompile.py: frames traced on a precompiled hit"),
    "CudaInterface": _i("torch._dynamo.device_interface", "CudaInterface",
                        used_by="workers/gpuless.py: faked device properties"),
    # Triton runtime, patched by --lower-without-gpu (workers/gpuless.py).
    "set_driver_to_gpu": _i("torch._inductor.runtime.triton_helpers", "set_driver_to_gpu", (),
                            "workers/gpuless.py"),
    "CachingAutotuner._make_launchers": _i("torch._inductor.runtime.triton_heuristics",
                                           "CachingAutotuner._make_launchers", ("self",),
                                           "workers/gpuless.py"),
}

SEAM: dict[tuple[int, int], dict[str, Internal | None]] = {
    (2, 13): {},
    (2, 12): {},  # assumed as 2.13; unverified (VERIFIED)
    (2, 11): {},  # assumed as 2.13; unverified (VERIFIED)
}
"""Per torch minor version: the entries of `INTERNALS` that differ there (None: absent)."""


def torch_minor(version: str | None = None) -> tuple[int, int]:
    """(2, 13) for "2.13.0+cpu"; the running torch's when `version` is None."""
    if version is None:
        import torch

        version = torch.__version__
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def internal(name: str, version: tuple[int, int] | None = None) -> Internal | None:
    """Where `name` lives in torch `version` (the running one by default); None: absent.
    Raises InternalMissing for a torch outside `SUPPORTED`."""
    version = version or torch_minor()
    if version not in SEAM:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        raise InternalMissing(f"torch {version[0]}.{version[1]} is not supported; the farm supports {supported}")
    return SEAM[version].get(name, INTERNALS[name])


def resolve(name: str) -> object:
    """The object `name` names in the running torch; InternalMissing, naming it, if absent."""
    where = internal(name)
    if where is None:
        raise InternalMissing(f"{name} does not exist in this torch ({'.'.join(map(str, torch_minor()))})")
    try:
        obj: object = importlib.import_module(where.module)
        for part in filter(None, where.attr.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise InternalMissing(f"{where.qualname} ({name}) is missing from this torch: {e}") from e
    return obj


def check(name: str) -> str | None:
    """Why `name` is not as the farm assumes in the running torch; None when it is."""
    where = internal(name)
    if where is None:
        return None  # known absent here; its user falls back
    try:
        obj = resolve(name)
    except InternalMissing as e:
        return str(e)
    if not where.params:
        return None
    try:
        params = [p for p in inspect.signature(obj).parameters if p != "cls"]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None  # a builtin without a signature: existence is what can be pinned
    want = list(where.params)
    if where.params[0] == "self" and params[:1] != ["self"]:
        want = want[1:]
    if params[: len(want)] != want:
        return f"{where.qualname}: parameters {params[: len(want) + 2]}, the farm assumes {want}"
    return None
