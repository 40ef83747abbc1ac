"""Every torch internal the farm relies on exists in the installed torch, with the
parameters the code assumes (torchfarm/fx/internals.py)."""

from __future__ import annotations

import pytest
import torch

from torchfarm.fx import internals


@pytest.mark.parametrize("name", sorted(internals.INTERNALS))
def test_each_internal_is_as_assumed(name):
    assert internals.check(name) is None


def test_the_running_torch_is_supported_and_has_a_seam():
    assert internals.torch_minor() in internals.SUPPORTED
    assert set(internals.SEAM) == set(internals.SUPPORTED)


def test_a_moved_internal_is_reported_by_name(monkeypatch):
    moved = internals.Internal("torch._inductor", "no_such_function", ("gm",))
    monkeypatch.setitem(internals.SEAM[internals.torch_minor()], "standalone_compile", moved)
    assert "torch._inductor.no_such_function" in internals.check("standalone_compile")
    with pytest.raises(internals.InternalMissing, match="standalone_compile"):
        internals.resolve("standalone_compile")


def test_a_changed_signature_is_reported(monkeypatch):
    changed = internals.Internal("torch._inductor", "standalone_compile", ("model", "inputs"))
    monkeypatch.setitem(internals.SEAM[internals.torch_minor()], "standalone_compile", changed)
    assert "the farm assumes ['model', 'inputs']" in internals.check("standalone_compile")


def test_an_unsupported_torch_is_refused_by_version():
    with pytest.raises(internals.InternalMissing, match="torch 2.10 is not supported"):
        internals.internal("standalone_compile", (2, 10))
    assert internals.torch_minor("2.12.1+cu128") == (2, 12)


def test_resolve_gives_the_object_itself():
    assert internals.resolve("standalone_compile") is torch._inductor.standalone_compile
