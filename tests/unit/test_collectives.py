"""Functional collectives in the graph format: captured, described, validated, compiled.

Captures run under PyTorch's fake process group in this process (nothing is sent);
every test leaves no process group behind, since a worker in process refuses to fake
groups over a real one.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.testing._internal.distributed.fake_pg import FakeStore

from tests.graphs import captured_graph
from torchfarm.fx.decode import decode_graph
from torchfarm.graph import collectives
from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.graph.graphcheck import validate_graph
from torchfarm.v1 import graph_pb2
from workers.compiler import CompileFailed, compile_graph
from workers.fakepg import NotFakeable, fake_groups


@contextlib.contextmanager
def fake_world(rank: int, size: int):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def tp_step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A Megatron MLP's shard: column shard, row shard, then the sum over ranks."""
    partial = torch.relu(x @ w1) @ w2
    return funcol.all_reduce(partial, "sum", dist.group.WORLD)


def every_collective(x: torch.Tensor) -> torch.Tensor:
    group = dist.group.WORLD
    y = funcol.all_gather_tensor_autograd(x, 0, group)
    y = funcol.reduce_scatter_tensor_autograd(y * 2, "sum", 0, group)
    y = funcol.all_to_all_single_autograd(y, None, None, group)
    return funcol.broadcast(y, 0, group) + funcol.all_reduce(x, "max", group)


def tp_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(8, 6, generator=g), torch.randn(6, 8, generator=g)


def test_the_graph_names_its_group_and_is_the_same_on_every_rank():
    encoded = []
    for rank in (0, 1):
        with fake_world(rank, 2):
            encoded.append(captured_graph(tp_step, *tp_inputs()))
    assert encoded[0].SerializeToString(deterministic=True) == encoded[1].SerializeToString(
        deterministic=True
    )
    (group,) = encoded[0].groups
    assert (group.name, group.size, list(group.ranks)) == ("0", 2, [0, 1])
    targets = [n.target for n in encoded[0].nodes]
    assert "torch.ops._c10d_functional.all_reduce" in targets
    assert "torch.ops._c10d_functional.wait_tensor" in targets


def test_every_allowed_collective_is_captured_and_valid():
    with fake_world(0, 2):
        graph = captured_graph(every_collective, torch.randn(4, 2))
    used = {collectives.collective_name(n.target) for n in graph.nodes} - {None}
    assert used == {*collectives.COLLECTIVE_OPS, collectives.WAIT}
    validate_graph(graph)


def test_allow_list_holds_the_collectives_and_no_point_to_point():
    from torchfarm.graph import allowlist

    allowed = {f for f in allowlist.load_allowlist().functions if "_c10d" in f}
    assert allowed == set(collectives.allowed_targets())
    assert not any("isend" in f or "irecv" in f or "p2p" in f for f in allowed)


def _tp_graph() -> graph_pb2.Graph:
    with fake_world(0, 2):
        return captured_graph(tp_step, *tp_inputs())


def _collective_node(graph: graph_pb2.Graph) -> graph_pb2.Node:
    return next(n for n in graph.nodes if n.target == "torch.ops._c10d_functional.all_reduce")


def _undeclared(g: graph_pb2.Graph) -> None:
    del g.groups[:]


def _renamed_in_node(g: graph_pb2.Graph) -> None:
    _collective_node(g).args[2].str_value = "1"


def _unused_group(g: graph_pb2.Graph) -> None:
    g.groups.add(name="9", size=1, ranks=[0])


def _bad_name(g: graph_pb2.Graph) -> None:
    g.groups[0].name = "0; rm -rf /"
    _collective_node(g).args[2].str_value = "0; rm -rf /"


def _ranks_differ_from_size(g: graph_pb2.Graph) -> None:
    g.groups[0].size = 3


def _duplicate_ranks(g: graph_pb2.Graph) -> None:
    g.groups[0].ranks[:] = [0, 0]


def _group_too_large(g: graph_pb2.Graph) -> None:
    g.groups[0].size = collectives.MAX_GROUP_SIZE + 1


def _group_name_not_a_string(g: graph_pb2.Graph) -> None:
    _collective_node(g).args[2].int_value = 0


def _unknown_reduce_op(g: graph_pb2.Graph) -> None:
    _collective_node(g).args[1].str_value = "launch"


