"""DTensor graphs in the format: captured from `torch.distributed.tensor.parallel`,
described rank by rank, validated, and rebuilt on a worker inside fake groups.

Captures run under PyTorch's fake process group in this process (nothing is sent) and
leave no process group behind. tests/integration/test_distributed.py trains them through
a farm on gloo ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.unit.test_collectives import fake_world
from torchfarm.fx import internals
from torchfarm.fx.encode import encode_graph
from torchfarm.graph import dtensor
from torchfarm.graph.exportcheck import validate_export
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire.keys import graph_digest
from workers import fakepg


def skip_before_recorded_from_local() -> None:
    """Skips the test on torch 2.11, whose Dynamo records DTensor.from_local as a
    closure, which the SDK refuses (torchfarm/fx/encode.py)."""
    if internals.torch_minor() < (2, 12):
        pytest.skip("torch 2.11's Dynamo records DTensor.from_local as a closure, which the SDK refuses")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def capture_tp(rank: int, world: int = 2) -> graph_pb2.Graph:
    """The Colwise/Rowwise MLP's graph as rank `rank` of `world` encodes it."""
    skip_before_recorded_from_local()
    return _capture_tp(rank, world)


def _capture_tp(rank: int, world: int) -> graph_pb2.Graph:
    graphs: list[graph_pb2.Graph] = []

    def backend(gm, example_inputs):
        graphs.append(encode_graph(gm, example_inputs))
        return gm.forward

    with fake_world(rank, world):
        mesh = init_device_mesh("cpu", (world,))
        model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        torch._dynamo.reset()
        torch.compile(model, backend=backend, fullgraph=True)(torch.randn(4, 8))
    (graph,) = graphs
    return graph


@pytest.fixture(scope="module")
def tp_graph() -> graph_pb2.Graph:
    return capture_tp(1)


@pytest.mark.skipif(internals.torch_minor() >= (2, 12), reason="torch 2.12 and newer record DTensor.from_local")
def test_torch_2_11s_from_local_closure_is_refused_by_name():
    with pytest.raises(Exception, match="DTensor.from_local as this torch's Dynamo records it"):
        _capture_tp(1, 2)


def _placeholders(graph: graph_pb2.Graph) -> list[graph_pb2.Node]:
    return [n for n in graph.nodes if n.op == graph_pb2.Node.PLACEHOLDER]


def test_a_tensor_parallel_graph_carries_its_mesh_its_shards_and_the_rank(tp_graph):
    (mesh,) = tp_graph.meshes
    assert (list(mesh.shape), list(mesh.ranks), mesh.device_type) == ([2], [0, 1], "cpu")
    assert list(mesh.group_names) == ["0"]  # the world's group: its collectives pass "0"
    assert tp_graph.rank == 1
    placeholders = _placeholders(tp_graph)
    assert sum(n.HasField("mesh") for n in placeholders) == 1
    shards = {n.target: n for n in placeholders if n.HasField("dtensor")}
    assert len(shards) == 4  # both layers' weights and biases
    up_weight = next(n for t, n in shards.items() if "up" in t and "weight" in t)
    assert [s.expr for s in up_weight.tensor.shape] == ["8", "8"]  # this rank's half of 16 rows
    assert [s.expr for s in up_weight.dtensor.shape] == ["16", "8"]
    assert [p.WhichOneof("kind") for p in up_weight.dtensor.placements] == ["shard"]
    assert up_weight.dtensor.placements[0].shard == 0
    assert up_weight.tensor.kind == graph_pb2.TensorMeta.PARAMETER and up_weight.tensor.requires_grad
    targets = {n.target for n in tp_graph.nodes}
    assert dtensor.FROM_LOCAL in targets and {"redistribute", "to_local"} <= targets
    validate_graph(tp_graph)


def test_the_ranks_graphs_differ_in_the_rank_alone(tp_graph):
    """DTensor's dispatch on the worker takes the rank's shard: the rank is in the key."""
    other = capture_tp(0)
    assert graph_digest(other) != graph_digest(tp_graph)
    other.rank = tp_graph.rank
    assert other.SerializeToString(deterministic=True) == tp_graph.SerializeToString(deterministic=True)


def test_a_worker_rebuilds_the_clients_mesh_and_shards_with_no_process_group(tp_graph):
    assert not dist.is_initialized()
    decoded = fakepg.decoded(tp_graph)
    assert not dist.is_initialized()
    inputs = dict(zip((n.target for n in _placeholders(tp_graph)), decoded.example_inputs, strict=True))
    mesh = next(v for v in inputs.values() if not isinstance(v, torch.Tensor))
    assert mesh.get_coordinate() == (1,) and mesh._dim_group_names == ["0"]
    up_weight = next(v for t, v in inputs.items() if "up" in t and "weight" in t)
    assert isinstance(up_weight, DTensor) and isinstance(up_weight, nn.Parameter)
    assert up_weight.placements == (Shard(0),) and tuple(up_weight.shape) == (16, 8)
    assert tuple(up_weight._local_tensor.shape) == (8, 8)
    down_bias = next(v for t, v in inputs.items() if "down" in t and "bias" in t)
    assert down_bias.placements == (Replicate(),)
    output = next(n for n in decoded.gm.graph.nodes if n.op == "output")
    (result,) = output.args[0]
    assert tuple(result.meta["val"].shape) == (4, 8)  # propagated: the full output, a plain tensor


