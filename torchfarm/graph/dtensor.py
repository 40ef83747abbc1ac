"""DTensor in the graph format: device meshes, placements, and the calls that move
between local tensors and DTensors.

A tensor-parallel module (`torch.distributed.tensor.parallel`) hands Dynamo DTensor
parameters and a `DeviceMesh`, and Dynamo records `DTensor.from_local`, `redistribute`
and `to_local` between the layers. The graph carries:

- each mesh as a `graph_pb2.DeviceMesh`: its whole layout of global ranks and, per
  dimension, the name of the process group that dimension's collectives pass (the
  worker registers fake groups under those names, workers/fakepg.py). A slice of a
  larger mesh may come in the form every slice sends, with names the client made
  (torchfarm/fx/meshes.py `share_submesh`);
- a DTensor input as its local tensor's `TensorMeta` plus a `DTensorMeta` (the mesh,
  the placements, the global shape and stride);
- a mesh input as a `MeshInput`, and placements in arguments as `Placement`.

The graph also holds the client's rank (`Graph.rank`): DTensor's dispatch runs on the
worker, during AOTAutograd, and takes this rank's shard and offsets from the mesh, so
the compiled code of one rank can be wrong on another. The key leaves the rank out
unless the request is `per_rank`: a worker compiles a rank-shared graph only once it has
found the traced graphs the same at every rank that sends it (workers/ranks.py).

This module imports no torch: the coordinator validates DTensor graphs with it.
"""

from __future__ import annotations

from collections.abc import Container

from torchfarm.graph.collectives import GROUP_NAME_RE, MAX_GROUP_SIZE, REDUCE_OPS
from torchfarm.graph.graph_errors import GraphTooLarge, MalformedGraph
from torchfarm.v1 import graph_pb2

FROM_LOCAL = "torch.distributed.tensor._api.DTensor.from_local"
"""`DTensor.from_local(local, mesh, placements, *, run_check, shape, stride)`, as
`torchfarm.fx.encode.qualified_name` writes the target Dynamo records."""
METHODS = ("redistribute", "to_local", "full_tensor")
"""DTensor methods a graph may call; each returns a tensor or a DTensor."""

MAX_MESHES = 8
MAX_MESH_DIMS = 4
MAX_DIM_NAME_CHARS = 64


def allowed_functions() -> list[str]:
    return [FROM_LOCAL]


def check_meshes(graph: graph_pb2.Graph, device_types: Container[str]) -> list[graph_pb2.DeviceMesh]:
    """The graph's meshes, in order; raises `GraphError` unless each is well formed, of
    one of `device_types`, and holds the graph's rank, as every process group does."""
    if len(graph.meshes) > MAX_MESHES:
        raise GraphTooLarge(f"{len(graph.meshes)} device meshes, more than {MAX_MESHES}")
    if not graph.meshes and graph.rank:
        raise MalformedGraph("a graph without device meshes carries no rank")
    for i, mesh in enumerate(graph.meshes):
        if mesh.device_type not in device_types:
            raise MalformedGraph(f"device mesh {i}: unknown device type {mesh.device_type[:40]!r}")
        _check_mesh(mesh, graph.rank, f"device mesh {i}")
    for group in graph.groups if graph.meshes else ():
        if graph.rank not in group.ranks:
            raise MalformedGraph(f"process group {group.name!r}: the graph's rank {graph.rank} is not in it")
    return list(graph.meshes)


def _check_mesh(mesh: graph_pb2.DeviceMesh, rank: int, where: str) -> None:
    dims = list(mesh.shape)
    if not 1 <= len(dims) <= MAX_MESH_DIMS:
        raise MalformedGraph(f"{where}: {len(dims)} dimensions, not 1 to {MAX_MESH_DIMS}")
    size = 1
    for d in dims:
        if not 1 <= d <= MAX_GROUP_SIZE:
            raise MalformedGraph(f"{where}: dimension of size {d}")
        size *= d
    if size > MAX_GROUP_SIZE:
        raise MalformedGraph(f"{where}: {size} ranks, more than {MAX_GROUP_SIZE}")
    ranks = list(mesh.ranks)
    if len(ranks) != size or len(set(ranks)) != size:
        raise MalformedGraph(f"{where}: needs {size} distinct ranks, has {len(set(ranks))}")
    if min(ranks) < 0 or max(ranks) >= MAX_GROUP_SIZE:
        raise MalformedGraph(f"{where}: rank outside 0..{MAX_GROUP_SIZE - 1}")
    if rank not in ranks:
        raise MalformedGraph(f"{where}: the graph's rank {rank} is not in it")
    if len(mesh.group_names) != len(dims):
        raise MalformedGraph(f"{where}: needs one group name per dimension")
    for name in mesh.group_names:
        if not GROUP_NAME_RE.match(name):
            raise MalformedGraph(f"{where}: {name[:40]!r} is not a process group name")
    names = list(mesh.dim_names)
    if names and (len(names) != len(dims) or len(set(names)) != len(names)):
        raise MalformedGraph(f"{where}: needs none or one distinct name per dimension")
    for name in names:
        if not name or len(name) > MAX_DIM_NAME_CHARS or not name.isprintable():
            raise MalformedGraph(f"{where}: bad dimension name {name[:40]!r}")


def check_placement(placement: graph_pb2.Placement, where: str, ndim: int | None = None) -> None:
    """One placement; `ndim`, when known, bounds a shard's dimension."""
    kind = placement.WhichOneof("kind")
    if kind is None:
        raise MalformedGraph(f"{where}: placement without a kind")
    if kind == "shard":
        limit = ndim if ndim is not None else MAX_MESH_DIMS * 16
        if not -limit <= placement.shard < max(limit, 1):
            raise MalformedGraph(f"{where}: Shard({placement.shard}) outside the tensor's dimensions")
    elif kind == "partial" and placement.partial not in REDUCE_OPS:
        raise MalformedGraph(f"{where}: unknown reduce op {placement.partial[:40]!r}")


def check_dtensor(meta: graph_pb2.DTensorMeta, meshes: list[graph_pb2.DeviceMesh], where: str) -> None:
    """A DTensor placeholder's mesh and placements; its sizes the caller parses."""
    if not 0 <= meta.mesh < len(meshes):
        raise MalformedGraph(f"{where}: device mesh {meta.mesh} is not declared")
    mesh = meshes[meta.mesh]
    if len(meta.placements) != len(mesh.shape):
        raise MalformedGraph(f"{where}: {len(meta.placements)} placements for a {len(mesh.shape)}-d mesh")
    if len(meta.shape) != len(meta.stride):
        raise MalformedGraph(f"{where}: global shape and stride differ in length")
    for placement in meta.placements:
        check_placement(placement, where, len(meta.shape))
