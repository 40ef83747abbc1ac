"""One compile for every rank of a DTensor graph, where it is the same compile.

A graph with device meshes carries the client's rank: DTensor's dispatch, which runs on
the worker while AOTAutograd traces, takes the rank's shard, its offsets and its mesh
coordinates. The ranks of a tensor-parallel group send the same graph with their own
rank, and the key leaves the rank out (torchfarm/keys.py), so they share one job. Before
it compiles, the job proves that sharing sound: it traces the graph as every rank that
sends the same bytes would (the ranks whose groups, along every mesh dimension and for
every collective, are the client's; a graph on a slice of a larger mesh comes in the
form every slice sends, torchfarm/fx/dtensor.py `share_submesh`, so those are the
slice's ranks), and compares AOTAutograd's graphs node by node, values included
(`aot_seam.listing`). The same graphs everywhere compile once, at the client's rank.
Other graphs anywhere (a vocabulary-parallel embedding masks its own rows, a rank's
random offset) fail the job RANK_SPECIFIC, and each rank submits again with
`per_rank`, keyed with its rank.

The traces run in the job's process, as the decode does: fake tensors, no code made.
More than `MAX_CHECKED_RANKS` such ranks are not traced; the graph compiles per rank.
"""

from __future__ import annotations

import logging
import time

from torchfarm import keys
from torchfarm.codes import JobError
from torchfarm.fx import dtensor as fx_dtensor
from torchfarm.fx.decode import decode_graph
from torchfarm.graph_errors import GraphError
from torchfarm.v1 import graph_pb2
from workers import aot_seam, fakepg
from workers.compiler import CompileFailed
from workers.runtime import JobFailed, Prepared

log = logging.getLogger(__name__)

MAX_CHECKED_RANKS = 16
"""The most ranks besides the client's that one job traces the graph at."""


def sharing_ranks(graph: graph_pb2.Graph) -> list[int]:
    """The ranks that send this graph's bytes, rank aside: those whose group along every
    mesh dimension, and in every collective, has the same members as the client's."""
    candidates = sorted({r for mesh in graph.meshes for r in mesh.ranks})

    def groups(rank: int) -> list[list[int]]:
        return [members for mesh in graph.meshes for _, members in fx_dtensor.mesh_groups(mesh, rank)]

    mine = groups(graph.rank)
    return [
        r for r in candidates
        if all(r in g.ranks for g in graph.groups) and all(r in m.ranks for m in graph.meshes)
        and groups(r) == mine
    ]


def check_shared(job: Prepared) -> None:
    """Raises JobFailed(RANK_SPECIFIC) unless the job's graph traces to the same graphs at
    every rank that shares its key; a per-rank request, or one without meshes, passes."""
    request = job.request
    if not keys.rank_shared(request):
        return
    graph = request.graph
    others = [r for r in sharing_ranks(graph) if r != graph.rank]
    if not others:
        return
    if len(others) > MAX_CHECKED_RANKS:
        raise JobFailed(
            JobError.RANK_SPECIFIC,
            f"{len(others) + 1} ranks share this graph; the farm checks at most "
            f"{MAX_CHECKED_RANKS + 1}, so it compiles per rank",
        )
    t0 = time.perf_counter()
    # Traced from a decode of its own, as every rank's: tracing adds guards to the
    # ShapeEnv of the job's decode, which the compile goes on to use.
    mine = _graphs_at(graph, graph.rank, job)
    for rank in others:
        if _graphs_at(graph, rank, job) != mine:
            raise JobFailed(
                JobError.RANK_SPECIFIC,
                f"rank {rank}'s compile of this graph differs from rank {graph.rank}'s; "
                "it compiles per rank",
            )
    log.info("graph is the same at ranks %s: one compile for all (checked in %.2fs)",
             sorted([graph.rank, *others]), time.perf_counter() - t0)


def _graphs_at(graph: graph_pb2.Graph, rank: int, job: Prepared) -> list[str]:
    """AOTAutograd's graphs of `graph` as rank `rank` sends it, listed
    (`aot_seam.listing`)."""
    at = graph_pb2.Graph()
    at.CopyFrom(graph)
    at.rank = rank
    options = job.request.options
    try:
        with fakepg.fake_groups(at):
            return aot_seam.traced_graphs(
                decode_graph(at), dynamic=options.dynamic, mode=options.mode,
                inductor_options=job.inductor_options,
            )
    except GraphError as e:
        raise JobFailed(JobError.INVALID_GRAPH, str(e)) from e
    except CompileFailed as e:
        raise JobFailed(JobError.COMPILE_ERROR, str(e)) from e
