"""Writes torchfarm/data/inductor_refused.json: every Inductor setting of the installed
torch that the farm neither carries (torchfarm/wire/options.py ALLOWED) nor leaves to the
client (torchfarm/wire/inductor_settings.py CLIENT_ONLY), each with why it is refused.

Existing entries are kept, so the list covers every supported build: run it under each
(the second build's venv too, `make test-second-build`); an entry now carried or
client-only is dropped. A setting reviewed here (`REVIEWED`) gets its reason from
there; a new one gets a reason by its name's kind, or `NOT_REVIEWED`, which
tests/unit/test_inductor_settings.py refuses: review it, then carry it or say here why
not. Run after a torch upgrade: that test fails until then.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch._inductor.config as inductor_config

from torchfarm.wire import inductor_settings, options

OUT = Path(__file__).resolve().parent.parent / "torchfarm" / "data" / "inductor_refused.json"

CALLABLE = "takes a callable or an object: code a worker would run for a stranger"
PATH = "a path or a program on the host: means nothing, or something hostile, on a worker"
DEBUG = "debugging or tracing output: written on the worker, where the user never sees it"
AOTI = "AOTInductor packaging: sdk.export's path, not a graph compile's"
BACKEND = "a backend the farm's workers are not checked against"
TESTING = "a testing hook of torch's (it injects bugs, distorts results, sleeps or asserts for tests): never a farm compile's"
STRUCTURED = "a list or table (passes, fusions, lookup tables, sizes): the farm checks no structured value, so refuses it"
TEXT = "free-form text torch parses itself (pass names, blockings, patterns): the farm does not check it, so refuses it"
WORKER_OWNED = "the worker's own limits, subprocesses, probes and caches: the farm sets them, a request may not"
ARTIFACT = "changes the artifact's form (its wrapper, kernel launchers, bundled caches, runtime hooks): the farm's loader is not checked against it"
RANKS = "talks to the other ranks during the compile: a worker compiles a rank's graph alone"
COMPILER_FLAGS = "a flag on the C++ compiler's command line: kernels are built and keyed apart from the compile (torchfarm/fx/cpp_kernels.py), with the worker's own flags"
INTERNAL = "not a setting: torch's own bookkeeping, or one torch sets for itself (a leading underscore)"
NOT_REVIEWED = "not reviewed for remote compiles: it may change what the worker builds"

REVIEWED: dict[str, str] = {
    **dict.fromkeys([
        "TYPE_CHECKING", "_cache_config_factory_keys", "_cache_config_ignore_prefix",
        "_collective.auto_select", "_conv_default_backends", "_fuse_ddp_bucket_size",
        "_fuse_ddp_communication", "_micro_pipeline_tp", "_use_fp64_for_unbacked_floats",
        "is_nightly_or_source",
    ], INTERNAL),
    **dict.fromkeys([
        "_raise_error_for_testing", "always_complex_memory_overlap_TESTING_ONLY",
        "can_inplace_pad_graph_input", "check_stack_no_cycles_TESTING_ONLY",
        "cpp.inject_relu_bug_TESTING_ONLY", "force_disable_cudagraph_TESTING_ONLY",
        "sleep_sec_TESTING_ONLY", "triton.disallow_failing_autotune_kernels_TESTING_ONLY",
        "triton.inject_relu_bug_TESTING_ONLY",
        "test_configs.assume_bucketing_reduces_latency", "test_configs.autotune_choice_desc_regex",
        "test_configs.autotune_choice_name_regex", "test_configs.bisect_keep_custom_backend_for_inductor",
        "test_configs.bisect_pre_grad_graph", "test_configs.distort_benchmarking_result",
        "test_configs.force_custom_op_decomposition", "test_configs.force_extern_kernel_in_multi_template",
        "test_configs.force_filter_reduction_configs", "test_configs.force_no_impl_grouping",
        "test_configs.graphsafe_rng_func_ignores_fallback_random", "test_configs.max_flex_configs",
        "test_configs.max_mm_configs", "test_configs.runtime_triton_dtype_assert",
        "test_configs.runtime_triton_shape_assert", "test_configs.static_cpp_dtype_assert",
        "test_configs.track_memory_lifecycle",
    ], TESTING),
    **dict.fromkeys([
        "aten_distributed_optimizations.custom_runtime_estimation",
        "bucket_all_gathers_fx_bucket_size_determinator", "bucket_all_reduces_fx_bucket_size_determinator",
        "bucket_reduce_scatters_fx_bucket_size_determinator", "custom_partitioner_fn",
        # "default" or a function: the only other value is a callable.
        "estimate_op_runtime",
        "external_matmul", "inductor_choices_class", "run_jit_post_compile_hook",
        "reorder_for_compute_comm_overlap_passes",
    ], CALLABLE),
    **dict.fromkeys([
        "autotune_lookup_table", "cudagraph_unsafe_unbacked_ops", "custom_should_partition_ops",
        "fx_passes_numeric_check",
        "lookup_table.table", "multi_kernel_hints", "post_grad_fusion_options",
        "pre_grad_fusion_options", "triton.cudagraph_capture_sizes",
    ], STRUCTURED),
    **dict.fromkeys([
        "add_pre_grad_passes", "remove_pre_grad_passes", "disabled_passes",
        "cpp.gemm_cache_blocking", "cpp.gemm_thread_factors",
    ], TEXT),
    **dict.fromkeys([
        "cpp.enable_floating_point_contract_flag", "cpp.enable_unsafe_math_opt_flag",
        # Its text goes on the command line as -march=<text>.
        "cpp.march",
    ], COMPILER_FLAGS),
    **dict.fromkeys([
        # torch 2.11's autoheuristic_collect is one comma-separated string.
        "annotate_training", "autoheuristic_collect", "autoheuristic_collect.mixed_mm",
        "autoheuristic_collect.pad_mm",
        "autotune_num_choices_displayed", "developer_warnings", "enabled_metric_tables",
        "max_autotune_report_choices_stats", "triton.cudagraph_trees_history_recording",
        "triton.cudagraph_trees_objgraph", "triton.proton_group_by_sm",
        "triton.proton_per_cta_occupancy", "triton.proton_split_invocations", "warn_mix_layout",
    ], DEBUG),
    **dict.fromkeys([
        "autotune_in_subproc", "autotune_multi_device", "collective_benchmark_timeout", "file_lock_timeout",
        "cpp.vec_isa_ok", "cpp_cache_precompile_headers", "precompilation_timeout_seconds",
        "max_autotune_subproc_graceful_timeout_seconds", "max_autotune_subproc_result_timeout_seconds",
        "max_autotune_subproc_terminate_timeout_seconds", "triton_disable_device_detection",
        "unsafe_marked_cacheable_functions", "unsafe_skip_cache_dynamic_shape_guards",
    ], WORKER_OWNED),
    **dict.fromkeys([
        "bundle_triton_into_fx_graph_cache", "cpp_wrapper", "cpp_wrapper_build_separate", "fx_wrapper", "enable_autograd_for_aot",
        "generate_intermediate_hooks", "is_predispatch", "keep_static_cubin_raw",
        "static_launch_user_defined_triton_kernels", "strict_static_cuda_launcher",
        "strict_static_triton_launcher", "triton.store_cubin", "use_fast_triton_launcher",
        "use_launch_metadata_schema", "use_static_cuda_launcher", "use_static_triton_launcher",
        "wrap_inductor_compiled_regions",
    ], ARTIFACT),
    **dict.fromkeys([
        "cpu_backend", "cuda_backend", "xpu_backend", "tpu_backend", "cutedsl_enable_autotuning",
        "nvgemm_supplement_configs", "triton.enable_tlx_templates",
    ], BACKEND),
    **dict.fromkeys([
        "aten_distributed_optimizations.collective_estimator", "aten_distributed_optimizations.spmd_check",
        "distributed_max_autotune_gemm",
    ], RANKS),
}
"""Settings reviewed one by one and refused, each with its reason; every other setting
of torch 2.12 and 2.13 is carried, client-only, or refused by its name's kind below."""


