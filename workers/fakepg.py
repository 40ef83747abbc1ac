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
itself is the same on every rank (torchfarm/collectives.py), so nothing rank-specific
is compiled in.

Behaviour pinned against torch 2.13.0 (tests/unit/test_collectives.py):
- `torch.testing._internal.distributed.fake_pg` registers the "fake" backend on import;
- `torch._C._distributed_c10d._register_process_group(name, pg)` and
  `_unregister_process_group(name)` manage the name → group map collectives resolve
  through, apart from `dist.new_group`'s own naming.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from torchfarm.fx import internals
from torchfarm.v1 import graph_pb2

log = logging.getLogger(__name__)


class NotFakeable(Exception):
    """This process already has a real process group; it cannot compile with fake ones."""


@contextlib.contextmanager
def fake_groups(groups: Sequence[graph_pb2.ProcessGroup]) -> Iterator[None]:
    """Within the block, each of `groups` resolves by name to a fake group of its size.

    Does nothing for a graph without collectives. The fake world is torn down after
    the block, so one job's group names never reach another's compile.
    """
    if not groups:
        yield
        return
    if dist.is_initialized():
        raise NotFakeable("this worker process already has a process group")
    FakeStore = internals.resolve("fake_pg").FakeStore  # importing it registers "fake"

    world = max(max(g.ranks) + 1 for g in groups)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        default_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        by_size: dict[int, dist.ProcessGroup] = {}
        for group in groups:
            if group.size not in by_size:
                pg = dist.new_group(ranks=list(range(group.size)), backend="fake")
                by_size[group.size] = pg
            if group.name == default_name:
                if group.size == world:
                    continue
                internals.resolve("unregister_process_group")(GroupName(default_name))
            internals.resolve("register_process_group")(GroupName(group.name), by_size[group.size])
        log.debug("fake process groups: %s", {g.name: g.size for g in groups})
        yield
    finally:
        for group in groups:
            with contextlib.suppress(Exception):
                internals.resolve("unregister_process_group")(GroupName(group.name))
        dist.destroy_process_group()
