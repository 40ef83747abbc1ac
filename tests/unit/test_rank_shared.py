"""One compile for the ranks of a DTensor graph (workers/ranks.py): the key leaves the rank
out, the worker proves the ranks' compiles the same (AOTAutograd's graphs, listed) or
fails RANK_SPECIFIC, a mesh loaded from an artifact compiled at another rank takes this
process's rank, and a slice of a larger mesh is sent in the form every slice sends.

tests/integration/test_distributed.py trains both kinds of graph through a farm on gloo
ranks.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module
from torch.fx.experimental.proxy_tensor import make_fx

from tests.graphs import captured_graph
from tests.unit.test_collectives import fake_world
from tests.unit.test_dtensor_format import capture_tp, skip_before_recorded_from_local
from torchfarm.fx import meshes as fx_meshes
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError
from workers import aot_seam, fakepg, ranks
from workers.inprocess import InProcessExecutor
from workers.runtime import JobFailed, Prepared


class VocabParallel(nn.Module):
    """An embedding split over the ranks by rows: each rank masks the ids outside its
    own rows, so its code holds its own offsets."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(16, 8), nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def capture_vocab_parallel(rank: int, world: int = 2) -> graph_pb2.Graph:
    skip_before_recorded_from_local()
    with fake_world(rank, world):
        mesh = init_device_mesh("cpu", (world,))
        model = parallelize_module(VocabParallel(), mesh, {"emb": RowwiseParallel()})
        return captured_graph(model, torch.randint(0, 16, (4,)))


def _job(graph: graph_pb2.Graph, **fields: bool) -> Prepared:
    request = farm_pb2.CompileRequest(graph=graph, **fields)
    return Prepared(request, fakepg.decoded(graph), {}, 0.0, 0.0)


@pytest.fixture(scope="module")
def tp_graphs() -> list[graph_pb2.Graph]:
    return [capture_tp(0), capture_tp(1)]


def test_the_ranks_of_a_group_share_a_key_unless_per_rank(tp_graphs):
    requests = [farm_pb2.CompileRequest(graph=g) for g in tp_graphs]
    assert keys.compute_key(requests[0]) == keys.compute_key(requests[1])
    per_rank = [farm_pb2.CompileRequest(graph=g, per_rank=True) for g in tp_graphs]
    assert keys.compute_key(per_rank[0]) != keys.compute_key(per_rank[1])
    assert keys.compute_key(per_rank[0]) != keys.compute_key(requests[0])
    plain = farm_pb2.CompileRequest(graph=graph_pb2.Graph())
    assert not keys.rank_shared(plain) and keys.rank_shared(requests[1])


def test_a_graph_the_same_at_every_rank_passes(tp_graphs):
    ranks.check_shared(_job(tp_graphs[1]), InProcessExecutor())


def test_graphs_list_the_same_whatever_tracing_named_their_nodes():
    """torch 2.12 numbers the nodes of a process's first trace apart from the next ones'."""
    def f(add: float):
        return lambda x: torch.relu(x).sum(0) + add

    gm = make_fx(f(1.0))(torch.randn(2, 3))
    listed = aot_seam.listing(gm)
    for i, node in enumerate(gm.graph.nodes):
        node.name = f"renamed_{i}"
        if node.op == "placeholder":
            node.target = node.name
    assert aot_seam.listing(gm) == listed
    assert aot_seam.listing(make_fx(f(2.0))(torch.randn(2, 3))) != listed
    assert aot_seam.listing(make_fx(f(1.0))(torch.randn(2, 4))) != listed
    assert "torch.float32 cpu (2, 3) (3, 1)" in listed


def test_a_graph_with_rank_offsets_fails_rank_specific_and_per_rank_passes():
    graph = capture_vocab_parallel(1)
    with pytest.raises(JobFailed) as failed:
        ranks.check_shared(_job(graph), InProcessExecutor())
    assert failed.value.code == JobError.RANK_SPECIFIC
    assert "rank 0's compile of this graph differs from rank 1's" in str(failed.value)
    ranks.check_shared(_job(graph, per_rank=True), InProcessExecutor())  # what the SDK resubmits: compiled as it is


def test_the_checked_ranks_are_those_that_send_the_same_bytes():
    """On a 2x2 mesh each rank's pair of groups is its own: no other rank sends its bytes."""
    square = graph_pb2.DeviceMesh(device_type="cpu", shape=[2, 2], ranks=[0, 1, 2, 3], group_names=["5", "6"])
    assert ranks.sharing_ranks(graph_pb2.Graph(meshes=[square], rank=3)) == [3]
    line = graph_pb2.DeviceMesh(device_type="cpu", shape=[4], ranks=[0, 1, 2, 3], group_names=["0"])
    assert ranks.sharing_ranks(graph_pb2.Graph(meshes=[line], rank=2)) == [0, 1, 2, 3]
    pair = graph_pb2.ProcessGroup(name="7", size=2, ranks=[2, 3])
    assert ranks.sharing_ranks(graph_pb2.Graph(meshes=[line], groups=[pair], rank=2)) == [2, 3]


def test_more_ranks_than_the_farm_checks_compile_per_rank(tp_graphs, monkeypatch):
    monkeypatch.setattr(ranks, "MAX_CHECKED_RANKS", 0)
    with pytest.raises(JobFailed, match="compiles per rank") as failed:
        ranks.check_shared(_job(tp_graphs[0]), InProcessExecutor())
    assert failed.value.code == JobError.RANK_SPECIFIC