_PATH_WORDS = frozenset({"dir", "dirs", "path", "paths", "cxx", "file", "files", "include", "lib", "libs",
                         "library", "command", "ld", "logpath"})
"""Words of a setting's name (split at underscores) that make it a path or a program.
Matched as words: as substrings they named `..._directions`, `..._profile` and
`..._threshold_...` paths."""


def reason(name: str, default: object) -> str:
    if name in REVIEWED:
        return REVIEWED[name]
    leaf = name.rsplit(".", 1)[-1]
    if callable(default) or "custom_pass" in name or name in getattr(inductor_config, "_save_config_ignore", []):
        return CALLABLE
    if leaf.startswith("_") or name.startswith("_"):
        return INTERNAL
    if name.startswith("test_configs.") or "TESTING" in leaf:
        return TESTING
    if _PATH_WORDS & set(leaf.split("_")):
        return PATH
    if name.startswith(("trace.", "debug")) or any(
        w in leaf for w in ("debug", "log", "dump", "trace", "profil", "repro", "verbose", "print", "save")
    ):
        return DEBUG
    if name.startswith(("aot_inductor.", "aot_inductor_mode.")):
        return AOTI
    if name.startswith(("cuda.", "cutlass.", "xpu.", "rocm.", "halide.", "mtia.")):
        return BACKEND
    return NOT_REVIEWED


def main() -> None:
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    # Settings of the other supported builds stay; those since carried or left to the
    # client go; each reason is worked out again (a reason by kind only where the kind
    # is known: an older one stays where it is not).
    out = {}
    for name, why in old.items():
        if name not in options.ALLOWED and name not in inductor_settings.CLIENT_ONLY:
            now = reason(name, None)
            out[name] = why if now == NOT_REVIEWED else now
    for name in sorted(inductor_config._config):
        if name in options.ALLOWED or name in inductor_settings.CLIENT_ONLY:
            continue
        now = reason(name, inductor_config._config[name].default)
        out[name] = old.get(name, now) if now == NOT_REVIEWED else now
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{len(out)} refused settings written to {OUT}")


if __name__ == "__main__":
    main()
