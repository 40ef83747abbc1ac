"""DTensors and device meshes, described for the farm and rebuilt on a worker.

The client side (`torchfarm.fx.encode`) describes a Dynamo graph's DTensor inputs and
`DeviceMesh` inputs; the worker side (`torchfarm.fx.decode`) rebuilds them with fake
local tensors, inside the fake process groups of workers/fakepg.py. The format's rules
are in torchfarm/graph/dtensor.py.

Behaviour pinned against torch 2.13.0 (tests/unit/test_dtensor_format.py):
- Dynamo passes a `DeviceMesh` graph input as the mesh itself, with a `FakeScriptObject`
  (its `real_obj` the mesh) as the placeholder's example value; a DTensor input's
  example value is a DTensor whose local tensor is a FakeTensor;
- `DeviceMesh(device_type, mesh, mesh_dim_names=..., _init_backend=False, _rank=r)`
  builds a mesh with no process group; its dimensions' collectives pass the names in
  `_dim_group_names`, resolved when they run (as `DeviceMesh.from_group` sets them);
- a pickled mesh keeps `_rank` and `_dim_group_names` and resolves the names again on
  load (`DeviceMesh.__setstate__`), so the mesh AOTAutograd keeps in the artifact's
  DTensor metadata is the client's own mesh once loaded there;
- `DTensor.__tensor_flatten__` names the local tensor `_local_tensor`;
- a mesh's rank and its coordinates are `_rank` and `_coordinate_on_dim`, kept by pickle,
  so `meshes_at_this_rank` sets them on load;
- a submesh (`mesh["tp"]`) knows its whole mesh (`_get_root_mesh`), and a group
  registered under a second name resolves by either (tests/unit/test_rank_shared.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

from torchfarm.v1 import graph_pb2

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import GroupName
    from torch.distributed.tensor.placement_types import Placement


def is_mesh(value: object) -> bool:
    # A module not yet imported has made no object: nothing is imported here.
    module = sys.modules.get("torch.distributed.device_mesh")
    return module is not None and isinstance(_real(value), module.DeviceMesh)


def is_dtensor(value: object) -> TypeGuard[torch.Tensor]:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def is_placement(value: object) -> bool:
    module = sys.modules.get("torch.distributed.tensor.placement_types")
    return module is not None and isinstance(value, module.Placement)


def _real(value: object) -> object:
    """A mesh from a placeholder's example value, which Dynamo wraps in a FakeScriptObject."""
    return getattr(value, "real_obj", value)


class Undescribable(Exception):
    """A mesh, DTensor or placement the format cannot hold."""


# -- the client's side -----------------------------------------------------


def describe_mesh(value: object) -> graph_pb2.DeviceMesh:
    """A mesh as every rank on it sees it: layout, dimension names, group names."""
    mesh: Any = _real(value)
    try:
        group_names = [mesh.get_group(d).group_name for d in range(mesh.ndim)]
    except (RuntimeError, ValueError) as e:
        raise Undescribable(f"the mesh's process groups: {e}") from e
    return graph_pb2.DeviceMesh(
        device_type=mesh.device_type,
        shape=list(mesh.shape),
        ranks=[int(r) for r in mesh.mesh.flatten().tolist()],
        dim_names=list(mesh.mesh_dim_names or ()),
        group_names=group_names,
    )


_SHARED: dict[tuple[str, ...], Any] = {}
"""This process's submeshes described in their shared form, by their shared group names."""


def share_submesh(graph: graph_pb2.Graph, value: object) -> None:
    """Describes `graph`'s one mesh, `value`, as every rank of its siblings would, when it
    is a slice of a larger mesh (`mesh["tp"]` of a 2-d mesh): the siblings' graphs are
    then the same bytes, and share a key and a compile. The layout is the sibling's at
    coordinate 0 of the other dimensions, the rank the one at this rank's place in it,
    and each dimension's group name one made from the whole mesh's layout, which this
    process registers as another name of its own group. An artifact compiled for the
    shared form runs its collectives under those names, and a mesh in its DTensor
    metadata loads as this process's (`meshes_at_this_rank`). Any other mesh, or a
    shared name this process already gave another group, is left as it is."""
    from torch.distributed.distributed_c10d import GroupName

    from torchfarm.fx.internals import resolve

    mesh: Any = _real(value)
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    names, root_names = mesh.mesh_dim_names, root.mesh_dim_names
    if root is mesh or not names or not root_names or not set(names) <= set(root_names):
        return
    dims = [root_names.index(n) for n in names]
    where = root.get_coordinate()
    if dims != sorted(dims) or where is None:
        return
    sibling = root.mesh[tuple(slice(None) if d in dims else 0 for d in range(root.ndim))]
    layout = json.dumps([mesh.device_type, list(root.shape), root.mesh.flatten().tolist(), list(root_names)])
    digest = hashlib.sha256(layout.encode()).hexdigest()[:16]
    shared = [f"tf.{digest}.{d}" for d in dims]
    groups = [mesh.get_group(i) for i in range(mesh.ndim)]
    taken = [_group_named(name) for name in shared]
    if any(t not in (None, g.group_name) for t, g in zip(taken, groups, strict=True)):
        return  # another mesh of the same layout: this one keeps its own names
    for name, group, t in zip(shared, groups, taken, strict=True):
        if t is None:
            resolve("register_process_group")(GroupName(name), group)
    _SHARED[tuple(shared)] = mesh
    pb = graph.meshes[0]
    pb.ranks[:] = [int(r) for r in sibling.flatten().tolist()]
    pb.group_names[:] = shared
    graph.rank = int(sibling[tuple(where[d] for d in dims)])


