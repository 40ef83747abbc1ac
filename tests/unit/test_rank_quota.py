"""A DTensor graph costs its tenant's quota once per rank the worker's rank check traces
(issue 40): a graph on a replicated 17-rank mesh counts 17 jobs in flight, not 1."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InProcessFarm
from services.coordinator.errors import TenantQueueFull
from services.coordinator.settings import CoordinatorSettings
from tests.requests import queue_of, relu_request
from torchfarm.storage.store import JobState
from torchfarm.v1 import farm_pb2, graph_pb2


def _distinct(i: int) -> farm_pb2.CompileRequest:
    request = relu_request()
    request.graph.nodes[0].tensor.shape[0].expr = str(10 + i)
    request.graph.nodes[0].tensor.shape[0].hint = 10 + i
    return request


def _on_mesh(world: int, i: int) -> farm_pb2.CompileRequest:
    request = _distinct(i)
    request.graph.meshes.append(graph_pb2.DeviceMesh(
        device_type="cpu", shape=[world], ranks=list(range(world)), group_names=["0"],
    ))
    x = request.graph.nodes[0]  # the input, replicated on the mesh
    x.dtensor.CopyFrom(graph_pb2.DTensorMeta(
        mesh=0, placements=[graph_pb2.Placement(replicate=graph_pb2.NoneValue())],
        shape=x.tensor.shape, stride=x.tensor.stride,
    ))
    return request


def _submit(farm: InProcessFarm, request: farm_pb2.CompileRequest):  # noqa: ANN202
    return asyncio.run(farm.farm.submit(request, request.ByteSize()))


def test_a_graph_on_a_replicated_mesh_costs_the_quota_once_per_traced_rank():
    farm = InProcessFarm(settings=CoordinatorSettings(poll_interval_s=0.01, max_jobs_per_tenant=20))
    farm.store.heartbeat("w", [queue_of(relu_request())], "build", 3600)  # a worker that serves them
    first = _submit(farm, _on_mesh(17, 0))
    assert farm.store.jobs_in_flight("") == 17
    _submit(farm, _distinct(1))
    with pytest.raises(TenantQueueFull, match="counts 17, once per rank"):
        _submit(farm, _on_mesh(17, 2))
    assert farm.store.jobs_in_flight("") == 18  # the refused one left no count behind
    _submit(farm, _on_mesh(2, 3))  # 2 ranks traced: 20
    assert farm.store.jobs_in_flight("") == 20
    farm.store.update_job(first.key, state=JobState.FAILED)
    assert farm.store.jobs_in_flight("") == 3
    _submit(farm, _on_mesh(17, 2))
    assert farm.store.jobs_in_flight("") == 20
