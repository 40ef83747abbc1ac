"""Explained misses (torchfarm/storage/explain.py) through the coordinator's Farm, against a real
redis-server: every key component, changed alone, is the one a miss names."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from cli.explain import render
from localfarm.fakes import InlineDispatcher
from services.coordinator.errors import NotFound
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings
from tests.requests import queue_of, relu_request
from torchfarm.storage import explain
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import keys

pytestmark = pytest.mark.integration

@pytest.fixture
def farm(store):
    return Farm(CoordinatorSettings(poll_interval_s=0.01), store, InlineDispatcher())


def submit(farm, request, *tenant):
    """Submits `request`, with a worker of its own target and build live (the farm routes
    on both; these tests vary them)."""
    queue = queue_of(request)
    farm.store.heartbeat(f"w-{queue}", [queue], "test", ttl_s=30)
    return asyncio.run(farm.submit(request, request.ByteSize(), *tenant))


def _gpu(request, arch: str):
    request.target.device, request.target.arch = "cuda", arch
    return request


def _sigmoid(request):
    request.graph.nodes[1].target = "torch.sigmoid"
    return request


def _wider(request):
    request.graph.nodes[0].tensor.shape[0].expr = "8"
    request.graph.nodes[0].tensor.shape[0].hint = 8
    return request


CHANGES = {
    "torch_build": (relu_request(), relu_request(torch_version="2.14.0+cpu")),
    "triton": (relu_request(), relu_request(triton_version="3.8.0")),
    "cpu_isa": (relu_request(), relu_request(isa="avx2")),
    "gpu_arch": (_gpu(relu_request(), "sm_90"), _gpu(relu_request(), "sm_80")),
    "options": (relu_request(), relu_request(mode="max-autotune-no-cudagraphs")),
    "input_metadata": (relu_request(), relu_request(dtype="float16")),
    "graph": (relu_request(), _sigmoid(relu_request())),
}


def _compiler(request):
    request.target.compiler = "g++ 13.1.0; -march=native (sapphirerapids)"
    return request


CHANGES["compiler"] = (relu_request(), _compiler(relu_request()))


@pytest.mark.parametrize("component", explain.COMPONENTS)
def test_a_miss_names_the_one_component_that_changed(farm, component):
    before, after = CHANGES[component]
    first = submit(farm, before)
    assert first.explanation is not None and first.explanation.reason == "new"

    missed = submit(farm, after)
    assert not missed.cache_hit and missed.explanation is not None
    assert missed.explanation.reason == component, missed.explanation
    assert missed.explanation.differs == (component,)
    assert missed.explanation.closest_key == keys.compute_key(before)
    assert component in missed.explanation.detail


def test_the_graph_explanation_names_the_first_differing_node(farm):
    submit(farm, relu_request())
    missed = submit(farm, _sigmoid(relu_request()))
    assert "first differing node #1" in missed.explanation.detail
    assert "torch.relu" in missed.explanation.detail and "torch.sigmoid" in missed.explanation.detail


def test_a_changed_graph_of_another_shape_is_found_by_its_model_and_names_the_graph(farm):
    submit(farm, relu_request(label="mlp graph 0 from host-a"))
    changed = _wider(_sigmoid(relu_request(label="mlp graph 0 from host-b")))
    missed = submit(farm, changed)
    assert missed.explanation.reason == "input_metadata"  # first in order, and
    assert missed.explanation.differs == ("input_metadata", "graph")  # the graph too


def test_the_closest_artifact_is_the_one_with_fewest_differences(farm):
    submit(farm, relu_request(isa="avx2", triton_version="3.8.0"))
    submit(farm, relu_request(triton_version="3.8.0"))
    missed = submit(farm, relu_request())
    assert missed.explanation.reason == "triton"
    assert missed.explanation.closest_key == keys.compute_key(relu_request(triton_version="3.8.0"))


def test_the_same_key_missing_again_is_evicted(farm, store):
    request = relu_request()
    submit(farm, request)
    store.delete_job(keys.compute_key(request))  # the job and its artifact are gone
    again = submit(farm, request)
    assert again.explanation.reason == "evicted"


def test_an_unrelated_graph_is_new(farm):
    submit(farm, relu_request(label="one model graph 0"))
    other = _sigmoid(relu_request(label="another model graph 0"))
    assert submit(farm, other).explanation.reason == "new"


def test_tenants_do_not_see_each_others_records(farm, store):
    from torchfarm.trust.tokens import Tenant

    submit(farm, relu_request())
    other = Tenant(name="b", namespace="b")
    result = submit(farm, relu_request(isa="avx2"), other)
    assert result.explanation.reason == "new"


def test_a_joined_submit_carries_the_explanation_and_explain_returns_it(farm):
    submit(farm, relu_request())
    first = submit(farm, relu_request(isa="avx2"))
    joined = submit(farm, relu_request(isa="avx2"))
    assert joined.deduplicated and joined.explanation == first.explanation
    found = asyncio.run(farm.explain(first.key))
    assert found == first.explanation
    with pytest.raises(NotFound):
        asyncio.run(farm.explain("0" * 64))
    text = render(first.key, found.to_proto())
    assert "missed: cpu_isa" in text and "avx2" in text


def test_misses_are_counted_by_reason(farm):
    def count(reason: str) -> float:
        return REGISTRY.get_sample_value("torchfarm_misses_total", {"reason": reason}) or 0.0

    new, isa = count("new"), count("cpu_isa")
    submit(farm, relu_request())
    submit(farm, relu_request(isa="avx2"))
    assert (count("new"), count("cpu_isa")) == (new + 1, isa + 1)
    labels = {s.labels["reason"] for m in REGISTRY.collect() if m.name == "torchfarm_misses"
              for s in m.samples}
    assert labels <= set(explain.REASONS)


def test_the_reply_carries_the_explanation():
    e = explain.Explanation("graph", "ab" * 32, "detail", ("graph",))
    reply = farm_pb2.SubmitReply(key="k", explanation=e.to_proto())
    again = farm_pb2.SubmitReply.FromString(reply.SerializeToString())
    assert again.explanation.reason == "graph" and list(again.explanation.differs) == ["graph"]
    assert graph_pb2.Node.Op.Name(graph_pb2.Node.PLACEHOLDER) == "PLACEHOLDER"
