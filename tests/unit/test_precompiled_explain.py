"""Explained precompiled misses (torchfarm/storage/explain.py, sdk/precompile_key.py `record`),
through the SDK's client and the coordinator's servicer in this process: every key
component of a package, changed alone, is the one a miss names, with the part that
differs; the records the farm keeps are bounded."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import REGISTRY

from localfarm.fakes import InProcessFarm
from localfarm.inprocess import InProcessClient
from sdk.errors import GraphRejected
from sdk.precompile_key import components, precompiled_key, record
from tests.unit.test_precompile import Net, _package
from torchfarm.storage import explain
from torchfarm.v1 import farm_pb2

BUILD = {
    "torch_version": "2.13.0+cpu", "torch_git": "0123456789abcdef", "triton_version": "3.7.0",
    "python": "3.11", "platform": "linux-x86_64", "device": "cpu", "arch": "", "isa": "avx512",
    "compiler": "g++ 14.2.0; -march=native (sapphirerapids)",
}
OPTIONS = {"mode": "", "inductor": {}}


class Edited(Net):
    """Net after its author edited `forward`: the same class, by name, with other code."""

    def forward(self, x):
        return self.lin(x).sigmoid()


Edited.__module__, Edited.__qualname__ = Net.__module__, Net.__qualname__


def _frozen() -> Net:
    net = Net()
    net.lin.bias.requires_grad_(False)
    return net


def _eval() -> Net:
    return Net().eval()


def _case(model=Net, x=(2, 4), build=None, options=None):
    """A package's key and record: `model` called on a tensor of shape `x`."""
    net = model()
    parts = components(net, (torch.randn(*x),), {})
    build, options = {**BUILD, **(build or {})}, options or OPTIONS
    return precompiled_key(parts, build, options, ""), record(net, parts, build, options)


CHANGES = {
    "torch_build": {"build": {"torch_version": "2.14.0+cpu"}},
    "triton": {"build": {"triton_version": "3.8.0"}},
    "cpu_isa": {"build": {"isa": "avx2"}},
    "gpu_arch": {"build": {"device": "cuda", "arch": "sm_90"}},
    "compiler": {"build": {"compiler": "g++ 13.1.0; -march=native (znver4)"}},
    "options": {"options": {"mode": "max-autotune-no-cudagraphs", "inductor": {}}},
    "model_code": {"model": Edited},
    "module_tree": {"model": _eval},
    "parameters": {"model": _frozen},
    "input_metadata": {"x": (3, 4)},
}
PART = {"model_code": "Net.forward", "module_tree": "(root)", "parameters": "lin.bias", "input_metadata": "input 0"}


@pytest.fixture
def farm():
    return InProcessFarm()


def _client(farm: InProcessFarm) -> InProcessClient:
    return InProcessClient(farm.farm)


def _upload(client: InProcessClient, key: str, rec: farm_pb2.PrecompiledRecord | None) -> None:
    manifest, payload = _package(key=key)
    client.put_precompiled(manifest.to_json(), {manifest.payload.digest: payload}, rec)


def test_the_record_names_every_component_and_leaves_out_code_and_data():
    key, rec = _case()
    assert set(rec.components) == set(explain.PRECOMPILED_COMPONENTS)
    assert rec.model == f"{Net.__module__}.Net"
    assert {p.component for p in rec.parts} == {"model_code", "module_tree", "parameters", "input_metadata"}
    assert all(len(v) <= explain.MAX_TEXT for v in rec.components.values())
    assert "relu" not in str(rec)  # the class's source travels as a digest only


@pytest.mark.parametrize("component", explain.PRECOMPILED_COMPONENTS)
def test_a_precompiled_miss_names_the_one_component_that_changed(farm, component):
    client = _client(farm)
    before_key, before = _case()
    _upload(client, before_key, before)
    after_key, after = _case(**CHANGES[component])
    assert after_key != before_key

    found = client.explain_precompiled(after_key, after)
    assert (found.reason, list(found.differs), found.closest_key) == (component, [component], before_key)
    assert component in found.detail
    if component in PART:
        assert f"{PART[component]}:" in found.detail, found.detail


