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
