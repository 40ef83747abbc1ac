"""Functional collectives in the graph format: which ops, and the groups they name.

Dynamo captures `torch.distributed._functional_collectives` calls (and the autograd
variants, which it records as the plain ops) as `torch.ops._c10d_functional.<op>` nodes
whose last argument is a group *name*, a string such as "0", never a live process
group. The graph carries each named group as a `graph_pb2.ProcessGroup` (size and
member ranks): facts every rank of the group shares, so the graph, and with it the
cache key, is the same on every rank. A worker compiles against a fake group of that
name and size (workers/fakepg.py); the artifact resolves the name on the client.

This module imports no torch: the coordinator validates collectives with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchfarm.graph.graph_errors import GraphTooLarge, MalformedGraph
from torchfarm.v1 import graph_pb2

NAMESPACE = "torch.ops._c10d_functional"
AUTOGRAD_NAMESPACE = "torch.ops._c10d_functional_autograd"
"""Torch 2.12 records the differentiable variants under this namespace (2.13 records
the plain ops); same arguments."""
AUTOGRAD_OPS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


@dataclass(frozen=True)
class CollectiveOp:
    """Where a collective's arguments sit: the group name, and any group size or
    per-member list it must agree with (positional index, or None)."""

    group_name: int
    group_size: int | None = None
    split_sizes: tuple[int, ...] = ()
    reduce_op: int | None = None


COLLECTIVE_OPS: dict[str, CollectiveOp] = {
    # all_reduce(Tensor input, str reduce_op, str group_name)
    "all_reduce": CollectiveOp(group_name=2, reduce_op=1),
    # all_gather_into_tensor(Tensor input, int group_size, str group_name)
    "all_gather_into_tensor": CollectiveOp(group_name=2, group_size=1),
    # reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name)
    "reduce_scatter_tensor": CollectiveOp(group_name=3, group_size=2, reduce_op=1),
    # all_to_all_single(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, str group_name)
    "all_to_all_single": CollectiveOp(group_name=3, split_sizes=(1, 2)),
    # broadcast(Tensor input, int src, str group_name)
    "broadcast": CollectiveOp(group_name=2),
}
"""The collectives allowed, by op name. Point-to-point (isend, irecv, batch_p2p_ops)
and the coalesced variants are left out: pipelining sends outside the graph."""

WAIT = "wait_tensor"
"""`wait_tensor(Tensor)`: names no group."""

REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor"})

MAX_GROUP_SIZE = 1 << 16
MAX_GROUPS = 64
GROUP_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}\Z", re.ASCII)
"""Names torch gives groups: a counter ("0", "1"), or a hash of the ranks."""


def allowed_targets() -> list[str]:
    """Every target name of a collective, as `torchfarm.fx.encode.qualified_name`
    writes it (the packet and its `.default` overload)."""
    names = [f"{NAMESPACE}.{n}" for n in (*COLLECTIVE_OPS, WAIT)]
    names += [f"{AUTOGRAD_NAMESPACE}.{n}" for n in AUTOGRAD_OPS]
    return sorted(f"{n}{suffix}" for n in names for suffix in ("", ".default"))


def collective_name(target: str) -> str | None:
    """The op name of a collective target ("all_reduce"), or None for any other target."""
    if target.startswith(AUTOGRAD_NAMESPACE + "."):
        name = target[len(AUTOGRAD_NAMESPACE) + 1 :].removesuffix(".default")
        return name if name in AUTOGRAD_OPS else None
    if not target.startswith(NAMESPACE + "."):
        return None
    name = target[len(NAMESPACE) + 1 :].removesuffix(".default")
    return name if name in COLLECTIVE_OPS or name == WAIT else None


def check_groups(graph: graph_pb2.Graph) -> dict[str, graph_pb2.ProcessGroup]:
    """The graph's groups by name; raises `GraphError` unless each is well formed."""
    if len(graph.groups) > MAX_GROUPS:
        raise GraphTooLarge(f"{len(graph.groups)} process groups, more than {MAX_GROUPS}")
    groups: dict[str, graph_pb2.ProcessGroup] = {}
    previous = None
    for group in graph.groups:
        where = f"process group {group.name!r}"
        if not GROUP_NAME_RE.match(group.name):
            raise MalformedGraph(f"{where}: not a process group name")
        if previous is not None and group.name <= previous:
            raise MalformedGraph("process groups must be unique and sorted by name")
        previous = group.name
        if not 1 <= group.size <= MAX_GROUP_SIZE:
            raise MalformedGraph(f"{where}: size {group.size} outside 1..{MAX_GROUP_SIZE}")
        ranks = list(group.ranks)
        if len(ranks) != group.size or len(set(ranks)) != len(ranks):
            raise MalformedGraph(f"{where}: needs {group.size} distinct ranks, has {ranks}")
        if min(ranks) < 0 or max(ranks) >= MAX_GROUP_SIZE:
            raise MalformedGraph(f"{where}: rank outside 0..{MAX_GROUP_SIZE - 1}")
        groups[group.name] = group
    return groups


def check_collective(
    node: graph_pb2.Node, groups: dict[str, graph_pb2.ProcessGroup], where: str
) -> str | None:
    """Checks one collective node against the graph's groups; returns the group name it
    uses (None for `wait_tensor` or a node that is no collective)."""
    name = collective_name(node.target)
    if name is None or name == WAIT:
        return None
    op = COLLECTIVE_OPS[name]
    if node.kwargs or len(node.args) != op.group_name + 1:
        raise MalformedGraph(f"{where}: {name} takes {op.group_name + 1} positional arguments")
    group_name = _string(node.args[op.group_name], where, "group name")
    group = groups.get(group_name)
    if group is None:
        raise MalformedGraph(f"{where}: process group {group_name!r} is not declared")
    if op.reduce_op is not None and _string(node.args[op.reduce_op], where, "reduce op") not in REDUCE_OPS:
        raise MalformedGraph(f"{where}: unknown reduce op")
    if op.group_size is not None:
        size = node.args[op.group_size]
        if size.WhichOneof("kind") != "int_value" or size.int_value != group.size:
            raise MalformedGraph(f"{where}: group size differs from group {group_name!r}'s {group.size}")
    for index in op.split_sizes:
        splits = node.args[index]
        kind = splits.WhichOneof("kind")
        if kind == "list" and len(splits.list.items) not in (0, group.size):
            raise MalformedGraph(f"{where}: {len(splits.list.items)} split sizes for {group.size} ranks")
        if kind not in ("list", "none"):
            raise MalformedGraph(f"{where}: split sizes must be a list")
    return group_name


def _string(arg: graph_pb2.Argument, where: str, what: str) -> str:
    if arg.WhichOneof("kind") != "str_value":
        raise MalformedGraph(f"{where}: the {what} must be a string")
    return arg.str_value