def test_a_mesh_pickled_at_one_rank_loads_at_this_processs_rank():
    with fake_world(0, 2):
        try:
            blob = pickle.dumps(init_device_mesh("cpu", (2,)))
        except (TypeError, pickle.PicklingError, RuntimeError) as e:
            pytest.skip(f"this torch pickles no DeviceMesh, so no artifact holds one: {e}")
    with fake_world(1, 2):
        assert pickle.loads(blob).get_coordinate() == (0,)  # what torch keeps
        with fx_meshes.meshes_at_this_rank():
            mesh = pickle.loads(blob)
        assert mesh.get_coordinate() == (1,) and mesh.get_rank() == 1
        assert pickle.loads(blob).get_coordinate() == (0,)  # the patch ends with the block


def _shared_tp(rank: int) -> tuple[graph_pb2.Graph, object]:
    """The "tp" submesh of a 2x2 mesh at `rank`, described and put in the shared form."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    graph = graph_pb2.Graph(meshes=[fx_meshes.describe_mesh(tp)], rank=rank)
    fx_meshes.share_submesh(graph, tp)
    return graph, tp


def test_a_submesh_is_sent_as_its_siblings_send_it():
    """Rank 3 of a 2x2 mesh describes its "tp" pair (2, 3) as the pair (0, 1) at rank 1,
    under group names of the whole mesh that this process resolves to its own group."""
    from torch._C._distributed_c10d import _resolve_process_group

    with fake_world(3, 4):
        graph, tp = _shared_tp(3)
        (pb,) = graph.meshes
        assert list(pb.ranks) == [0, 1] and graph.rank == 1 and list(pb.dim_names) == ["tp"]
        (name,) = pb.group_names
        assert name.startswith("tf.") and name != tp.get_group(0).group_name
        assert _resolve_process_group(name).group_name == tp.get_group(0).group_name
    with fake_world(0, 4):
        graph0, _ = _shared_tp(0)
        assert graph0.meshes[0] == pb and graph0.rank == 0


def test_a_whole_mesh_and_a_second_mesh_of_the_same_layout_keep_their_own_form():
    with fake_world(2, 4):
        whole = init_device_mesh("cpu", (4,))
        graph = graph_pb2.Graph(meshes=[fx_meshes.describe_mesh(whole)], rank=2)
        fx_meshes.share_submesh(graph, whole)
        assert graph.meshes[0] == fx_meshes.describe_mesh(whole) and graph.rank == 2
        _shared_tp(2)
        second, tp = _shared_tp(2)  # a new 2x2 mesh: new groups, the shared names taken
        assert second.meshes[0] == fx_meshes.describe_mesh(tp) and second.rank == 2


def test_a_mesh_compiled_in_the_shared_form_loads_as_this_processs_submesh():
    """The worker's mesh, built from the shared form at rank 1 and pickled into the
    artifact, is rank 3's own "tp" submesh once loaded there."""
    with fake_world(3, 4):
        graph, tp = _shared_tp(3)
        try:
            blob = pickle.dumps(fx_meshes.build_mesh(graph.meshes[0], graph.rank))
        except (TypeError, pickle.PicklingError, RuntimeError) as e:
            pytest.skip(f"this torch pickles no DeviceMesh, so no artifact holds one: {e}")
        with fx_meshes.meshes_at_this_rank():
            mesh = pickle.loads(blob)
        assert mesh == tp and mesh.mesh.tolist() == [2, 3] and list(mesh.get_coordinate()) == [1]
        assert mesh.get_group(0).group_name == tp.get_group(0).group_name



def test_the_coordinator_counts_the_ranks_the_check_traces_without_torch(tp_graphs):
    """`keys.traced_ranks` (the quota's weight) agrees with the worker's `sharing_ranks`:
    the client's rank and each other rank it traces; none past the bound, per rank, or
    without meshes."""
    square = graph_pb2.DeviceMesh(device_type="cpu", shape=[2, 2], ranks=[0, 1, 2, 3], group_names=["5", "6"])
    line = graph_pb2.DeviceMesh(device_type="cpu", shape=[4], ranks=[0, 1, 2, 3], group_names=["0"])
    pair = graph_pb2.ProcessGroup(name="7", size=2, ranks=[2, 3])
    graphs = [
        tp_graphs[0], tp_graphs[1], graph_pb2.Graph(meshes=[square], rank=3),
        graph_pb2.Graph(meshes=[line], rank=2), graph_pb2.Graph(meshes=[line], groups=[pair], rank=2),
        graph_pb2.Graph(meshes=[line, square], rank=1),
    ]
    for graph in graphs:
        shared = ranks.sharing_ranks(graph)
        want = len(shared) if len(shared) > 1 else 0
        assert keys.traced_ranks(farm_pb2.CompileRequest(graph=graph)) == want
    assert keys.traced_ranks(farm_pb2.CompileRequest(graph=tp_graphs[0])) == 2
    assert keys.traced_ranks(farm_pb2.CompileRequest(graph=tp_graphs[0], per_rank=True)) == 0
    wide = graph_pb2.DeviceMesh(device_type="cpu", shape=[17], ranks=list(range(17)), group_names=["0"])
    assert keys.traced_ranks(farm_pb2.CompileRequest(graph=graph_pb2.Graph(meshes=[wide]))) == 17
    wider = graph_pb2.DeviceMesh(device_type="cpu", shape=[18], ranks=list(range(18)), group_names=["0"])
    assert keys.traced_ranks(farm_pb2.CompileRequest(graph=graph_pb2.Graph(meshes=[wider]))) == 0
    broken = graph_pb2.DeviceMesh(device_type="cpu", shape=[3], ranks=[0, 1], group_names=["0"])
    assert keys.traced_ranks(farm_pb2.CompileRequest(graph=graph_pb2.Graph(meshes=[broken]))) == 0
