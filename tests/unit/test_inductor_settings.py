"""Every Inductor setting is carried, refused by name, or client-only
(torchfarm/wire/inductor_settings.py); changed ones travel in the key or keep a graph local."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch._inductor.config as inductor_config

from sdk import changed_settings
from sdk.backend import build_request
from sdk.errors import GraphRejected
from tests.requests import relu_request
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.wire import inductor_settings, keys, options
from torchfarm.wire.codes import JobError
from workers import runtime
from workers.compiler import inductor_config_patch
from workers.job import JobFailed


def test_every_inductor_setting_of_this_torch_is_classified():
    # Nested configs (cpp., triton., aot_inductor., ...) are flattened into these names.
    names = list(inductor_config._config)
    assert any(n.startswith("cpp.") for n in names) and any(n.startswith("triton.") for n in names)
    unknown = [n for n in names if inductor_settings.classify(n) == "unknown"]
    assert not unknown, f"Inductor settings neither carried nor refused: {unknown}"


_NEW_IN_2_13 = {
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_saturation_calibration_multiplier",
    "batch_invariant", "combo_kernel_autotune_grouping", "combo_kernel_max_distance",
    "combo_kernel_max_num_nodes", "combo_kernel_peak_memory_increase_gb",
    "combo_kernel_peak_memory_pct_threshold", "dedup_reduce_scatters", "incremental_autotune",
    "loop_reindexing_after_fusion", "max_autotune_conv_bwd_input_backends",
    "max_autotune_conv_bwd_weight_backends", "max_complex_pointwise_cat_inputs",
    "realize_cpu_acc_reads_threshold", "realize_cpu_opcount_threshold",
    "triton.cudagraph_partition_memory_budget", "triton.dynamic_disable_pipelining",
    "triton.emit_pointer_range_32", "triton.mix_order_reduction_max_reads",
    "triton.nested_reduction", "triton.use_two_step_variance_min_numel",
    "triton.use_two_step_variance_threshold",
    "aten_distributed_optimizations.allow_comms_decompositions",
    "aten_distributed_optimizations.enable_low_contention_collectives",
    "aten_distributed_optimizations.low_contention_min_bytes_per_rank",
    "aten_distributed_optimizations.low_contention_skip_overlap_check",
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives",
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_bucket_cap_mb",
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_max_bucket_cap_mb",
    "aten_distributed_optimizations.pre_bucketing_fsdp_collectives_min_bucket_cap_mb",
}
"""Carried settings new in torch 2.13."""

CARRIED_BUT_MISSING = {
    # force_same_precision: deprecated in 2.12, gone in 2.13. autoheuristic_use: 2.11's
    # string, 2.12 and 2.13's autoheuristic_use.mixed_mm and .pad_mm.
    "2.13": {"force_same_precision", "autoheuristic_use"},
    "2.12": {*_NEW_IN_2_13, "autoheuristic_use"},
    # New in 2.12 or 2.13.
    "2.11": {
        *_NEW_IN_2_13,
        "align_random_eager", "aten_distributed_optimizations.bucket_mode",
        "aten_distributed_optimizations.bucket_only_internode_comms",
        "aten_distributed_optimizations.compute_estimator",
        "aten_distributed_optimizations.overlap_scheduling_autofix_cycles",
        "aten_distributed_optimizations.spmd_mismatch", "autoheuristic_use.mixed_mm",
        "autoheuristic_use.pad_mm", "bucket_all_gathers_bucket_mode",
        "bucket_reduce_scatters_bucket_mode", "cache_sdpa_constraint",
        "cpp.use_two_step_variance_threshold", "delay_realize_cheap_outputs",
        "do_not_emit_runtime_assertions", "eager_numerics.use_pytorch_libdevice",
        "keep_addmm_fused_for_half_dtypes",
        "min_overlap_ratio", "pre_grad_pass_timing", "triton.cudagraph_min_partition_size",
        "triton.decompose_sort_ops",
    },
}
"""Carried settings of one supported build that the other lacks, by the build lacking them:
a client never has them changed there, and a worker refuses them (`apply_options`)."""


def test_no_setting_is_in_two_classes_and_every_carried_one_exists():
    carried, client, refused = set(options.ALLOWED), set(inductor_settings.CLIENT_ONLY), set(inductor_settings.refused())
    assert not (carried & client or carried & refused or client & refused)
    build = ".".join(torch.__version__.split(".")[:2])
    if build not in CARRIED_BUT_MISSING:
        pytest.skip(f"torch {build} is not a supported build")
    # A misspelt carried name would show here.
    functorch = {n for n in carried if n.startswith(options.FUNCTORCH)}
    assert carried - functorch - set(inductor_config._config) == CARRIED_BUT_MISSING[build]
    import torch._functorch.config as functorch_config

    named = functorch | set(inductor_settings.FUNCTORCH_CLIENT_ONLY)
    assert {n.removeprefix(options.FUNCTORCH) for n in named} <= set(functorch_config._config)


def test_a_changed_aotautograd_setting_is_carried_client_only_or_refused():
    import torch._functorch.config as functorch_config

    with functorch_config.patch(donated_buffer=False, activation_memory_budget=0.5, enable_autograd_cache=False,
                                enable_activation_offloading=True):
        carried, refused = changed_settings.split({})
    assert carried == {"functorch.donated_buffer": False, "functorch.activation_memory_budget": 0.5}
    assert set(refused) == {"functorch.enable_activation_offloading"}
    with functorch_config.patch(activation_memory_budget_solver="ilp"):  # needs scipy on the worker
        checked = [(n, json.dumps(v)) for n, v in changed_settings.split({})[0].items()]
    with pytest.raises(options.OptionNotAllowed):
        options.check_options("", checked)


def test_no_refused_setting_is_left_unreviewed():
    unreviewed = sorted(n for n, why in inductor_settings.refused().items() if "not reviewed" in why)
    assert not unreviewed, f"review these (scripts/gen_inductor_refused.py REVIEWED): {unreviewed}"


def test_a_process_that_packaged_with_aot_inductor_still_compiles_on_the_farm():
    # aoti_compile_and_package fills aot_inductor.metadata in place and leaves it so.
    # Patched through the config, not monkeypatch: on torch 2.11 monkeypatch's undo
    # deletes the setting, and every later compile of the process fails on it.
    with inductor_config.patch({"aot_inductor.metadata": {"AOTI_DEVICE_KEY": "cpu"}}):
        carried, refused = changed_settings.split({})
    assert not refused and "aot_inductor.metadata" not in carried


def test_no_switch_or_number_is_refused_as_a_path():
    # Names were matched by substring: `..._directions` was a "dir", `..._profile` a
    # "file", `..._threshold_...` an "ld_"; a user was told a boolean was a path.
    config = inductor_config._config
    wrong = sorted(
        name for name, why in inductor_settings.refused().items()
        if why.startswith("a path") and name in config
        and isinstance(config[name].default, (bool, int, float))
    )
    assert not wrong, f"refused as paths, but they hold a switch or a number: {wrong}"


def test_every_carried_setting_says_how_its_value_is_checked():
    for name, kinds in options.ALLOWED.items():
        if str in kinds:
            assert name in options.CHOICES or name in options.SUBSETS, name
    assert set(options.RANGES) | set(options.CHOICES) | set(options.SUBSETS) <= set(options.ALLOWED)


def test_this_torchs_default_of_every_carried_setting_passes_the_checks():
    # Types, ranges and choices agree with torch: its own values are never refused.
    # cpp.threads' -1 ("all of this machine's") is never sent: the SDK sends its count.
    for name in options.ALLOWED.keys() & inductor_config._config.keys() - {"cpp.threads"}:
        default = inductor_config._config[name].default
        assert options.check_options("", [(name, json.dumps(default))]) == {name: default}, name


def test_a_setting_torch_does_not_have_is_unknown_and_refused_with_a_reason():
    assert inductor_settings.classify("no_such_setting_yet") == "unknown"
    assert "newer" in inductor_settings.why_refused("no_such_setting_yet")


def _key(per_call: dict[str, object] | None = None) -> str:
    carried, refused = changed_settings.split(per_call or {})
    assert not refused
    request = build_request(relu_request().graph, local_fingerprint(), "", carried, "t")
    return keys.compute_key(request, "ns")


@pytest.mark.parametrize("name", ["max_autotune", "fallback_random"])
def test_a_globally_changed_setting_changes_the_key(name):
    plain = _key()
    with inductor_config.patch({name: True}):
        assert _key() != plain
    assert _key() == plain


def test_options_given_per_call_win_over_the_global_ones():
    with inductor_config.patch(max_autotune=True):
        assert changed_settings.split({"max_autotune": False})[0]["max_autotune"] is False


@pytest.mark.parametrize("name,value", [("freezing", True), ("cpp.cxx", ("/bin/sh",)), ("trace.enabled", True)])
def test_a_changed_refused_setting_is_named_with_why(name, value):
    with inductor_config.patch({name: value}):
        assert name in changed_settings.split({})[1]
    assert name in changed_settings.split({name: value})[1]


@pytest.mark.parametrize("name,value", [("freezing", False), ("trace.enabled", False)])
def test_a_refused_setting_passed_at_its_default_refuses_nothing(name, value):
    """`options={"freezing": False}` kept every graph off the farm, "changed"."""
    assert changed_settings.split({name: value}) == ({}, {})
    with inductor_config.patch({name: not value}):  # changed globally, set back per call
        assert changed_settings.split({name: value}) == ({}, {})
        assert name in changed_settings.split({})[1]


def test_client_only_settings_neither_travel_nor_refuse():
    with inductor_config.patch(compile_threads=1, fx_graph_cache=False):
        assert changed_settings.split({}) == ({}, {})


def test_the_worker_refuses_freezing_and_refused_settings_by_name():
    for name in ("freezing", "cpp.cxx", "trace.debug_dir"):
        with pytest.raises(options.OptionNotAllowed, match=name):
            options.check_options("", [(name, "true")])


@pytest.mark.parametrize("name,value", [("freezing", True), ("trace.enabled", True)])
def test_export_refuses_a_changed_refused_setting_by_name_before_reaching_a_farm(name, value):
    import sdk

    model = torch.nn.Linear(4, 2).eval()
    # Nothing listens there: a refused setting must stop the export before any call.
    with inductor_config.patch({name: value}), pytest.raises(GraphRejected, match=re.escape(name)):
        sdk.export(model, (torch.randn(2, 4),), remote="grpc://127.0.0.1:9")
    with pytest.raises(GraphRejected, match=re.escape(name)):
        sdk.export(model, (torch.randn(2, 4),), remote="grpc://127.0.0.1:9", inductor_configs={name: value})


NEWLY_CARRIED = [
    ("deterministic", True),
    ("cpu_gpu_bw", 25.0),
    ("memory_pool", "outputs"),
    ("triton.multi_kernel", 1),
    ("max_autotune_gemm_backends", "ATEN,TRITON"),
    ("cpp.enable_loop_tail_vec", False),
]


@pytest.mark.parametrize("name,value", NEWLY_CARRIED)
def test_a_newly_carried_setting_travels_enters_the_key_and_passes_the_farms_checks(name, value):
    plain = _key()
    with inductor_config.patch({name: value}):
        carried, refused = changed_settings.split({})
        assert carried == {name: value} and not refused
        request = build_request(relu_request().graph, local_fingerprint(), "", carried, "t")
        assert keys.compute_key(request, "ns") != plain
        # What the coordinator and the worker check, and the config patch the worker
        # applies (build_request adds the client's cpp.threads).
        applied = inductor_config_patch("", runtime.check_options(request), False)
        assert applied[name] == value and type(applied[name]) is type(value)


@pytest.mark.parametrize("name,raw", [
    ("cpu_gpu_bw", "NaN"),
    ("cpu_gpu_bw", "0"),  # a divisor
    ("memory_pool", '"everything"'),
    ("max_autotune_gemm_backends", '"ATEN,CUTLASS"'),  # a backend the workers are not checked against
    ("triton.multi_kernel", "4"),
    ("unbacked_symint_fallback", "1000000"),  # autotuning allocates at this size
    ("coordinate_descent_search_radius", "1000"),
    ("deterministic", "[" * 100_000),
])
def test_the_worker_refuses_a_hostile_value_of_a_carried_setting(name, raw):
    request = build_request(relu_request().graph, local_fingerprint(), "", {}, "t")
    request.options.inductor.add(name=name, json_value=raw)
    with pytest.raises(JobFailed, match=re.escape(f"{name!r}: value")) as info:
        runtime.check_options(request)
    assert info.value.code == JobError.OPTION_NOT_ALLOWED


@pytest.mark.slow
def test_newly_carried_settings_are_applied_on_the_worker(tmp_path):
    """Each changes the code the worker generates: the kernel's name in the wrapper, the
    C++ kernel's tail loop."""
    from torch._guards import TracingContext
    from torch._inductor.utils import fresh_cache

    from workers.compiler import compile_graph

    captured: dict[str, object] = {}

    def backend(gm, example_inputs):
        captured.update(gm=gm, inputs=example_inputs, fake_mode=TracingContext.get().fake_mode)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda t: (t.relu() + 1).sin(), backend=backend)(torch.randn(10))
    torch._dynamo.reset()

    def compiled(settings: dict[str, object]) -> tuple[set[bytes], bytes]:
        request = build_request(relu_request().graph, local_fingerprint(), "", settings, "t")
        cache = tmp_path / str(len(list(tmp_path.iterdir())))  # one per compile: no hits
        cache.mkdir()
        with fresh_cache(dir=str(cache)):
            result = compile_graph(
                captured["gm"], captured["inputs"], fake_mode=captured["fake_mode"],
                inductor_options=runtime.check_options(request),
            )
        (kernel,) = result.kernels
        return set(re.findall(rb"cpp_fused_\w+", result.payload)), kernel.source

    names, source = compiled({})
    assert names == {b"cpp_fused_add_relu_sin_0"}
    assert compiled({"cpp.descriptive_names": "inductor_node"})[0] == {b"cpp_fused_sin_add_relu_0"}
    assert compiled({"cpp.enable_loop_tail_vec": False})[1] != source