def test_the_same_record_missing_again_is_evicted_and_an_unseen_model_is_new(farm):
    client = _client(farm)
    key, rec = _case()
    assert client.explain_precompiled(key, rec).reason == "new"
    _upload(client, key, rec)
    assert client.explain_precompiled(key, rec).reason == "evicted"


def test_the_closest_package_is_the_one_with_fewest_differences(farm):
    client = _client(farm)
    far_key, far = _case(x=(3, 4), build={"isa": "avx2"})
    near_key, near = _case(build={"isa": "avx2"})
    _upload(client, far_key, far)
    _upload(client, near_key, near)
    key, rec = _case()
    found = client.explain_precompiled(key, rec)
    assert (found.closest_key, found.reason, list(found.differs)) == (near_key, "cpu_isa", ["cpu_isa"])


def test_an_upload_without_a_record_is_stored_and_explains_nothing(farm):
    client = _client(farm)
    key, rec = _case()
    _upload(client, key, None)
    assert farm.store.get_manifest(key) is not None
    assert client.explain_precompiled(_case(x=(3, 4))[0], rec).reason == "new"


def test_explain_returns_the_last_precompiled_explanation(farm):
    client = _client(farm)
    key, rec = _case()
    _upload(client, key, rec)
    other_key, other = _case(x=(5, 4))
    client.explain_precompiled(other_key, other)
    found = client.stub.ExplainMiss(farm_pb2.JobRef(key=other_key))
    assert (found.reason, found.closest_key) == ("input_metadata", key)


def test_precompiled_misses_are_counted_by_reason(farm):
    def count(reason):
        return REGISTRY.get_sample_value("torchfarm_precompiled_misses_total", {"reason": reason}) or 0.0

    client = _client(farm)
    key, rec = _case()
    _upload(client, key, rec)
    before = count("input_metadata")
    client.explain_precompiled(*_case(x=(6, 4)))
    assert count("input_metadata") == before + 1
    assert all(REGISTRY.get_sample_value("torchfarm_precompiled_misses_total", {"reason": r}) is not None
               for r in explain.REASONS)


def test_tenants_do_not_see_each_others_packages(farm):
    key, rec = _case()
    _upload(_client(farm), key, rec)
    found = farm.farm.store.tenant("team-b")
    assert explain.MissIndex(found).explain_precompiled(rec, _case(x=(3, 4))[0]).reason == "new"


def _bad(change):
    rec = _case()[1]
    change(rec)
    return rec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.components.__setitem__("secret_env", "x"), "unknown components"),
        (lambda r: r.parts.add(component="graph", name="n", value="v"), "unknown components"),
        (lambda r: r.components.__setitem__("options", "x" * 10_000), "over 256 characters"),
        (lambda r: r.parts.extend(farm_pb2.PrecompiledPart(component="parameters", name=str(i), value="v")
                                  for i in range(explain.MAX_PARTS)), "parts, over"),
        (lambda r: r.ClearField("model"), "names no model"),
    ],
)
def test_a_record_no_client_makes_is_refused_on_upload_and_on_a_miss(farm, change, message):
    client = _client(farm)
    key, _ = _case()
    rec = _bad(change)
    with pytest.raises(GraphRejected, match=message):
        _upload(client, key, rec)
    assert farm.store.get_manifest(key) is None  # nothing stored of a refused upload
    with pytest.raises(GraphRejected, match=message):
        client.explain_precompiled(key, rec)


def test_a_miss_of_a_key_that_is_no_precompiled_key_is_refused(farm):
    with pytest.raises(GraphRejected, match="not a precompiled key"):
        _client(farm).explain_precompiled("f" * 64, _case()[1])
