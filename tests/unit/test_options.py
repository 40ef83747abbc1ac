"""The compile-option allow-list: what reaches a worker's Inductor config."""

from __future__ import annotations

import pytest

from torchfarm.wire.options import (
    SDPA_BACKENDS,
    OptionNotAllowed,
    check_autocast,
    check_options,
    check_sdpa_backends,
)


def test_modes_and_tuning_options_pass():
    assert check_options("max-autotune", [("max_autotune", "true"), ("max_fusion_size", "32")]) == {
        "max_autotune": True, "max_fusion_size": 32,
    }
    assert check_options("", [("cpp.simdlen", "null")]) == {"cpp.simdlen": None}
    assert check_options("", [("cpp.threads", "64")]) == {"cpp.threads": 64}
    # JSON's 25 is torch's 25.0; backend lists reach torch upper-cased, as it reads them.
    assert check_options("", [("cpu_gpu_bw", "25")]) == {"cpu_gpu_bw": 25.0}
    assert check_options("", [("max_autotune_gemm_backends", '"aten, triton"')]) == {
        "max_autotune_gemm_backends": "ATEN,TRITON",
    }
    assert check_options("", [("memory_pool", '"combined"')]) == {"memory_pool": "combined"}


@pytest.mark.parametrize(
    "mode, opts, match",
    [
        ("", [("cpp.cxx", '[null, "/bin/sh"]')], "allow-list"),  # the compiler binary: RCE
        ("", [("trace.debug_dir", '"/etc"')], "allow-list"),
        ("", [("post_grad_custom_post_pass", "null")], "allow-list"),
        ("", [("max_autotune", "1")], "not allowed"),  # int for a bool
        ("", [("max_fusion_size", "true")], "not allowed"),  # bool for an int
        ("", [("max_fusion_size", str(10**9))], "not allowed"),
        ("", [("cpp.threads", str(1 << 20))], "not allowed"),  # a team of a million threads
        ("", [("cpp.threads", "0")], "not allowed"),
        ("", [("max_autotune", "tru")], "not JSON"),
        ("", [("max_autotune", "[" * 200)], "not JSON"),
        ("", [("max_autotune", "[" * 100_000)], "longer than"),  # json.loads would recurse
        ("", [("cpu_gpu_bw", "NaN")], "not allowed"),
        ("", [("cpu_gpu_bw", "1e999")], "not allowed"),  # infinity
        ("", [("cpu_gpu_bw", "-5.0")], "not allowed"),
        ("", [("cpu_gpu_bw", '"50"')], "not allowed"),
        ("", [("partitioned_scatter_memory_budget", "1.5")], "not allowed"),
        ("", [("unbacked_symint_fallback", "65536")], "not allowed"),
        ("", [("inductor_default_autotune_rep", "100000")], "not allowed"),
        ("", [("triton.multi_kernel", "true")], "not allowed"),
        ("", [("memory_pool", '"all"')], "not allowed"),
        ("", [("memory_pool", "null")], "not allowed"),
        ("", [("max_autotune_gemm_backends", '"ATEN,CUTLASS"')], "not allowed"),
        ("", [("max_autotune_gemm_backends", '"ATEN,ATEN"')], "not allowed"),
        ("", [("max_autotune_gemm_backends", '""')], "not allowed"),
        ("", [("cpp.march", '"native"')], "allow-list"),  # goes on the compiler's command line
        ("", [("sleep_sec_TESTING_ONLY", "3600")], "allow-list"),
        ("", [("max_autotune", "true"), ("max_autotune", "false")], "twice"),
        ("turbo", [], "mode"),
    ],
)
def test_everything_else_is_refused(mode, opts, match):
    with pytest.raises(OptionNotAllowed, match=match):
        check_options(mode, opts)


def test_autocast_is_checked_against_known_devices_and_precisions():
    assert check_autocast([("cuda", "float16"), ("cpu", "bfloat16")]) == {"cuda": "float16", "cpu": "bfloat16"}
    for entries, match in [
        ([("tpu", "bfloat16")], "device type 'tpu'"),
        ([("cpu", "float64")], "autocast to 'float64'"),
        ([("cpu", "bfloat16"), ("cpu", "float16")], "given twice"),
    ]:
        with pytest.raises(OptionNotAllowed, match=match):
            check_autocast(entries)


def test_sdpa_backends_are_torchs_each_once_and_never_the_default():
    assert check_sdpa_backends(["MATH", "FLASH_ATTENTION"]) == ["MATH", "FLASH_ATTENTION"]
    for names, match in [
        (["MATH", "FAST"], "'FAST' is not one torch has"),
        (["MATH", "MATH"], "given twice"),
        (list(SDPA_BACKENDS), "sent as none"),
    ]:
        with pytest.raises(OptionNotAllowed, match=match):
            check_sdpa_backends(names)
