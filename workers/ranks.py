"""One compile for every rank of a DTensor graph, where it is the same compile.

A graph with device meshes carries the client's rank: DTensor's dispatch, which runs on
the worker while AOTAutograd traces, takes the rank's shard, its offsets and its mesh
coordinates. The ranks of a tensor-parallel group send the same graph with their own
rank, and the key leaves the rank out (torchfarm/wire/keys.py), so they share one job. Before
it compiles, the job proves that sharing sound: it traces the graph as every rank that
sends the same bytes would (the ranks whose groups, along every mesh dimension and for
every collective, are the client's; a graph on a slice of a larger mesh comes in the
form every slice sends, torchfarm/fx/meshes.py `share_submesh`, so those are the
slice's ranks), and compares AOTAutograd's graphs node by node, values included
(`aot_seam.listing`). The same graphs everywhere compile once, at the client's rank.
Other graphs anywhere (a vocabulary-parallel embedding masks its own rows, a rank's
random offset) fail the job RANK_SPECIFIC, and each rank submits again with
`per_rank`, keyed with its rank.

The traces are a compiler run on the tenant's input (AOTAutograd, and Inductor's compile
entry as far as its graphs): with a sandbox they run in its child (workers/sandbox/child.py's
"ranks" op), one run for all the ranks, under the sandbox's limits; only without one
(TORCHFARM_SANDBOX=off) in the job's process. More than `MAX_CHECKED_RANKS` such ranks
are not traced; the graph compiles per rank.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from torchfarm.fx import meshes as fx_meshes
from torchfarm.fx.decode import decode_graph
from torchfarm.v1 import graph_pb2
from torchfarm.wire import keys
from torchfarm.wire.codes import JobError
from workers import aot_seam, fakepg
from workers.job import JobFailed, Prepared

if TYPE_CHECKING:
    from workers.executor import Executor

log = logging.getLogger(__name__)

MAX_CHECKED_RANKS = keys.MAX_CHECKED_RANKS
"""The most ranks besides the client's that one job traces the graph at (the
coordinator charges the tenant's quota once per rank traced: `keys.traced_ranks`)."""

_warm = False
"""Whether this process has traced a graph for the check (`first_differing`)."""


def sharing_ranks(graph: graph_pb2.Graph) -> list[int]:
    """The ranks that send this graph's bytes, rank aside: those whose group along every
    mesh dimension, and in every collective, has the same members as the client's."""
    candidates = sorted({r for mesh in graph.meshes for r in mesh.ranks})

    def groups(rank: int) -> list[list[int]]:
        return [members for mesh in graph.meshes for _, members in fx_meshes.mesh_groups(mesh, rank)]

    mine = groups(graph.rank)
    return [
        r for r in candidates
        if all(r in g.ranks for g in graph.groups) and all(r in m.ranks for m in graph.meshes)
        and groups(r) == mine
    ]


def check_shared(job: Prepared, executor: Executor) -> None:
    """Raises JobFailed(RANK_SPECIFIC) unless the job's graph traces to the same graphs at
    every rank that shares its key; a per-rank request, or one without meshes, passes.
    The traces run where `executor` runs its steps (workers/executor.py)."""
    request = job.request
    if not keys.rank_shared(request):
        return
    graph = request.graph
    others = checked_ranks(graph)
    if not others:
        return
    if len(others) > MAX_CHECKED_RANKS:
        raise JobFailed(
            JobError.RANK_SPECIFIC,
            f"{len(others) + 1} ranks share this graph; the farm checks at most "
            f"{MAX_CHECKED_RANKS + 1}, so it compiles per rank",
        )
    t0 = time.perf_counter()
    differs = executor.check_ranks(job, others)
    if differs is not None:
        raise JobFailed(
            JobError.RANK_SPECIFIC,
            f"rank {differs}'s compile of this graph differs from rank {graph.rank}'s; "
            "it compiles per rank",
        )
    log.info("graph is the same at ranks %s: one compile for all (checked in %.2fs%s)",
             sorted([graph.rank, *others]), time.perf_counter() - t0,
             "" if executor.decodes_here else " in the sandbox")


def checked_ranks(graph: graph_pb2.Graph) -> list[int]:
    """The ranks besides the client's that the check traces `graph` at (more than
    `MAX_CHECKED_RANKS` of them: the check refuses, tracing none)."""
    return [r for r in sharing_ranks(graph) if r != graph.rank]


def first_differing(
    graph: graph_pb2.Graph, others: list[int], options: object, inductor_options: dict,
) -> int | None:
    """The first of `others` whose AOTAutograd graphs of `graph` differ from the client
    rank's, or None. Traces in this process: the sandbox's child calls it, and the job
    only without a sandbox. Raises GraphError or CompileFailed."""
    # Traced from a decode of its own, as every rank's: tracing adds guards to the
    # ShapeEnv of the job's decode, which the compile goes on to use.
    mine = _graphs_at(graph, graph.rank, options, inductor_options)
    global _warm
    if not _warm:
        # A process's first trace can partition differently from every later one (it
        # saved another, equal value for the backward: measured on the Colwise/Rowwise
        # MLP), and a sandbox's child is always a process's first: trace the client's
        # rank again, as the other ranks will be traced.
        mine = _graphs_at(graph, graph.rank, options, inductor_options)
        _warm = True
    for rank in others[:MAX_CHECKED_RANKS]:
        if _graphs_at(graph, rank, options, inductor_options) != mine:
            return rank
    return None


def _graphs_at(graph: graph_pb2.Graph, rank: int, options: object, inductor_options: dict) -> list[str]:
    """AOTAutograd's graphs of `graph` as rank `rank` sends it, listed
    (`aot_seam.listing`)."""
    at = graph_pb2.Graph()
    at.CopyFrom(graph)
    at.rank = rank
    with fakepg.fake_groups(at):
        return aot_seam.traced_graphs(
            decode_graph(at), dynamic=options.dynamic, mode=options.mode,  # type: ignore[attr-defined]
            inductor_options=inductor_options,
        )
