"""The process groups a Dynamo graph's functional collectives name, described for the farm.

A collective node carries its group as a name (the last positional argument, say "0").
`describe_groups` resolves each name in this process and records what every member
of the group agrees on: its size and its members' global ranks in group order. The
caller's own rank is left out, so ranks that capture the same graph encode the same
bytes and share one cache key (torchfarm/graph/collectives.py has the format's rules).

Behaviour pinned against torch 2.13.0 (tests/unit/test_collectives.py):
- Dynamo records `funcol.all_reduce(t, "sum", group)` and the autograd variants as
  `torch.ops._c10d_functional.<op>` with the group's name as a string argument;
- `torch._C._distributed_c10d._resolve_process_group(name)` finds the group and
  `torch.distributed.get_process_group_ranks(group)` lists its global ranks.
"""

from __future__ import annotations

import logging

import torch.fx

from torchfarm.fx.internals import resolve
from torchfarm.graph import collectives
from torchfarm.v1 import graph_pb2

log = logging.getLogger(__name__)


class UnresolvedGroup(Exception):
    """A collective names a group this process cannot resolve."""


_OP_TYPES = (resolve("OpOverload"), resolve("OpOverloadPacket"))


def group_names(gm: torch.fx.GraphModule) -> list[str]:
    """The group names the graph's collectives pass, its subgraphs' included, sorted, each once."""
    names: set[str] = set()
    nodes = [n for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes]
    for node in nodes:
        if node.op != "call_function":
            continue
        target = f"torch.ops.{node.target}" if isinstance(
            node.target, _OP_TYPES
        ) else ""
        op = collectives.collective_name(target)
        if op is None or op == collectives.WAIT:
            continue
        index = collectives.COLLECTIVE_OPS[op].group_name
        name = node.args[index] if len(node.args) > index else node.kwargs.get("group_name")
        if not isinstance(name, str):
            raise UnresolvedGroup(f"{node.name}: the group name is {name!r}, not a string")
        names.add(name)
    return sorted(names)


def describe_groups(gm: torch.fx.GraphModule) -> list[graph_pb2.ProcessGroup]:
    """One `ProcessGroup` per group the graph's collectives name, sorted by name."""
    names = group_names(gm)
    if not names:
        return []
    import torch.distributed as dist
    _resolve_process_group = resolve("resolve_process_group")
    from torch.distributed.distributed_c10d import GroupName

    described = []
    for name in names:
        try:
            pg = _resolve_process_group(GroupName(name))
        except RuntimeError as e:
            raise UnresolvedGroup(f"process group {name!r}: {e}") from e
        ranks = dist.get_process_group_ranks(pg)
        described.append(graph_pb2.ProcessGroup(name=name, size=len(ranks), ranks=ranks))
    log.debug("graph's process groups: %s", {g.name: list(g.ranks) for g in described})
    return described
