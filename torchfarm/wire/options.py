"""Which compile options a client may send: an allow-list, checked without torch.

Inductor's config is a remote-code-execution surface when a stranger sets it:
`cpp.cxx` names the compiler binary the worker runs, `trace.debug_dir` where it writes,
and several options take callables or paths. `torch.compile` validates only names and
(for plain types) value types, so `{"cpp.cxx": [null, "/bin/sh"]}` passes it. The farm
therefore accepts only the modes `torch.compile` names and the settings in `ALLOWED`, each
a plain value: a boolean, a finite number within its range (`RANGES`), or a string from a
fixed set (`CHOICES`, `SUBSETS`), at most `MAX_VALUE_CHARS` of JSON. Which settings are
carried, and why each other one is refused, is torchfarm/wire/inductor_settings.py's. The
coordinator refuses anything else with INVALID_ARGUMENT; the worker checks again before it
compiles.
"""

from __future__ import annotations

import json
import math

from torchfarm.graph.graph_errors import GraphError

MODES = frozenset({"", "default", "lite", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"})
"""`torch.compile(mode=...)` values; "" is no mode."""

_BOOL = (bool,)
_INT = (int,)
_OPT_BOOL = (bool, type(None))
_OPT_INT = (int, type(None))
_FLOAT = (float,)
_OPT_FLOAT = (float, type(None))
_STR = (str,)
_OPT_STR = (str, type(None))

_BOOLS = """
    max_autotune max_autotune_pointwise max_autotune_gemm coordinate_descent_tuning
    triton.cudagraphs epilogue_fusion epilogue_fusion_first pattern_matcher
    aggressive_fusion shape_padding comprehensive_padding layout_optimization
    fallback_random split_reductions benchmark_kernel benchmark_fusion size_asserts
    nan_asserts debug_index_asserts conv_1x1_as_mm memory_planning allow_buffer_reuse
    inplace_buffers combo_kernels emulate_precision_casts keep_output_stride
    cpp.dynamic_threads triton.persistent_reductions triton.unique_kernel_names
    triton.autotune_pointwise
    align_random_eager alignment_asserts always_keep_tensor_constants
    apply_gumbel_max_trick assume_32bit_indexing assume_aligned_inputs
    assume_unaligned_fallback_output auto_chunker.enable autoheuristic_use.mixed_mm
    autotune_fallback_to_aten b2b_gemm_pass batch_fusion batch_invariant
    benchmark_combo_kernel benchmark_harness bw_outputs_user_visible cache_sdpa_constraint
    combo_kernel_autotune_grouping combo_kernel_foreach_dynamic_shapes
    combo_kernel_per_subkernel_blocks combo_kernels_pointwise_only comment_origin
    compute_all_bounds constant_and_index_propagation dce decompose_mem_bound_mm
    dedup_reduce_scatters delay_realize_cheap_outputs deterministic disable_cpp_codegen
    disable_padding_cpu do_not_emit_runtime_assertions dynamic_scale_rblock
    eager_numerics.disable_ftz eager_numerics.division_rounding
    efficient_conv_bn_eval_fx_passes enable_auto_functionalized_v2
    enable_linear_binary_folding expand_dimension_for_pointwise_nodes fallback_by_default
    fallback_embedding_bag_byte_unpack force_fuse_int_mm_with_mul force_layout_optimization
    force_pointwise_cat force_same_precision force_shape_pad freezing_discard_parameters
    graph_partition group_fusion implicit_fallbacks inplace_padding
    joint_graph_constant_folding keep_addmm_fused_for_half_dtypes
    lookup_table.check_src_hash loop_index_inversion_in_fusion loop_ordering_after_fusion
    loop_reindexing_after_fusion max_autotune_allow_flexible_layouts
    max_autotune_prune_choices_based_on_shared_mem online_softmax
    optimize_scatter_upon_const_tensor pad_channels_last pad_dynamic_shapes pad_outputs
    partitioned_scatter_enabled permute_fusion pick_loop_orders pipeline_max_autotune_gemm
    reorder_for_compute_comm_overlap reorder_for_locality reorder_for_peak_memory
    runtime_estimations_mms_benchmark runtime_triton_nan_asserts scalar_asserts
    search_autotune_cache selective_decompose split_cat_fx_passes static_weight_shapes
    unsafe_ignore_unsupported_triton_autotune_args use_dce use_experimental_benchmarker
    use_fast_math use_joint_graph_passes use_mixed_mm use_post_grad_passes
    use_pre_grad_passes write_are_deterministic_algorithms_enabled
    cpp.enable_concat_linear cpp.enable_grouped_gemm_template cpp.enable_loop_tail_vec
    cpp.enable_tiling_heuristics
    cpp.fallback_scatter_reduce_sum cpp.force_inline_kernel cpp.no_redundant_loops
    cpp.use_constexpr_for_int_array cpp.use_decompose_tanh cpp.use_small_dequant_buffer
    cpp.weight_prepack
    triton.autotune_cublasLt triton.autotune_with_sample_inputs
    triton.coalesce_tiling_analysis triton.codegen_upcast_to_fp32
    triton.cooperative_reductions triton.cudagraph_or_error
    triton.cudagraph_skip_dynamic_graphs triton.cudagraph_support_input_mutation
    triton.cudagraph_trees triton.decompose_sort_ops triton.dense_indexing
    triton.divisible_by_16 triton.dynamic_disable_pipelining triton.emit_pointer_range_32
    triton.enable_pdl triton.enable_persistent_tma_matmul triton.enable_template_tma_store
    triton.force_cooperative_reductions triton.force_cudagraph_sync
    triton.force_cudagraphs_warmup triton.mix_order_reduction
    triton.mix_order_reduction_allow_multi_stages
    triton.mix_order_reduction_autotune_split_size
    triton.mix_order_reduction_non_strict_mode triton.native_matmul
    triton.nested_reduction triton.prefer_nd_tiling
    triton.reorder_for_reducing_graph_partitions triton.skip_cudagraph_warmup
    triton.skip_l1_cache triton.tile_reductions triton.tiling_prevents_pointwise_fusion
    triton.tiling_prevents_reduction_fusion triton.transpose_discontiguous_tensor_descriptor
    triton.unique_user_kernel_names triton.use_block_ptr triton.use_tensor_descriptor
    aten_distributed_optimizations.allow_comms_decompositions
    aten_distributed_optimizations.bucket_only_internode_comms
    aten_distributed_optimizations.enable_low_contention_collectives
    aten_distributed_optimizations.enable_overlap_scheduling
    aten_distributed_optimizations.low_contention_skip_overlap_check
    aten_distributed_optimizations.overlap_scheduling_autofix_cycles
    aten_distributed_optimizations.pre_bucketing_fsdp_collectives
    aten_distributed_optimizations.prioritize_bucketing_during_scheduling
    assert_indirect_indexing coordinate_descent_check_all_directions
    eager_numerics.use_pytorch_libdevice triton.fast_path_cudagraph_asserts
    triton.slow_path_cudagraph_asserts
"""
"""Switches: true or false."""

_OPT_BOOLS = """
    autoheuristic_use.pad_mm incremental_autotune triton.autotune_at_compile_time
    aten_distributed_optimizations.bucket_exposed_first
    aten_distributed_optimizations.collective_bucketing
    aten_distributed_optimizations.enable_fusion_regions
    aten_distributed_optimizations.insert_overlap_deps
"""
"""Switches that also take null: torch decides. Some take it on one build only
(`aten_distributed_optimizations.enable_fusion_regions` defaults to null on torch 2.12)."""

FUNCTORCH = "functorch."
"""The prefix of the AOTAutograd settings (`torch._functorch.config`) that travel among
the Inductor options: how the joint graph is partitioned, what the backward saves and
reuses. The worker applies them around decode and compile (torchfarm/fx/global_state.py)."""

_FUNCTORCH_BOOLS = """
    donated_buffer cse recompute_views treat_parameters_as_free_to_save aggressive_recomputation
    ban_recompute_used_far_apart ban_recompute_long_fusible_chains ban_recompute_materialized_backward
    ban_recompute_not_in_allowlist ban_recompute_reductions
"""

ALLOWED: dict[str, tuple[type, ...]] = {
    **dict.fromkeys((FUNCTORCH + n for n in _FUNCTORCH_BOOLS.split()), _BOOL),
    FUNCTORCH + "activation_memory_budget": _FLOAT,
    FUNCTORCH + "activation_memory_budget_runtime_estimator": _STR,
    FUNCTORCH + "activation_memory_budget_solver": _STR,
    FUNCTORCH + "max_dist_from_bw": _INT,
    **dict.fromkeys(_BOOLS.split(), _BOOL),
    **dict.fromkeys(_OPT_BOOLS.split(), _OPT_BOOL),
    # Counts, sizes and thresholds: each within RANGES, or MAX_INT_OPTION.
    "cpp.simdlen": _OPT_INT,
    # The client's thread count: Inductor sizes parallel C++ kernels for it (sdk/backend.py).
    "cpp.threads": _INT,
    "cpp.min_chunk_size": _INT,
    "triton.max_tiles": _OPT_INT,
    "max_fusion_size": _INT,
    "unroll_reductions_threshold": _INT,
    "realize_reads_threshold": _INT,
    "max_pointwise_cat_inputs": _INT,
    "auto_chunker.amplify_ratio_threshold": _INT,
    "auto_chunker.num_chunk": _OPT_INT,
    "auto_chunker.output_size_threshold": _INT,
    "collective_benchmark_nruns": _INT,
    "combo_kernel_allow_mixed_sizes": _INT,
    "combo_kernel_max_distance": _INT,
    "combo_kernel_max_num_args": _INT,
    "combo_kernel_max_num_nodes": _INT,
    "combo_kernels_autotune": _INT,
    "coordinate_descent_search_radius": _INT,
    "size_threshold_for_succ_based_strategy": _INT,
    "cpp.gemm_max_k_slices": _INT,
    "cpp.max_horizontal_fusion_size": _INT,
    "cpp.use_two_step_variance_threshold": _INT,
    "inductor_default_autotune_rep": _INT,
    "inductor_default_autotune_warmup": _INT,
    "inter_node_bw": _OPT_INT,
    "intra_node_bw": _OPT_INT,
    "kernel_name_max_ops": _INT,
    "max_complex_pointwise_cat_inputs": _INT,
    "max_fusion_buffer_group_pairwise_attempts": _INT,
    "max_fusion_unique_io_buffers": _OPT_INT,
    "min_num_split": _INT,
    "padding_alignment_bytes": _INT,
    "padding_stride_threshold": _INT,
    "partitioned_scatter_max_partitions": _INT,
    "partitioned_scatter_min_partitions": _INT,
    "realize_acc_reads_size_threshold": _OPT_INT,
    "realize_acc_reads_threshold": _OPT_INT,
    "realize_cpu_acc_reads_threshold": _INT,
    "realize_cpu_opcount_threshold": _INT,
    "realize_opcount_threshold": _OPT_INT,
    "reorder_prefetch_limit": _OPT_INT,
    "score_fusion_memory_threshold": _INT,
    "small_memory_access_threshold": _INT,
    "triton.cudagraph_dynamic_shape_warn_limit": _OPT_INT,
    "triton.cudagraph_min_partition_size": _INT,
    "triton.cudagraph_unexpected_rerecord_limit": _INT,
    "triton.decompose_k_threshold": _INT,
    "triton.min_split_scan_rblock": _INT,
    "triton.mix_order_reduction_initial_xblock": _INT,
    "triton.mix_order_reduction_max_reads": _INT,
    "triton.mix_order_reduction_split_size": _OPT_INT,
    "triton.multi_kernel": _INT,
    "triton.num_decompose_k_splits": _INT,
    "triton.spill_threshold": _INT,
    "triton.use_two_step_variance_min_numel": _INT,
    "triton.use_two_step_variance_threshold": _INT,
    "unbacked_symint_fallback": _INT,
    "aten_distributed_optimizations.low_contention_min_bytes_per_rank": _INT,
    "aten_distributed_optimizations.max_coll_distance": _OPT_INT,
    "aten_distributed_optimizations.max_compute_pre_fetch": _OPT_INT,
    # Ratios, bandwidths and budgets: finite, each within RANGES or MAX_INT_OPTION.
    "combo_kernel_peak_memory_increase_gb": _OPT_FLOAT,
    "combo_kernel_peak_memory_pct_threshold": _OPT_FLOAT,
    "cpu_gpu_bw": _FLOAT,
    "min_overlap_ratio": _FLOAT,
    "partitioned_scatter_memory_budget": _FLOAT,
    "triton.cudagraph_partition_memory_budget": _FLOAT,
    "aten_distributed_optimizations.compute_overlap_multipler": _OPT_FLOAT,
    "aten_distributed_optimizations.max_in_flight_gb": _OPT_FLOAT,
    "aten_distributed_optimizations.max_memory_increase_gb": _OPT_FLOAT,
    "aten_distributed_optimizations.max_memory_increase_ratio": _OPT_FLOAT,
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_bucket_cap_mb": _OPT_FLOAT,
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_max_bucket_cap_mb": _FLOAT,
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_min_bucket_cap_mb": _FLOAT,
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_saturation_calibration_multiplier": _FLOAT,
    # Names from a fixed set: CHOICES, or comma-separated from SUBSETS.
    "autoheuristic_use": _STR,
    "bucket_all_gathers_bucket_mode": _STR,
    "bucket_all_gathers_fx": _STR,
    "bucket_all_reduces_fx": _STR,
    "bucket_reduce_scatters_bucket_mode": _STR,
    "bucket_reduce_scatters_fx": _STR,
    "cpp.descriptive_names": _STR,
    "layout_opt_default": _STR,
    "max_autotune_conv_backends": _STR,
    "max_autotune_conv_bwd_input_backends": _STR,
    "max_autotune_conv_bwd_weight_backends": _STR,
    "max_autotune_flex_search_space": _STR,
    "max_autotune_gemm_backends": _STR,
    "max_autotune_gemm_search_space": _STR,
    "memory_pool": _STR,
    "mixed_mm_choice": _STR,
    "pre_grad_pass_timing": _STR,
    "triton.descriptive_names": _STR,
    "triton_kernel_default_layout_constraint": _STR,
    "aten_distributed_optimizations.bucket_mode": _OPT_STR,
    "aten_distributed_optimizations.compute_estimator": _STR,
    "aten_distributed_optimizations.spmd_mismatch": _STR,
}
"""Option name → the JSON value types it may have (a float option takes an integer too).
Plain values only, each changing what Inductor generates or how it tunes: nothing that
names a path, a program, a module or a callable, writes debugging output, or sizes the
worker's own pools and time limits (scripts/gen_inductor_refused.py says why each other
setting is refused)."""

AUTOCAST_DEVICES = frozenset({"cpu", "cuda", "xpu", "mps", "hpu"})
"""Device types a request may have autocast on for (torch.autocast's)."""
AUTOCAST_DTYPES = frozenset({"bfloat16", "float16"})
"""The lower precisions autocast casts to."""

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION", "OVERRIDEABLE")
"""torch's SDPBackend names, in its default priority order (all enabled by default)."""

MAX_INT_OPTION = 1 << 20
"""Numeric options beyond ±this are refused (they are counts and sizes, never this big)."""
_BYTES = (0, 1 << 40)
RANGES: dict[str, tuple[float, float]] = {
    # A team of this many OpenMP threads may run when the worker benchmarks a kernel.
    "cpp.threads": (1, 1024),
    # Each widens a search the worker runs: autotuning candidates, benchmark runs,
    # fusion attempts and the kernels, chunks and splits generated.
    "coordinate_descent_search_radius": (1, 16),
    "inductor_default_autotune_rep": (1, 1000),
    "inductor_default_autotune_warmup": (0, 1000),
    "collective_benchmark_nruns": (1, 1000),
    "triton.num_decompose_k_splits": (0, 64),
    "combo_kernel_max_num_nodes": (1, 256),
    "combo_kernel_max_num_args": (1, 10_000),
    "max_fusion_buffer_group_pairwise_attempts": (1, 1024),
    "cpp.max_horizontal_fusion_size": (1, 1024),
    "cpp.gemm_max_k_slices": (0, 1024),
    "auto_chunker.num_chunk": (1, 1024),
    "min_num_split": (0, 4096),
    "partitioned_scatter_max_partitions": (1, 1024),
    "partitioned_scatter_min_partitions": (1, 1024),
    "kernel_name_max_ops": (1, 100),
    "triton.spill_threshold": (0, 1024),
    "triton.mix_order_reduction_initial_xblock": (1, 4096),
    "triton.mix_order_reduction_max_reads": (0, 1024),
    "triton.min_split_scan_rblock": (1, 1 << 16),
    # Autotuning allocates inputs with unbacked sizes at this value: above torch's
    # default, a tensor with two such dimensions could exhaust the worker's memory.
    "unbacked_symint_fallback": (1, 8192),
    # Enumerations torch documents: 0 to 2, or 0 to 3.
    "combo_kernel_allow_mixed_sizes": (0, 2),
    "combo_kernels_autotune": (0, 2),
    "triton.multi_kernel": (0, 3),
    # Divisors and bandwidths: zero would divide by zero inside Inductor.
    "padding_alignment_bytes": (1, 4096),
    "inter_node_bw": (1, MAX_INT_OPTION),
    "intra_node_bw": (1, MAX_INT_OPTION),
    "cpu_gpu_bw": (0.001, MAX_INT_OPTION),
    # Byte counts, larger than MAX_INT_OPTION by default.
    "auto_chunker.output_size_threshold": _BYTES,
    "small_memory_access_threshold": _BYTES,
    "aten_distributed_optimizations.low_contention_min_bytes_per_rank": _BYTES,
    # Fractions and ratios.
    "partitioned_scatter_memory_budget": (0.0, 1.0),
    FUNCTORCH + "activation_memory_budget": (0.0, 1.0),
    "min_overlap_ratio": (0.0, 10.0),
    # Sizes and budgets that torch divides by or splits into: never zero or below.
    "triton.mix_order_reduction_split_size": (1, 1 << 16),
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_bucket_cap_mb": (1, MAX_INT_OPTION),
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_max_bucket_cap_mb": (1, MAX_INT_OPTION),
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_min_bucket_cap_mb": (1, MAX_INT_OPTION),
    "aten_distributed_optimizations.max_coll_distance": (0, MAX_INT_OPTION),
    "aten_distributed_optimizations.max_compute_pre_fetch": (0, MAX_INT_OPTION),
    "aten_distributed_optimizations.compute_overlap_multipler": (0, 1000),
    "aten_distributed_optimizations.max_in_flight_gb": (0, MAX_INT_OPTION),
    "aten_distributed_optimizations.max_memory_increase_gb": (0, MAX_INT_OPTION),
    "aten_distributed_optimizations.max_memory_increase_ratio": (0, MAX_INT_OPTION),
    "combo_kernel_peak_memory_increase_gb": (0, MAX_INT_OPTION),
    "combo_kernel_peak_memory_pct_threshold": (0, MAX_INT_OPTION),
    "triton.cudagraph_partition_memory_budget": (0, MAX_INT_OPTION),
}
"""Numeric options with other bounds than ±MAX_INT_OPTION, inclusive."""

_BUCKET_MODES = frozenset({"default", "custom_ops", "custom_ops_multidtype"})
_NAMES = frozenset({"torch", "original_aten", "inductor_node"})
_SEARCH = frozenset({"DEFAULT", "EXHAUSTIVE"})
CHOICES: dict[str, frozenset[object]] = {
    "bucket_all_gathers_bucket_mode": _BUCKET_MODES,
    "bucket_reduce_scatters_bucket_mode": _BUCKET_MODES,
    "bucket_all_gathers_fx": frozenset({"none", "all", "only_fsdp"}),
    "bucket_all_reduces_fx": frozenset({"none", "all"}),
    "bucket_reduce_scatters_fx": frozenset({"none", "all"}),
    "cpp.descriptive_names": _NAMES,
    "triton.descriptive_names": _NAMES,
    "layout_opt_default": frozenset({"0", "1"}),
    "max_autotune_flex_search_space": _SEARCH,
    "max_autotune_gemm_search_space": _SEARCH,
    "memory_pool": frozenset({"none", "intermediates", "outputs", "combined"}),
    "mixed_mm_choice": frozenset({"default", "triton", "aten", "heuristic"}),
    "pre_grad_pass_timing": frozenset({"early", "late", "default"}),
    "triton_kernel_default_layout_constraint": frozenset({"needs_fixed_stride_order", "flexible_layout"}),
    "aten_distributed_optimizations.bucket_mode": _BUCKET_MODES | {"coalesced", None},
    "aten_distributed_optimizations.compute_estimator": frozenset({"analytical", "benchmark"}),
    "aten_distributed_optimizations.spmd_mismatch": frozenset({"warn", "error"}),
    # torch 2.11's form of 2.13's autoheuristic_use.mixed_mm and .pad_mm switches, read
    # as `name in value.split(",")`: lower case, exactly.
    "autoheuristic_use": frozenset({"", "mixed_mm", "pad_mm", "mixed_mm,pad_mm", "pad_mm,mixed_mm"}),
    # Estimates that need no benchmark on the worker, solvers that need no scipy.
    FUNCTORCH + "activation_memory_budget_runtime_estimator": frozenset({"flops", "testing"}),
    FUNCTORCH + "activation_memory_budget_solver": frozenset({"dp", "greedy", "dp_knapsack_sliding_hirschberg"}),
}
"""String options: the values torch documents for each."""

SUBSETS: dict[str, frozenset[str]] = {
    # The backends the farm's workers are checked against; CUTLASS, CK, NVGEMM and
    # CUTEDSL are not (their settings are refused too).
    "max_autotune_gemm_backends": frozenset({"ATEN", "TRITON", "CPP"}),
    "max_autotune_conv_backends": frozenset({"ATEN", "TRITON"}),
    "max_autotune_conv_bwd_input_backends": frozenset({"ATEN", "TRITON"}),
    "max_autotune_conv_bwd_weight_backends": frozenset({"ATEN", "TRITON"}),
}
"""String options that list names, comma-separated, each from its set (any case)."""


class OptionNotAllowed(GraphError):
    """A compile mode or Inductor option the farm does not take from clients."""


def check_options(mode: str, options: list[tuple[str, str]]) -> dict[str, object]:
    """Validates (name, JSON value) pairs and the mode; returns the decoded options."""
    if mode not in MODES:
        raise OptionNotAllowed(f"compile mode {mode!r} is not one the farm accepts")
    decoded: dict[str, object] = {}
    for name, raw in options:
        if name not in ALLOWED:
            raise OptionNotAllowed(f"Inductor option {name[:80]!r} is not on the farm's allow-list")
        if name in decoded:
            raise OptionNotAllowed(f"Inductor option {name!r} given twice")
        decoded[name] = _checked_value(name, raw)
    return decoded


MAX_VALUE_CHARS = 256
"""An option's JSON value is a scalar: longer text is refused before it is parsed."""


def _checked_value(name: str, raw: str) -> object:
    if len(raw) > MAX_VALUE_CHARS:
        raise OptionNotAllowed(f"Inductor option {name!r}: value is longer than {MAX_VALUE_CHARS} characters")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OptionNotAllowed(f"Inductor option {name!r}: value is not JSON") from e
    kinds = ALLOWED[name]
    # A float option takes an integer (JSON has one number type); torch wants the float.
    if float in kinds and type(value) is int:
        value = float(value)
    if not _allowed(name, kinds, value):
        raise OptionNotAllowed(f"Inductor option {name!r}: value {raw[:40]!r} is not allowed")
    if name in SUBSETS:  # some of torch's readers upper-case it, some do not
        return ",".join(_names_in(str(value)))
    return value


def _allowed(name: str, kinds: tuple[type, ...], value: object) -> bool:
    # bool is an int in Python: an int option must not take true, nor a bool option 1.
    if type(value) not in kinds:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = RANGES.get(name, (-MAX_INT_OPTION, MAX_INT_OPTION))
        return math.isfinite(value) and low <= value <= high
    if type(value) is str or name in CHOICES:
        if name in SUBSETS:
            return _is_subset(str(value), SUBSETS[name])
        return value in CHOICES.get(name, ())
    return True


def _names_in(value: str) -> list[str]:
    return [part.strip().upper() for part in value.split(",")]


def _is_subset(value: str, names: frozenset[str]) -> bool:
    given = _names_in(value)
    return len(set(given)) == len(given) and set(given) <= names


def check_sdpa_backends(names: list[str]) -> list[str]:
    """Validates the SDPA backends a graph was captured under: known, each once, and not
    torch's default, which a request leaves empty (so its key is unchanged)."""
    for name in names:
        if name not in SDPA_BACKENDS:
            raise OptionNotAllowed(f"SDPA backend {name[:40]!r} is not one torch has")
    if len(set(names)) != len(names):
        raise OptionNotAllowed("an SDPA backend given twice")
    if tuple(names) == SDPA_BACKENDS:
        raise OptionNotAllowed("the default SDPA backends are sent as none")
    return names


def check_autocast(entries: list[tuple[str, str]]) -> dict[str, str]:
    """Validates the (device type, dtype) pairs of the autocast a graph was captured
    under; returns them by device type."""
    found: dict[str, str] = {}
    for device, dtype in entries:
        if device not in AUTOCAST_DEVICES:
            raise OptionNotAllowed(f"autocast for device type {device[:40]!r} is not one the farm knows")
        if dtype not in AUTOCAST_DTYPES:
            raise OptionNotAllowed(f"autocast to {dtype[:40]!r} is not allowed; only {sorted(AUTOCAST_DTYPES)}")
        if device in found:
            raise OptionNotAllowed(f"autocast for {device!r} given twice")
        found[device] = dtype
    return found


def split_functorch(decoded: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """Checked options (`check_options`) as Inductor's, and AOTAutograd's by their
    `torch._functorch.config` names."""
    inductor = {k: v for k, v in decoded.items() if not k.startswith(FUNCTORCH)}
    functorch = {k.removeprefix(FUNCTORCH): v for k, v in decoded.items() if k.startswith(FUNCTORCH)}
    return inductor, functorch
