"""Every torch private internal the farm relies on, with a seam per torch minor version.

The farm supports torch 2.11, 2.12 and 2.13 on Python 3.11 and 3.12 (docs/targets.md).
Public torch APIs are not listed here; these are the names under `torch._inductor`,
`torch._functorch`, `torch._dynamo`, `torch._guards`, `torch._subclasses`, `torch._C`,
`torch._ops`, `torch.utils._sympy`, `torch.utils._pytree` and `torch.fx.experimental`
that the SDK and the workers import, patch or call, each with the parameters the code
assumes, and the module that uses it. No other module reaches one:
tests/unit/test_internals.py fails on any other module's use (type-only imports aside).

`SEAM` maps a torch (major, minor) to what differs from 2.13, the baseline: an internal
that lives elsewhere or takes other parameters (another `Internal`) or is absent (None;
its user falls back: `cpu_arch_cflags`, `cpp_march`). `resolve(name)` gives the object
for the running torch. Where the difference is behaviour, not a name, a function here
gives 2.13's behaviour on every torch (`standalone_compile`, `load_async_args`). The
test pins every entry (it exists, and its leading parameters are as assumed), so a
torch upgrade that moves one fails there, named, before any compile does.

What is verified: 2.13.0 (the default install), 2.12.1 (`make test-second-build`,
scripts/test_second_build.sh: its unit tests, these pins included, and one end-to-end
compile; the 2.12 row was read from its source) and 2.11.0 with Triton 3.6, the GPU
machine's build (`make test-oldest-build`: the same; its row read from its source).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INTERNALS", "SEAM", "SUPPORTED", "VERIFIED", "Internal", "InternalMissing",
    "check", "internal", "load_async_args", "resolve", "standalone_compile", "torch_minor",
]

SUPPORTED = ((2, 11), (2, 12), (2, 13))
"""Torch minor versions the farm supports (pyproject.toml pins 2.13.0 for CPU)."""

VERIFIED = ((2, 11), (2, 12), (2, 13))
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
    "inductor": _i("torch._inductor", used_by="workers/aoti.py, sdk/exports.py"),
    "standalone_compile": _i("torch._inductor", "standalone_compile",
                             ("gm", "example_inputs", "dynamic_shapes", "options", "aot",
                              "donate_graph_module", "fake_mode"),
                             "`standalone_compile` below: the graph compile"),
    "standalone_compile_module": _i("torch._inductor.standalone_compile",
                                    used_by="workers/gpuless.py: its _standalone_context patched"),
    "resolve_fake_mode": _i("torch._inductor.standalone_compile", "_resolve_fake_mode",
                            ("gm", "dynamic_shapes"), "`standalone_compile` below, in 2.12"),
    "standalone_fake_mode_class": _i("torch._inductor.standalone_compile", "FakeTensorMode",
                                     used_by="`standalone_compile` below, in 2.11"),
    "functorch_config": _i("torch._functorch.config", used_by="`standalone_compile` below"),
    "TransformGetItemToIndex": _i("torch._dynamo._trace_wrapped_higher_order_op", "TransformGetItemToIndex",
                                  used_by="torchfarm/fx/decode.py: flex attention's bodies"),
    "flex_attention_hops": _i("torch._higher_order_ops.flex_attention",
                              used_by="torchfarm/fx/decode.py: which bodies are flex attention's"),
    "force_non_lazy_backward_lowering": _i("torch._functorch.config", "force_non_lazy_backward_lowering",
                                           used_by="`standalone_compile` below, before 2.13"),
    "TorchCompileInductorWrapper": _i("torch", "_TorchCompileInductorWrapper",
                                      ("mode", "options", "dynamic"),
                                      "workers/compiler.py, sdk/backend.py: a mode's options"),
    "AOTCompiledArtifact.deserialize": _i("torch._inductor.standalone_compile",
                                          "AOTCompiledArtifact.deserialize", ("result_bytes",),
                                          "sdk/loader.py, workers/compiler.py: load an artifact"),
    "AOTCompiledArtifact": _i("torch._inductor.standalone_compile", "AOTCompiledArtifact",
                              used_by="sdk/loader.py, workers/compiler.py"),
    "standalone_context": _i("torch._inductor.standalone_compile", "_standalone_context",
                             used_by="workers/gpuless.py: patched to skip autotuning"),
    "list_mode_options": _i("torch._inductor", "list_mode_options", ("mode", "dynamic"),
                            "workers/compiler.py: a mode's Inductor options"),
    "aoti_compile_and_package": _i("torch._inductor", "aoti_compile_and_package",
                                   ("exported_program",), "workers/aoti.py: exports"),
    "aoti_load_package": _i("torch._inductor", "aoti_load_package", ("path",),
                            "sdk/exports.py: load an export"),
    "inductor_config": _i("torch._inductor.config", used_by="sdk/loader.py, workers/priming.py, "
                          "workers/gpuless.py: config.patch; sdk/changed_settings.py: "
                          "_config, _is_default"),
    "unsafe_marked_cacheable_functions": _i(
        "torch._inductor.config", "unsafe_marked_cacheable_functions",
        used_by="workers/compiler.py: cond and while_loop cacheable"),
    "autograd_cache_allow_custom_autograd_functions": _i(
        "torch._functorch.config", "autograd_cache_allow_custom_autograd_functions",
        used_by="workers/compiler.py: autograd_function_apply cacheable"),
    # The C++ kernels: how they are built, keyed and found (torchfarm/fx/cpp_kernels.py).
    "cpp_builder": _i("torch._inductor.cpp_builder", used_by="torchfarm/fx/fingerprint.py, toolchain.py"),
    "codecache": _i("torch._inductor.codecache", used_by="torchfarm/fx/cpp_kernels.py, workers/deferral.py"),
    "cpu_vec_isa": _i("torch._inductor.cpu_vec_isa", used_by="torchfarm/fx/vecisa.py, sdk/loader.py"),
    "CppBuilder": _i("torch._inductor.cpp_builder", "CppBuilder", used_by="torchfarm/fx/hooks.py"),
    "CppCodeCache": _i("torch._inductor.codecache", "CppCodeCache", used_by="torchfarm/fx/hooks.py"),
    "AotCodeCompiler": _i("torch._inductor.codecache", "AotCodeCompiler",
                          used_by="torchfarm/fx/hooks.py: an export's C++ sources checked"),
    # The C++ code generator's 2-D tile kernel, fixed by workers/inductor_fixes.py.
    "CppTile2DKernel": _i("torch._inductor.codegen.cpp", "CppTile2DKernel",
                          used_by="workers/inductor_fixes.py: its store replaced"),
    "CppTile2DKernel.store": _i("torch._inductor.codegen.cpp", "CppTile2DKernel.store",
                                ("self", "name", "index", "value", "mode"), "workers/inductor_fixes.py"),
    "CppTile2DKernel.need_vec_transpose": _i("torch._inductor.codegen.cpp", "CppTile2DKernel.need_vec_transpose",
                                             ("self", "index"), "workers/inductor_fixes.py"),
    "CppVecKernel": _i("torch._inductor.codegen.cpp", "CppVecKernel",
                       used_by="workers/inductor_fixes.py: its store called"),
    "CppVecKernel.store": _i("torch._inductor.codegen.cpp", "CppVecKernel.store",
                             ("self", "name", "index", "value", "mode"), "workers/inductor_fixes.py"),
    "CppTile2DOverrides": _i("torch._inductor.codegen.cpp", "CppTile2DOverrides",
                             used_by="workers/inductor_fixes.py: its index_expr read"),
    # The vector-range index analysis, bounded by workers/inductor_fixes.py.
    "stride_at": _i("torch._inductor.sizevars", "stride_at", ("index", "var"),
                    "workers/inductor_fixes.py: replaced in its module"),
    "simplify_index_in_vec_range": _i("torch._inductor.sizevars", "simplify_index_in_vec_range",
                                      ("index", "var", "vec_length"),
                                      "workers/inductor_fixes.py: replaced in its module"),
    # What Dynamo's fake inputs use for an activation's autograd history (meta_utils).
    "DelayedError": _i("torch._C", "_functions.DelayedError", ("msg", "num_inputs"),
                       "torchfarm/fx/decode.py: an input that requires grad is not a leaf"),
    # The scheduler's recompute of a node's loop body, fixed by workers/inductor_fixes.py.
    "SchedulerNode": _i("torch._inductor.scheduler", "SchedulerNode",
                        used_by="workers/inductor_fixes.py: its recompute_size_and_body wrapped"),
    "inductor_dependencies": _i("torch._inductor.dependencies", used_by="workers/inductor_fixes.py: "
                                "WeakDep, StarDep (a scheduler node's fake dependencies)"),
    "SchedulerNode.recompute_size_and_body": _i(
        "torch._inductor.scheduler", "SchedulerNode.recompute_size_and_body",
        ("self", "extra_indexing_constraints", "recompute_sizes_body_func"),
        "workers/inductor_fixes.py: wrapped"),
    "get_cpp_compiler": _i("torch._inductor.cpp_builder", "get_cpp_compiler", (),
                           "torchfarm/fx/fingerprint.py: the compiler in the build"),
    "cpu_arch_cflags": _i("torch._inductor.cpp_builder", "_get_cpu_arch_cflags", ("cpp_compiler",),
                          "`cpu_arch_cflags` below: the -march in the build"),
    "optimization_cflags": _i("torch._inductor.cpp_builder", "_get_optimization_cflags",
                              ("cpp_compiler", "min_optimize"), "`cpu_arch_cflags` below, before 2.13"),
    "cpp_march": _i("torch._inductor.config", "cpp.march", used_by="`cpp_march` below"),
    "is_gcc_version_less_than": _i("torch._inductor.cpp_builder", "_is_gcc_version_less_than",
                                   ("cpp_compiler", "major"), "torchfarm/fx/toolchain.py (aarch64)"),
    "CppBuilder.build": _i("torch._inductor.cpp_builder", "CppBuilder.build", ("self",),
                           "torchfarm/fx/hooks.py: counts compiler runs"),
    "CppCodeCache.load_async": _i("torch._inductor.codecache", "CppCodeCache.load_async",
                                  ("main_code", "device_type", "submit_fn", "extra_flags",
                                   "optimized_code", "needs_vec_isa", "kernel_needs_vec_isa"),
                                  "torchfarm/fx/cpp_kernels.py, workers/deferral.py: kernel specs"),
    "precompile_header": _i("torch._inductor.codecache", "_precompile_header",
                            ("header", "hashable_cmd_line"),
                            "torchfarm/fx/cpp_kernels.py, workers/deferral.py: patched out"),
    "header_dir": _i("torch._inductor.codecache", "_HEADER_DIR",
                     used_by="workers/sandbox/child.py: the forkserver's prebuilt headers"),
    "header_lock_dir": _i("torch._inductor.codecache", "_HEADER_LOCK_DIR",
                          used_by="workers/sandbox/child.py: the forkserver's prebuilt headers"),
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
    # Which inputs AOTAutograd takes as static (parameters and buffers): workers/compiler.py.
    "aot_autograd": _i("torch._functorch.aot_autograd", used_by="workers/compiler.py: static inputs"),
    "_try_get_metadata_from_dynamo": _i("torch._functorch.aot_autograd", "_try_get_metadata_from_dynamo",
                                        ("mod", "param_keys", "full_args_num", "full_args_descs"),
                                        "workers/compiler.py: replaced in aot_autograd during a compile"),
    # AOTAutograd's stages: the staged compile's decomposition (workers/aot_seam.py).
    "graph_compile": _i("torch._functorch._aot_autograd.graph_compile", used_by="workers/aot_seam.py"),
    "aot_dispatch_autograd_graph": _i("torch._functorch._aot_autograd.graph_compile",
                                      "aot_dispatch_autograd_graph", used_by="workers/aot_seam.py"),
    "aot_dispatch_base_graph": _i("torch._functorch._aot_autograd.graph_compile",
                                  "aot_dispatch_base_graph", used_by="workers/aot_seam.py"),
    "aot_stage2a_partition": _i("torch._functorch._aot_autograd.graph_compile", "_aot_stage2a_partition",
                                ("fx_g", "joint_inputs", "maybe_subclass_meta", "fw_metadata",
                                 "aot_config", "partition_fn"), "workers/aot_seam.py"),
    "aot_stage1_graph_capture": _i("torch._functorch._aot_autograd.graph_compile",
                                   "aot_stage1_graph_capture", ("aot_state", "orig_flat_fn"),
                                   "workers/aot_seam.py"),
    "aot_stage2_autograd": _i("torch._functorch._aot_autograd.graph_compile", "aot_stage2_autograd",
                              ("aot_state", "aot_graph_capture"), "workers/aot_seam.py"),
    # Fake tensors, shapes and guards: decoding a graph on the worker, guards on the client.
    "detect_fake_mode": _i("torch._guards", "detect_fake_mode", ("inputs",),
                           "workers/compiler.py, workers/aot_seam.py"),
    "TracingContext.try_get": _i("torch._guards", "TracingContext.try_get", (), "torchfarm/fx/guards.py"),
    "unset_fake_temporarily": _i("torch._subclasses.fake_tensor", "unset_fake_temporarily",
                                 used_by="torchfarm/fx/decode.py: constants made inside a fake mode"),
    "FakeTensorMode": _i("torch._subclasses.fake_tensor", "FakeTensorMode", used_by="torchfarm/fx/decode.py, encode.py"),
    "enable_python_dispatcher": _i("torch._dispatch.python", "enable_python_dispatcher",
                                   used_by="torchfarm/fx/decode.py: propagation as Dynamo's get_fake_value runs it"),
    # numpy calls as Dynamo puts them in a graph (torch._dynamo.utils).
    "numpy_to_tensor_wrapper": _i("torch._dynamo.utils", "numpy_to_tensor_wrapper", ("f",),
                                  "torchfarm/fx/encode.py, decode.py: a numpy function's call"),
    "numpy_method_wrapper": _i("torch._dynamo.utils", "numpy_method_wrapper", ("method",),
                               "torchfarm/fx/encode.py, decode.py: an ndarray method's call"),
    "numpy_operator_wrapper": _i("torch._dynamo.utils", "numpy_operator_wrapper", ("op",),
                                 "torchfarm/fx/encode.py, decode.py: an operator on ndarrays"),
    "np_to_tnp_map": _i("torch._dynamo.variables.misc", "get_np_to_tnp_map",
                        used_by="torchfarm/fx/surface.py: the numpy functions Dynamo traces"),
    "fx_graph_functions": _i("torch._dynamo.variables.builtin", "BuiltinVariable._fx_graph_functions",
                             used_by="torchfarm/fx/surface.py: the builtins Dynamo puts in graphs"),
    "torch_numpy": _i("torch._numpy", used_by="torchfarm/fx/encode.py, surface.py: numpy as Dynamo traces it"),
    "inductor_prims": _i("torch._inductor.inductor_prims",
                         used_by="torchfarm/fx/surface.py, decode.py: registers the prims Inductor's "
                         "decompositions emit"),
    "inductor_passes": _i("torch._inductor.fx_passes.control_dependencies",
                          used_by="torchfarm/fx/surface.py: registers the higher-order ops Inductor's "
                          "passes make (control_deps), so the walk does not depend on what was imported"),
    "dispatcher_op_names": _i("torch._C", "_dispatch_get_all_op_names",
                              used_by="torchfarm/fx/surface.py: every ATen and prims op"),
    "higher_order_ops": _i("torch._ops", "_higher_order_ops",
                           used_by="torchfarm/fx/surface.py: every registered higher-order op"),
    "FakeTensor": _i("torch._subclasses.fake_tensor", "FakeTensor",
                     used_by="torchfarm/fx/encode.py, workers/compiler.py"),
    "free_unbacked_symbols": _i("torch.fx.experimental.symbolic_shapes", "free_unbacked_symbols",
                                used_by="torchfarm/fx/guards.py: guards over unbacked symbols left out"),
    "ShapeEnv": _i("torch.fx.experimental.symbolic_shapes", "ShapeEnv", used_by="torchfarm/fx/decode.py"),
    "SymNode": _i("torch.fx.experimental.sym_node", "SymNode", used_by="torchfarm/fx/decode.py"),
    "DimDynamic": _i("torch.fx.experimental.symbolic_shapes", "DimDynamic.DYNAMIC",
                     used_by="torchfarm/fx/decode.py"),
    "sym_functions": _i("torch.utils._sympy.functions", used_by="torchfarm/fx/decode.py, guards.py: "
                        "FloorDiv, Mod, Max... in shapes and guards"),
    "int_oo": _i("torch.utils._sympy.numbers", "int_oo", used_by="torchfarm/fx/decode.py"),
    "pytree": _i("torch.utils._pytree", used_by="workers/aoti.py, sdk/export_codec.py, torchfarm/fx/decode.py"),
    "ConstantSource": _i("torch._dynamo.source", "ConstantSource", used_by="torchfarm/fx/decode.py"),
    "GlobalStateGuard": _i("torch._C._dynamo.guards", "GlobalStateGuard", used_by="torchfarm/fx/global_state.py"),
    "functorch_top": _i("torch._C._functorch", "peek_interpreter_stack",
                        used_by="torchfarm/fx/global_state.py: the innermost level, to leave"),
    "functorch_stack": _i("torch._C._functorch", "get_interpreter_stack",
                          used_by="torchfarm/fx/decode.py: inside torch.func.grad or jvp"),
    "functorch_depth": _i("torch._C._functorch", "get_dynamic_layer_stack_depth",
                          used_by="torchfarm/fx/global_state.py: vmap, grad and jvp levels"),
    "functorch_transforms": _i("torch._C._functorch", "TransformType",
                               used_by="torchfarm/fx/decode.py, global_state.py: which kind a level is"),
    "vmap_decrement_nesting": _i("torch._C._functorch", "_vmap_decrement_nesting",
                                 used_by="torchfarm/fx/global_state.py"),
    "grad_decrement_nesting": _i("torch._C._functorch", "_grad_decrement_nesting",
                                 used_by="torchfarm/fx/global_state.py"),
    "jvp_decrement_nesting": _i("torch._C._functorch", "_jvp_decrement_nesting",
                                used_by="torchfarm/fx/global_state.py"),
    "fwd_grad_enabled": _i("torch._C", "_is_fwd_grad_enabled", used_by="torchfarm/fx/global_state.py"),
    "set_fwd_grad_enabled": _i("torch._C", "_set_fwd_grad_enabled", used_by="torchfarm/fx/global_state.py"),
    "enter_dual_level": _i("torch._C", "_enter_dual_level", used_by="torchfarm/fx/global_state.py: "
                           "whether a dual level is entered (one at most, process-wide)"),
    "exit_dual_level": _i("torch._C", "_exit_dual_level", used_by="torchfarm/fx/global_state.py"),
    "forward_ad": _i("torch.autograd.forward_ad", used_by="torchfarm/fx/global_state.py: its "
                     "_current_level put back"),
    "forward_ad_current_level": _i("torch.autograd.forward_ad", "_current_level",
                                   used_by="torchfarm/fx/global_state.py: the dual level "
                                   "torch.autograd.forward_ad's calls default to"),
    "saved_tensors_hooks_enabled": _i("torch._C._autograd", "_saved_tensors_hooks_is_enabled",
                                      used_by="torchfarm/fx/global_state.py"),
    "saved_tensors_hooks_enable": _i("torch._C._autograd", "_saved_tensors_hooks_enable",
                                     used_by="torchfarm/fx/global_state.py"),
    "inplace_requires_grad_allowed": _i("torch._C._functorch", "get_inplace_requires_grad_allowed",
                                        used_by="torchfarm/fx/global_state.py"),
    "set_inplace_requires_grad_allowed": _i("torch._C._functorch", "set_inplace_requires_grad_allowed",
                                            used_by="torchfarm/fx/global_state.py"),
    "set_grad_enabled": _i("torch._C", "_set_grad_enabled", used_by="torchfarm/fx/global_state.py"),
    "PreserveDispatchKeyGuard": _i("torch._C", "_PreserveDispatchKeyGuard",
                                   used_by="torchfarm/fx/global_state.py"),
    # Dynamo.
    "TensorifyState": _i("torch._dynamo.symbolic_convert", "TensorifyState", used_by="sdk/scalars.py"),
    "TensorifyScalarRestartAnalysis": _i("torch._dynamo.exc", "TensorifyScalarRestartAnalysis",
                                         used_by="sdk/scalars.py"),
    "OpOverload": _i("torch._ops", "OpOverload", used_by="torchfarm/fx/encode.py, noops.py"),
    "OpOverloadPacket": _i("torch._ops", "OpOverloadPacket", used_by="torchfarm/fx/encode.py, noops.py"),
    "dynamo_reset": _i("torch._dynamo", "reset", (), "workers/priming.py"),
    "compilation_time_metrics": _i("torch._dynamo.utils", "compilation_time_metrics",
                                   used_by="workers/compiler.py: compile timings"),
    "HigherOrderOperator": _i("torch._ops", "HigherOrderOperator", used_by="torchfarm/fx/encode.py"),
    "dynamo_config": _i("torch._dynamo.config", used_by="sdk/precompile.py: caching_precompile patched"),
    "trace_structured": _i("torch._logging", "trace_structured", ("name", "metadata_fn"),
                           "sdk/outcomes.py: a graph's farm record in TORCH_TRACE, as an artifact"),
    "CompileContext.current_compile_id": _i("torch._guards", "CompileContext.current_compile_id", (),
                                            "sdk/outcomes.py: the compile a background record belongs to"),
    "AutoDispatchBelowAutograd": _i("torch._C", "_AutoDispatchBelowAutograd",
                                    used_by="torchfarm/fx/torch_library.py: a stand-in's call"),
    "resolve_process_group": _i("torch._C._distributed_c10d", "_resolve_process_group",
                                used_by="torchfarm/fx/process_groups.py: a group's name to its members; "
                                "torchfarm/fx/meshes.py: a shared name taken"),
    "register_process_group": _i("torch._C._distributed_c10d", "_register_process_group",
                                 used_by="workers/fakepg.py; torchfarm/fx/meshes.py: a submesh's shared names"),
    "unregister_process_group": _i("torch._C._distributed_c10d", "_unregister_process_group",
                                   used_by="workers/fakepg.py"),
    "sdpa_backends": _i("torch.nn.attention", "_cur_sdpa_kernel_backends", ("with_priority",),
                        "torchfarm/fx/global_state.py: the SDPA backends enabled, by priority"),
    "CustomGraphPass": _i("torch._inductor.custom_graph_pass", "CustomGraphPass",
                          used_by="torchfarm/fx/global_state.py: a pass whose uuid keys the SDPA backends"),
    "set_sdpa_backends": _i("torch.nn.attention", "_sdpa_kernel", ("backends", "set_priority"),
                            "torchfarm/fx/global_state.py: sdpa_kernel's switches, set and put back"),
    "fake_pg": _i("torch.testing._internal.distributed.fake_pg",
                  used_by="workers/fakepg.py: importing it registers the \"fake\" backend"),
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
    "device_interface": _i("torch._dynamo.device_interface", used_by="workers/gpuless.py"),
    "CudaInterface": _i("torch._dynamo.device_interface", "CudaInterface",
                        used_by="workers/gpuless.py: faked device properties"),
    # Triton runtime, patched by --lower-without-gpu (workers/gpuless.py).
    "triton_helpers": _i("torch._inductor.runtime.triton_helpers", used_by="workers/gpuless.py"),
    "triton_heuristics": _i("torch._inductor.runtime.triton_heuristics", used_by="workers/gpuless.py"),
    "set_driver_to_gpu": _i("torch._inductor.runtime.triton_helpers", "set_driver_to_gpu", (),
                            "workers/gpuless.py"),
    # Autotune results carried in the artifact (torchfarm/fx/autotune.py).
    "CachingAutotuner": _i("torch._inductor.runtime.triton_heuristics", "CachingAutotuner",
                           used_by="torchfarm/fx/autotune.py: its precompile wrapped, each kernel noted"),
    "CachingAutotuner.precompile": _i("torch._inductor.runtime.triton_heuristics",
                                      "CachingAutotuner.precompile", ("self", "warm_cache_only"),
                                      "torchfarm/fx/autotune.py"),
    "AutotuneCache": _i("torch._inductor.runtime.autotune_cache", "AutotuneCache",
                        used_by="torchfarm/fx/autotune.py: a record's key, as this torch computes it"),
    "AutotuneCache.create": _i("torch._inductor.runtime.autotune_cache", "AutotuneCache.create",
                               ("inductor_meta", "filename", "configs_hash"), "torchfarm/fx/autotune.py"),
    "AutotuneCache._read": _i("torch._inductor.runtime.autotune_cache", "AutotuneCache._read", ("self",),
                              "torchfarm/fx/autotune.py: a kernel's record"),
    "inductor_cache_dir": _i("torch._inductor.runtime.runtime_utils", "cache_dir", (),
                             "torchfarm/fx/autotune.py: where kernel sources and their records live"),
    "CachingAutotuner._make_launchers": _i("torch._inductor.runtime.triton_heuristics",
                                           "CachingAutotuner._make_launchers", ("self",),
                                           "workers/gpuless.py"),
}

_BEFORE_2_13: dict[str, Internal | None] = {
    # No fake_mode (`standalone_compile` below patches it in).
    "standalone_compile": _i("torch._inductor", "standalone_compile",
                             ("gm", "example_inputs", "dynamic_shapes", "options", "aot",
                              "donate_graph_module"), "`standalone_compile` below"),
    # No needs_vec_isa/kernel_needs_vec_isa: every kernel gets pick_vec_isa() (`load_async_args`).
    "CppCodeCache.load_async": _i("torch._inductor.codecache", "CppCodeCache.load_async",
                                  ("main_code", "device_type", "submit_fn", "extra_flags", "optimized_code"),
                                  "torchfarm/fx/cpp_kernels.py, workers/deferral.py: kernel specs"),
    # -march is inlined in _get_optimization_cflags (`cpu_arch_cflags` below); no cpp.march.
    "cpu_arch_cflags": None,
    "cpp_march": None,
    "is_gcc_version_less_than": None,  # 2.13's aarch64 -march choice; 2.12 uses -march=native
    # AOTAutograd partitions with the aot_config's partition_fn, passed none.
    "aot_stage2a_partition": _i("torch._functorch._aot_autograd.graph_compile", "_aot_stage2a_partition",
                                ("fx_g", "joint_inputs", "maybe_subclass_meta", "fw_metadata", "aot_config"),
                                "workers/aot_seam.py"),
    # The vector-range index analysis lived in the C++ code generator (2.12.1's and
    # 2.11.0's source).
    "stride_at": _i("torch._inductor.codegen.cpp", "stride_at", ("index", "var"),
                    "workers/inductor_fixes.py: replaced in its module"),
    "simplify_index_in_vec_range": _i("torch._inductor.codegen.cpp", "simplify_index_in_vec_range",
                                      ("index", "var", "vec_length"),
                                      "workers/inductor_fixes.py: replaced in its module"),
    # codecache.triton_key is 2.13's; before, Inductor imports Triton's through triton_compat.
    "triton_key": _i("torch._inductor.runtime.triton_compat", "triton_key", (), "workers/priming.py: warm-up"),
}

_BEFORE_2_12: dict[str, Internal | None] = {
    **_BEFORE_2_13,
    # No donate_graph_module; one function, its fake mode made inline by the module's
    # FakeTensorMode (`standalone_compile` below patches that name).
    "standalone_compile": _i("torch._inductor", "standalone_compile",
                             ("gm", "example_inputs", "dynamic_shapes", "options", "aot"),
                             "`standalone_compile` below"),
    "resolve_fake_mode": None,
    "standalone_context": None,  # --lower-without-gpu refuses, by name (workers/gpuless.py)
}

SEAM: dict[tuple[int, int], dict[str, Internal | None]] = {
    (2, 13): {},
    (2, 12): _BEFORE_2_13,  # read from 2.12.1's source, and run (VERIFIED)
    (2, 11): _BEFORE_2_12,  # read from 2.11.0's source, and run (VERIFIED)
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


def resolve(name: str) -> Any:
    """The object `name` names in the running torch; InternalMissing, naming it, if absent."""
    where = internal(name)
    if where is None:
        raise InternalMissing(f"{name} does not exist in this torch ({'.'.join(map(str, torch_minor()))})")
    try:
        obj: Any = importlib.import_module(where.module)
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
        params = [p for p in inspect.signature(obj).parameters if p != "cls"]
    except (TypeError, ValueError):
        return None  # a builtin without a signature: existence is what can be pinned
    want = list(where.params)
    if where.params[0] == "self" and params[:1] != ["self"]:
        want = want[1:]
    if params[: len(want)] != want:
        return f"{where.qualname}: parameters {params[: len(want) + 2]}, the farm assumes {want}"
    return None


def standalone_compile(
    gm: Any, example_inputs: Sequence[Any], *, dynamic_shapes: str, options: dict[str, Any],
    aot: bool, fake_mode: Any,
) -> Any:
    """`torch._inductor.standalone_compile` as torch 2.13 runs it, on every supported torch.

    2.13 takes a `fake_mode` (the decoded graph's, whose ShapeEnv holds its symbols) and
    lowers a training graph's backward before the artifact is saved. Before 2.13 it has no
    `fake_mode`: "from_example_inputs" made a fresh FakeTensorMode of its own, which
    re-fakes the inputs without their symbols; and the backward was lowered lazily, on
    the first backward(), after the artifact was saved. Both are patched in there."""
    compile_fn = resolve("standalone_compile")
    kwargs = {"dynamic_shapes": dynamic_shapes, "options": options, "aot": aot}
    if "fake_mode" in _params("standalone_compile"):
        return compile_fn(gm, list(example_inputs), **kwargs, fake_mode=fake_mode)
    with _given_fake_mode(fake_mode), resolve("functorch_config").patch(force_non_lazy_backward_lowering=True):
        return compile_fn(gm, list(example_inputs), **kwargs)


@contextmanager
def _given_fake_mode(fake_mode: Any) -> Iterator[None]:
    if fake_mode is None:
        yield
        return
    module = resolve("standalone_compile_module")
    inline = internal("resolve_fake_mode") is None  # 2.11: FakeTensorMode(shape_env=ShapeEnv()) inline
    name = "FakeTensorMode" if inline else "_resolve_fake_mode"
    real = resolve("standalone_fake_mode_class" if inline else "resolve_fake_mode")

    def given(*args: Any, **kwargs: Any) -> Any:
        shapes = kwargs.get("dynamic_shapes", args[1] if len(args) > 1 else None)
        return fake_mode if inline or shapes == "from_example_inputs" else real(*args, **kwargs)

    setattr(module, name, given)
    try:
        yield
    finally:
        setattr(module, name, real)


def load_async_args(args: dict[str, Any]) -> dict[str, Any]:
    """`args` (keyword arguments of `CppCodeCache.load_async`) less those the running
    torch's lacks: 2.12 has no `needs_vec_isa` and `kernel_needs_vec_isa` (it picks the
    ISA for every kernel). A dropped argument must be None (what a spec recorded on such
    a torch holds); anything else is a kernel this torch cannot key: ValueError."""
    accepted = set(_params("CppCodeCache.load_async"))
    dropped = {k: v for k, v in args.items() if k not in accepted}
    if any(v is not None for v in dropped.values()):
        raise ValueError(f"this torch's CppCodeCache.load_async takes no {sorted(dropped)}: {dropped}")
    return {k: v for k, v in args.items() if k in accepted}


def _params(name: str) -> tuple[str, ...]:
    where = internal(name)
    return where.params if where is not None else ()


def cpu_arch_cflags(compiler: str) -> list[str]:
    """The -march (or -mcpu) flags Inductor gives `compiler` for every C++ kernel."""
    if internal("cpu_arch_cflags") is not None:
        return list(resolve("cpu_arch_cflags")(compiler))
    cflags, _ = resolve("optimization_cflags")(compiler)
    return [f for f in cflags if f.startswith(("march=", "mcpu="))]


def cpp_march() -> str | None:
    """Inductor's `config.cpp.march` (None: the default, -march=native); None where absent."""
    return resolve("cpp_march") if internal("cpp_march") is not None else None
