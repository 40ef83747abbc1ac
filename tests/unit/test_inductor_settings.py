"""Every Inductor setting is carried, refused by name, or client-only
(torchfarm/wire/inductor_settings.py); changed ones travel in the key or keep a graph local."""

from __future__ import annotations

import pytest
import torch._inductor.config as inductor_config

from sdk import changed_settings
from sdk.backend import build_request
from tests.requests import relu_request
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.wire import inductor_settings, keys, options


def test_every_inductor_setting_of_this_torch_is_classified():
    # Nested configs (cpp., triton., aot_inductor., ...) are flattened into these names.
    names = list(inductor_config._config)
    assert any(n.startswith("cpp.") for n in names) and any(n.startswith("triton.") for n in names)
    unknown = [n for n in names if inductor_settings.classify(n) == "unknown"]
    assert not unknown, f"Inductor settings neither carried nor refused: {unknown}"


def test_no_setting_is_in_two_classes_and_every_carried_one_exists():
    carried, client, refused = set(options.ALLOWED), set(inductor_settings.CLIENT_ONLY), set(inductor_settings.refused())
    assert not (carried & client or carried & refused or client & refused)
    assert carried <= set(inductor_config._config)


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


def test_client_only_settings_neither_travel_nor_refuse():
    with inductor_config.patch(compile_threads=1, fx_graph_cache=False):
        assert changed_settings.split({}) == ({}, {})


def test_the_worker_refuses_freezing_and_refused_settings_by_name():
    for name in ("freezing", "cpp.cxx", "trace.debug_dir"):
        with pytest.raises(options.OptionNotAllowed, match=name):
            options.check_options("", [(name, "true")])
