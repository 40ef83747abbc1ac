"""Fake process groups for a graph's collectives, so a worker compiles them with no cluster.

Inductor resolves each functional collective's `group_name` while it lowers the graph
(`_resolve_process_group` in torch/distributed/_functional_collectives.py; without a
group of that name the compile fails with "Could not resolve the process group
registered under the name ..."). A worker has no real group, so for the length of one
compile this module starts PyTorch's fake process group (nothing is sent; collectives
"complete" at once) as the default world and registers a fake group of each requested
size under the *client's* group name. The generated code passes the same names to the
collectives, so on the client they resolve to the client's real groups.

A fake group's own member ranks do not matter to lowering, only its size: every group
here is the first `size` ranks of the fake world, and the worker is rank 0. The graph
itself is the same on every rank (torchfarm/graph/collectives.py), so nothing rank-specific
is compiled in. A graph with DTensor device meshes is the exception: DTensor's dispatch
picks this rank's shard while AOTAutograd traces it, so the worker takes the client's
rank (`Graph.rank`) and its groups the client's members; workers/ranks.py decides
whether the ranks can share that compile.

Behaviour pinned against torch 2.13.0 (tests/unit/test_collectives.py):
- `torch.testing._internal.distributed.fake_pg` registers the "fake" backend on import;
- `torch._C._distributed_c10d._register_process_group(name, pg)` and
  `_unregister_process_group(name)` manage the name → group map collectives resolve
  through, apart from `dist.new_group`'s own naming.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from torchfarm.fx import internals
from torchfarm.fx import meshes as fx_meshes
from torchfarm.fx.decode import DecodedGraph, decode_graph
from torchfarm.v1 import graph_pb2

log = logging.getLogger(__name__)


class NotFakeable(Exception):
    """This process already has a real process group; it cannot compile with fake ones."""


@contextlib.contextmanager
def fake_groups(graph: graph_pb2.Graph) -> Iterator[None]:
    """Within the block, each group the graph's collectives and device meshes name
    resolves by name to a fake group of its size.

    Does nothing for a graph without collectives or meshes. The fake world is torn down
    after the block, so one job's group names never reach another's compile. Decode a
    graph with meshes inside it too: DTensor's propagation asks for the groups' sizes.
    """
    groups = _named_groups(graph)
    if not groups:
        yield
        return
    if dist.is_initialized():
        raise NotFakeable("this worker process already has a process group")
    FakeStore = internals.resolve("fake_pg").FakeStore  # importing it registers "fake"

    world = 1 + max([*(r for g in graph.groups for r in g.ranks), *(r for m in graph.meshes for r in m.ranks)])
    dist.init_process_group("fake", store=FakeStore(), rank=graph.rank, world_size=world)
    try:
        default_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        made: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for name, ranks in groups:
            if tuple(ranks) not in made:
                made[tuple(ranks)] = dist.new_group(ranks=ranks, backend="fake")
            if name == default_name:
                if len(ranks) == world:
                    continue
                internals.resolve("unregister_process_group")(GroupName(default_name))
            internals.resolve("register_process_group")(GroupName(name), made[tuple(ranks)])
        log.debug("fake process groups: %s", {name: len(ranks) for name, ranks in groups})
        yield
    finally:
        for name, _ in groups:
            with contextlib.suppress(Exception):
                internals.resolve("unregister_process_group")(GroupName(name))
        dist.destroy_process_group()


def _named_groups(graph: graph_pb2.Graph) -> list[tuple[str, list[int]]]:
    """Each group name the graph passes, once, with the member ranks its fake group gets.

    Without meshes the worker is rank 0, and a collective's group is the first `size`
    ranks (only its size matters to lowering). With meshes the worker is the client's
    rank, and every group has the client's members, so DTensor sees its own coordinates.
    """
    by_name: dict[str, list[int]] = {}
    for group in graph.groups:
        by_name[group.name] = list(group.ranks) if graph.meshes else list(range(group.size))
    for mesh in graph.meshes:
        for name, ranks in fx_meshes.mesh_groups(mesh, graph.rank):
            by_name.setdefault(name, ranks)
    return sorted(by_name.items())


def decoded(graph: graph_pb2.Graph) -> DecodedGraph:
    """`decode_graph`, inside the graph's fake groups when it has device meshes."""
    if not graph.meshes:
        return decode_graph(graph)
    with fake_groups(graph):
        return decode_graph(graph)