def _group_name_as_keyword(g: graph_pb2.Graph) -> None:
    node = _collective_node(g)
    name = node.args.pop()
    node.kwargs.add(name="group_name", value=name)


@pytest.mark.parametrize(
    "break_it",
    [
        _undeclared, _renamed_in_node, _unused_group, _bad_name, _ranks_differ_from_size,
        _duplicate_ranks, _group_too_large, _group_name_not_a_string, _unknown_reduce_op,
        _group_name_as_keyword,
    ],
)
def test_validation_refuses_collectives_without_a_proper_group(break_it):
    graph = _tp_graph()
    validate_graph(graph)
    break_it(graph)
    with pytest.raises(MalformedGraph):
        validate_graph(graph)


def test_group_size_must_match_the_declared_group():
    with fake_world(0, 2):
        graph = captured_graph(every_collective, torch.randn(4, 2))
    gather = next(n for n in graph.nodes if n.target.endswith("all_gather_into_tensor"))
    gather.args[1].int_value = 4
    with pytest.raises(MalformedGraph, match="group size"):
        validate_graph(graph)


@pytest.mark.timeout(300)
def test_a_worker_compiles_collectives_only_with_fake_groups():
    graph = _tp_graph()
    assert not dist.is_initialized()
    # Caches off: an earlier run's artifact of this graph would skip the lowering.
    no_cache = (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    )
    with no_cache[0], no_cache[1], pytest.raises(CompileFailed, match="Could not resolve the process group"):
        decoded = decode_graph(graph)
        compile_graph(decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode)
    decoded = decode_graph(graph)
    with fake_groups(graph):
        result = compile_graph(decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode)
    assert result.payload
    assert not dist.is_initialized(), "the fake world outlived the compile"
    # The artifact passes the client's group name to the collective at run time.
    assert b"_c10d_functional" in result.payload or any(
        b"_c10d_functional" in k.source for k in result.kernels
    )


def test_fake_groups_under_a_clients_own_group_names():
    """A subgroup named by a hash, of fewer ranks than the world: registered by name."""
    groups = [
        graph_pb2.ProcessGroup(name="0", size=4, ranks=[0, 1, 2, 3]),
        graph_pb2.ProcessGroup(name="a1b2c3", size=2, ranks=[2, 3]),
    ]
    from torch._C._distributed_c10d import _resolve_process_group

    with fake_groups(graph_pb2.Graph(groups=groups)):
        assert _resolve_process_group("0").size() == 4
        assert _resolve_process_group("a1b2c3").size() == 2
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError):
        _resolve_process_group("a1b2c3")


def test_fake_groups_refuse_a_process_with_a_real_group():
    with fake_world(0, 2), pytest.raises(NotFakeable):
        with fake_groups(graph_pb2.Graph(groups=[graph_pb2.ProcessGroup(name="0", size=2, ranks=[0, 1])])):
            pass


def test_a_graph_without_collectives_declares_no_group():
    graph = captured_graph(lambda x: x.relu() + 1, torch.randn(3))
    assert not graph.groups
    with fake_groups(graph):
        assert not dist.is_initialized()


def _checkpointed_tp_graph() -> graph_pb2.Graph:
    import torch.utils.checkpoint as checkpoint

    def step(x, w1, w2):
        return checkpoint.checkpoint(tp_step, x, w1, w2, use_reentrant=False)

    x, w1, w2 = tp_inputs()
    with fake_world(0, 2):
        return captured_graph(step, x, w1.requires_grad_(), w2.requires_grad_())


def test_a_collective_inside_a_subgraph_names_the_outermost_graphs_group():
    graph = _checkpointed_tp_graph()
    (body,) = graph.subgraphs
    assert [g.name for g in graph.groups] == ["0"] and not body.graph.groups
    assert any(n.target == "torch.ops._c10d_functional.all_reduce" for n in body.graph.nodes)
    validate_graph(graph)


@pytest.mark.parametrize(("declared_in", "error"), [
    ("both", "subgraph .* declares process groups"),
    ("neither", "is not declared"),
])
def test_a_subgraph_may_not_declare_groups_nor_use_undeclared_ones(declared_in, error):
    graph = _checkpointed_tp_graph()
    (body,) = graph.subgraphs
    if declared_in == "both":
        body.graph.groups.extend(graph.groups)
    else:
        del graph.groups[:]
    with pytest.raises(MalformedGraph, match=error):
        validate_graph(graph)