def test_fake_groups_give_a_mesh_dimension_the_clients_members():
    """A 2x2 mesh on rank 3: dimension 0's group is ranks 1 and 3, dimension 1's 2 and 3."""
    mesh = graph_pb2.DeviceMesh(device_type="cpu", shape=[2, 2], ranks=[0, 1, 2, 3], group_names=["5", "6"])
    graph = graph_pb2.Graph(meshes=[mesh], rank=3)
    from torch._C._distributed_c10d import _resolve_process_group

    with fakepg.fake_groups(graph):
        assert dist.get_rank() == 3
        assert dist.get_process_group_ranks(_resolve_process_group("5")) == [1, 3]
        assert dist.get_process_group_ranks(_resolve_process_group("6")) == [2, 3]
    assert not dist.is_initialized()


def _refused(graph: graph_pb2.Graph, match: str) -> None:
    with pytest.raises(MalformedGraph, match=match):
        validate_graph(graph)


def _copy(graph: graph_pb2.Graph) -> graph_pb2.Graph:
    copy = graph_pb2.Graph()
    copy.CopyFrom(graph)
    return copy


def _dtensor_node(graph: graph_pb2.Graph) -> graph_pb2.Node:
    return next(n for n in graph.nodes if n.HasField("dtensor"))


def test_a_rank_outside_the_mesh_is_refused(tp_graph):
    g = _copy(tp_graph)
    g.rank = 5
    _refused(g, "rank 5 is not in it")


def test_a_rank_without_a_mesh_is_refused():
    _refused(graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1, rank=1), "carries no rank")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda m: m.ranks.__setitem__(1, 0), "distinct ranks"),
        (lambda m: m.shape.__setitem__(0, 3), "distinct ranks"),
        (lambda m: m.group_names.__setitem__(0, "a b"), "not a process group name"),
        (lambda m: m.group_names.append("1"), "one group name per dimension"),
        (lambda m: setattr(m, "device_type", "tpu"), "unknown device type"),
        (lambda m: m.dim_names.extend(["tp", "dp"]), "one distinct name per dimension"),
    ],
)
def test_a_malformed_mesh_is_refused(tp_graph, mutate, match):
    g = _copy(tp_graph)
    mutate(g.meshes[0])
    _refused(g, match)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: setattr(d, "mesh", 3), "device mesh 3 is not declared"),
        (lambda d: d.placements.append(graph_pb2.Placement(shard=0)), "2 placements for a 1-d mesh"),
        (lambda d: d.placements[0].__setattr__("shard", 9), r"Shard\(9\)"),
        (lambda d: d.placements[0].__setattr__("partial", "concat"), "unknown reduce op"),
        (lambda d: d.placements[0].Clear(), "placement without a kind"),
        (lambda d: d.stride.pop(), "global shape and stride differ"),
    ],
)
def test_a_malformed_dtensor_input_is_refused(tp_graph, mutate, match):
    g = _copy(tp_graph)
    mutate(_dtensor_node(g).dtensor)
    _refused(g, match)


def test_a_mesh_no_placeholder_names_is_refused(tp_graph):
    g = _copy(tp_graph)
    g.meshes.append(g.meshes[0])
    _refused(g, "no placeholder names it")


def test_a_group_without_the_rank_is_refused_in_a_mesh_graph(tp_graph):
    g = _copy(tp_graph)
    g.groups.add(name="7", size=1, ranks=[0])
    _refused(g, "rank 1 is not in it")


def test_mesh_metadata_off_a_placeholder_is_refused(tp_graph):
    g = _copy(tp_graph)
    compute = next(n for n in g.nodes if n.op == graph_pb2.Node.CALL_FUNCTION)
    compute.mesh.mesh = 0
    _refused(g, "only placeholders carry")


@pytest.mark.parametrize("kind", ["mesh", "symint"])
def test_dtensor_metadata_beside_a_mesh_or_a_symint_is_refused(tp_graph, kind):
    """A DTensor's metadata belongs beside the tensor meta of its local shard: the
    decoder reads it nowhere else, so anywhere else it would be an unchecked field."""
    g = _copy(tp_graph)
    dtensor_meta = _dtensor_node(g).dtensor
    if kind == "mesh":
        node = next(n for n in g.nodes if n.HasField("mesh"))
    else:
        nodes = list(g.nodes)
        del g.nodes[:]
        node = g.nodes.add(name="s0", op=graph_pb2.Node.PLACEHOLDER, target="s0")
        node.symint.expr = "s0"
        g.nodes.extend(nodes)
        g.symbols.add(name="s0", hint=4, min=2)
    node.dtensor.CopyFrom(dtensor_meta)
    _refused(g, "DTensor metadata needs tensor meta")


def test_an_export_of_a_dtensor_graph_is_refused(tp_graph):
    with pytest.raises(MalformedGraph, match="no DTensor graph"):
        validate_export(tp_graph, farm_pb2.ExportSpec())
