"""Custom-op packages a worker loads (issue 43): the reviewed defaults, loaded where their
package is installed and with no setting; what a refusal tells the operator to set; and
that no graph makes the worker import anything (torchfarm/fx/torch_library.py,
docs/security.md)."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from tests.unit.test_customops import _graph
from torchfarm.fx import torch_library
from torchfarm.graph.customops import DEFAULT_INSTALLED_OP_MODULES, RefusedCustomOp, reviewed_module
from workers.settings import WorkerSettings


@pytest.fixture
def fresh_worker():
    """This process's record of installed namespaces, empty, as a worker's at start (and
    empty again after the test: its list is no other test's)."""
    torch_library.use_installed(())
    try:
        with torch_library.job_scope():
            yield
    finally:
        torch_library.use_installed(())


def test_a_worker_with_no_setting_loads_the_reviewed_list():
    assert WorkerSettings().installed_op_modules == DEFAULT_INSTALLED_OP_MODULES
    assert "transformers=transformers.integrations.moe" in DEFAULT_INSTALLED_OP_MODULES
    assert reviewed_module("transformers") == "transformers.integrations.moe"
    assert reviewed_module("tfnothing") is None


def test_an_empty_setting_loads_none():
    from torchfarm.settings import from_env

    settings = from_env(WorkerSettings, {"TORCHFARM_INSTALLED_OP_MODULES": ""})
    assert settings.installed_op_modules == ()


def test_the_moe_op_is_the_real_one_on_a_worker_with_transformers(fresh_worker):
    """With transformers installed, the defaults register its op: a graph's call uses the
    real op (its autograd included), not a stand-in, and no schema of the tenant's can
    replace it (a declaration the package lacks is refused, never defined)."""
    pytest.importorskip("transformers")
    torch_library.use_installed(DEFAULT_INSTALLED_OP_MODULES)
    assert "transformers" in torch_library._installed
    schema = torch_library.ensure_op(str(torch.ops.transformers.grouped_mm_fallback.default._schema))
    assert schema.target not in torch_library._standins
    assert torch_library.resolve(schema) is torch.ops.transformers.grouped_mm_fallback.default
    with pytest.raises(RefusedCustomOp, match="same version"):
        torch_library.ensure_op("transformers::tf_not_in_the_package(Tensor x) -> Tensor")


def test_a_reviewed_entry_without_its_package_is_skipped_and_named_in_the_refusal(
    fresh_worker, monkeypatch,
):
    entry = "tfabsent=tf_absent_package.ops"
    monkeypatch.setattr(torch_library, "DEFAULT_INSTALLED_OP_MODULES", (entry,))
    assert importlib.util.find_spec("tf_absent_package") is None
    torch_library.use_installed((entry,))  # a worker without the package still starts
    assert "tfabsent" not in torch_library._installed
    assert torch_library.to_serve("tfabsent") == (
        "install the package of tf_absent_package.ops on the workers "
        "(TORCHFARM_INSTALLED_OP_MODULES lists tfabsent=tf_absent_package.ops)"
    )


def test_an_operators_entry_that_does_not_import_stops_the_worker(fresh_worker):
    with pytest.raises(ModuleNotFoundError):
        torch_library.use_installed(("tfbroken=tf_absent_package.ops",))


def test_the_refusal_names_the_exact_setting(fresh_worker):
    """On a worker whose operator left transformers out, the refusal says what to set."""
    torch_library.use_installed(())
    assert torch_library.to_serve("transformers") == (
        "the workers' operator sets "
        "TORCHFARM_INSTALLED_OP_MODULES=transformers=transformers.integrations.moe "
        "(added to any entries it lists)"
    )
    assert "TORCHFARM_INSTALLED_OP_MODULES=tfown=<the module whose import registers it>" in (
        torch_library.to_serve("tfown")
    )


def test_a_later_list_replaces_the_earlier(fresh_worker):
    """A worker's list is set, not added to: a process that was given another list
    (another runtime's settings) serves the last one only."""
    torch_library.use_installed(("tfjson=json",))
    assert torch_library.to_serve("tfjson").startswith("install the package of json")
    torch_library.use_installed(())
    assert torch_library.to_serve("tfjson").startswith("the workers' operator sets")


def test_a_stand_in_that_needs_its_backward_refuses_with_the_setting(fresh_worker):
    torch_library.use_installed(())
    schema = torch_library.ensure_op("tfgradneed::f(Tensor x) -> Tensor")
    op = torch_library.resolve(schema)
    with pytest.raises(RefusedCustomOp, match=r"TORCHFARM_INSTALLED_OP_MODULES=tfgradneed="):
        op(torch.ones(2, requires_grad=True))


def test_an_existing_op_outside_the_list_names_the_setting(fresh_worker):
    torch.library.define("tfexisting2::foo", "(Tensor x) -> Tensor")
    with pytest.raises(RefusedCustomOp, match=r"TORCHFARM_INSTALLED_OP_MODULES=tfexisting2="):
        torch_library.ensure_op("tfexisting2::foo(Tensor x) -> Tensor")


@pytest.mark.parametrize("namespace", ["json", "tf_absent_package", "transformers"])
def test_no_graph_makes_the_worker_import_a_module(fresh_worker, monkeypatch, namespace):
    """docs/security.md: only the operator's list is imported, at start. A graph whose
    namespace names a module (one of the reviewed list's included) imports nothing."""
    from torchfarm.fx.decode import decode_graph

    imported: list[str] = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    target = f"torch.ops.{namespace}.tf_probe.default"
    g = _graph((target, f"{namespace}::tf_probe(Tensor x) -> Tensor"), call_target=target)
    if namespace == "transformers":
        pytest.importorskip("transformers")
        torch_library.use_installed(DEFAULT_INSTALLED_OP_MODULES)
        imported.clear()
        with pytest.raises(RefusedCustomOp, match="missing in"):
            decode_graph(g)
    else:
        decoded = decode_graph(g)  # a stand-in, defined from the schema alone
        assert any(n.target is torch_library.resolve(torch_library.parse_schema(g.custom_ops[0].schema))
                   for n in decoded.gm.graph.nodes)
    assert [m for m in imported if not m.startswith("torch.")] == []  # torch imports its own