def _group_named(name: str) -> str | None:
    """The real name of the group this process knows by `name`; None if it knows none."""
    from torch.distributed.distributed_c10d import GroupName

    from torchfarm.fx.internals import resolve

    try:
        return str(resolve("resolve_process_group")(GroupName(name)).group_name)
    except RuntimeError:
        return None


def same_mesh(a: object, b: object) -> bool:
    return _real(a) is _real(b) or _real(a) == _real(b)


def local_tensor(value: Any) -> torch.Tensor:
    return value._local_tensor


def describe_placement(value: Any) -> graph_pb2.Placement:
    from torch.distributed.tensor import Partial, Replicate, Shard

    kind = type(value)
    if kind is Shard:
        return graph_pb2.Placement(shard=value.dim)
    if kind is Replicate:
        return graph_pb2.Placement(replicate=graph_pb2.NoneValue())
    if kind is Partial:
        return graph_pb2.Placement(partial=value.reduce_op)
    raise Undescribable(f"placement {value!r}")


def placements_of(value: Any) -> list[graph_pb2.Placement]:
    return [describe_placement(p) for p in value.placements]


# -- the worker's side -----------------------------------------------------


def placement(pb: graph_pb2.Placement) -> Placement:
    from torch.distributed.tensor import Partial, Replicate, Shard

    kind = pb.WhichOneof("kind")
    if kind == "shard":
        return Shard(pb.shard)
    if kind == "partial":
        return Partial(pb.partial)
    return Replicate()


def build_mesh(pb: graph_pb2.DeviceMesh, rank: int) -> DeviceMesh:
    """The client's mesh, as rank `rank` has it, with no process group behind it: its
    collectives resolve its group names when they run."""
    from torch.distributed.device_mesh import DeviceMesh

    layout = torch.tensor(list(pb.ranks), dtype=torch.int).view(*pb.shape)
    mesh = DeviceMesh(
        pb.device_type, layout, mesh_dim_names=tuple(pb.dim_names) or None,
        _init_backend=False, _rank=rank,
    )
    mesh._dim_group_names = [cast("GroupName", name) for name in pb.group_names]
    return mesh


def build_dtensor(
    local: torch.Tensor, mesh: DeviceMesh, meta: graph_pb2.DTensorMeta,
    size: Callable[[graph_pb2.SymExpr], Any], requires_grad: bool, parameter: bool,
) -> torch.Tensor:
    """A DTensor of `local` (a fake tensor), with the client's placements and global sizes."""
    from torch.distributed.tensor import DTensor

    value = DTensor.from_local(
        local, mesh, [placement(p) for p in meta.placements], run_check=False,
        shape=torch.Size([size(s) for s in meta.shape]), stride=tuple(size(s) for s in meta.stride),
    ).detach()
    value.requires_grad_(requires_grad)
    return torch.nn.Parameter(value, requires_grad=requires_grad) if parameter else value


def mesh_groups(pb: graph_pb2.DeviceMesh, rank: int) -> list[tuple[str, list[int]]]:
    """Each dimension's group name and, in group order, the ranks of the group along that
    dimension that holds `rank`."""
    layout = torch.tensor(list(pb.ranks), dtype=torch.int).view(*pb.shape)
    where = (layout == rank).nonzero()[0].tolist()
    groups = []
    for dim, name in enumerate(pb.group_names):
        index: list[Any] = list(where)
        index[dim] = slice(None)
        groups.append((name, [int(r) for r in layout[tuple(index)].tolist()]))
    return groups


@contextlib.contextmanager
def meshes_at_this_rank() -> Iterator[None]:
    """Within the block, a `DeviceMesh` unpickled takes this process's rank and its
    coordinates in the mesh, not those it was pickled with; one in a submesh's shared
    form (`share_submesh`) becomes this process's submesh. The ranks of a group share
    one artifact (torchfarm/wire/keys.py), compiled at one of them, whose DTensor metadata
    holds that rank's mesh; the SDK loads artifacts inside this. Without a process group,
    or before DTensor is imported (no artifact of this process holds a mesh), it does
    nothing."""
    module = sys.modules.get("torch.distributed.device_mesh")
    if module is None or not torch.distributed.is_initialized():
        yield
        return
    cls = module.DeviceMesh
    original = cls.__dict__.get("__setstate__")

    def setstate(mesh: Any, state: dict) -> None:
        if original is not None:
            original(mesh, state)
        else:
            mesh.__dict__.update(state)
        own = _SHARED.get(tuple(getattr(mesh, "_dim_group_names", None) or ()))
        if own is not None:
            mesh.__dict__.update(own.__dict__)
            return
        mesh._rank = rank = torch.distributed.get_rank()
        where = (mesh.mesh == rank).nonzero()
        mesh._coordinate_on_dim = tuple(where[0].tolist()) if where.size(0) else None

    cls.__setstate__ = setstate
    try:
        yield
    finally:
        if original is None:
            del cls.__setstate__
        else:
            cls.__setstate__ = original
