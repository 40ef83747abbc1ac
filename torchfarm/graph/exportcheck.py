"""Validates an export request's `ExportSpec` against its graph, from the message alone.

The coordinator runs `validate_export` after `graphcheck.validate_graph` (which checks
every op against the allow-list), and the worker runs it again before it builds
anything. Like graphcheck it imports no torch. It checks:

- the graph is an exported program's: tensor placeholders only, no inline constants;
- every weight names a distinct placeholder, has a distinct dotted attribute path,
  a known dtype, the placeholder's static shape and dtype, and exactly the bytes that
  shape and dtype need;
- the pytree specs are JSON of tuples, lists, string-keyed dicts and leaves only
  (`parse_treespec`), the inputs' is `((args...), {kwargs...})`, and the leaves match
  the user-input placeholders and the graph's outputs;
- every dynamic dimension names a declared symbol, once, with a sane range, and every
  input dimension is an integer or one of those (derived dimensions are not supported).

Errors are `torchfarm.graph.graph_errors.MalformedGraph` (INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from torchfarm.graph.graph_errors import GraphTooLarge, MalformedGraph
from torchfarm.graph.graphcheck import DTYPE_ITEMSIZE
from torchfarm.v1 import farm_pb2, graph_pb2

TREESPEC_PROTOCOL = 1
"""The `torch.utils._pytree.treespec_dumps` protocol this code reads (torch 2.13)."""

MAX_TREE_NODES = 10_000
"""Nodes of one pytree spec."""

MAX_TREE_DEPTH = 32
"""Nesting of one pytree spec."""

_SEQUENCES = ("builtins.tuple", "builtins.list")
_DICT = "builtins.dict"
_FQN_RE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z", re.ASCII)  # "0.weight" in a Sequential

Node = graph_pb2.Node
Weight = farm_pb2.ExportWeight


@dataclass(frozen=True)
class Tree:
    """A pytree spec: `kind` is "leaf", "tuple", "list" or "dict"; `keys` are a dict's."""

    kind: str
    children: tuple[Tree, ...] = ()
    keys: tuple[str, ...] = ()

    def leaves(self) -> int:
        return 1 if self.kind == "leaf" else sum(c.leaves() for c in self.children)


def parse_treespec(text: str) -> Tree:
    """Reads `treespec_dumps` JSON, refusing any node type but the four above."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise MalformedGraph(f"pytree spec is not JSON: {e}") from e
    if not (isinstance(body, list) and len(body) == 2 and body[0] == TREESPEC_PROTOCOL):
        raise MalformedGraph(f"pytree spec is not protocol {TREESPEC_PROTOCOL} JSON")
    count = [0]
    return _tree(body[1], 1, count)


def _tree(node: object, depth: int, count: list[int]) -> Tree:
    count[0] += 1
    if count[0] > MAX_TREE_NODES or depth > MAX_TREE_DEPTH:
        raise GraphTooLarge(f"pytree spec over {MAX_TREE_NODES} nodes or {MAX_TREE_DEPTH} deep")
    if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
        raise MalformedGraph("pytree spec node is malformed")
    kind, children = node["type"], node["children_spec"]
    if not isinstance(children, list):
        raise MalformedGraph("pytree spec children are not a list")
    if kind is None:
        if children or node["context"] is not None:
            raise MalformedGraph("pytree spec leaf with children")
        return Tree("leaf")
    parsed = tuple(_tree(c, depth + 1, count) for c in children)
    if kind in _SEQUENCES:
        if node["context"] != "null":
            raise MalformedGraph(f"pytree spec {kind} with a context")
        return Tree(kind.removeprefix("builtins."), parsed)
    if kind == _DICT:
        try:
            keys = json.loads(node["context"]) if isinstance(node["context"], str) else None
        except (ValueError, RecursionError):
            keys = None
        if (
            not isinstance(keys, list)
            or len(keys) != len(parsed)
            or not all(isinstance(k, str) for k in keys)
            or len(set(keys)) != len(keys)
        ):
            raise MalformedGraph("pytree spec dict keys must be distinct strings, one per child")
        return Tree("dict", parsed, tuple(keys))
    raise MalformedGraph(
        f"pytree spec type {kind!r}: export inputs and outputs may be tensors in tuples, "
        "lists and dicts with string keys only"
    )


def _placeholders(graph: graph_pb2.Graph) -> Iterator[graph_pb2.Node]:
    return (n for n in graph.nodes if n.op == Node.PLACEHOLDER)


def static_shape(meta: graph_pb2.TensorMeta) -> list[int] | None:
    """The placeholder's shape as integers, or None when a dimension is symbolic."""
    dims: list[int] = []
    for size in meta.shape:
        if not size.expr.isdigit():
            return None
        dims.append(int(size.expr))
    return dims


def output_count(graph: graph_pb2.Graph) -> int:
    """How many values the graph returns (an exported graph returns a flat tuple)."""
    out = graph.nodes[-1].args[0]
    kind = out.WhichOneof("kind")
    if kind in ("tuple", "list"):
        return len(getattr(out, kind).items)
    raise MalformedGraph("an exported graph must return a tuple")


def validate_export(graph: graph_pb2.Graph, spec: farm_pb2.ExportSpec) -> None:
    """Raises MalformedGraph unless `spec` fits `graph` (which validate_graph passed)."""
    if graph.constants:
        raise MalformedGraph("an export graph carries its constants as weights, not inline")
    if graph.meshes:
        raise MalformedGraph("the farm exports no DTensor graph")
    by_name = {n.name: n for n in _placeholders(graph)}
    for node in by_name.values():
        if not node.HasField("tensor"):
            raise MalformedGraph(f"export input {node.name!r} is not a tensor")
    fqns: set[str] = set()
    named: set[str] = set()
    for w in spec.weights:
        _weight(w, by_name, fqns, named)
    inputs = [name for name in by_name if name not in named]
    in_tree = parse_treespec(spec.in_spec)
    if in_tree.kind != "tuple" or [c.kind for c in in_tree.children] != ["tuple", "dict"]:
        raise MalformedGraph("the inputs' pytree spec must be (args tuple, kwargs dict)")
    if in_tree.leaves() != len(inputs):
        raise MalformedGraph(
            f"the inputs' pytree spec has {in_tree.leaves()} tensors, the graph {len(inputs)} inputs"
        )
    outputs = output_count(graph)
    if parse_treespec(spec.out_spec).leaves() != outputs:
        raise MalformedGraph(f"the outputs' pytree spec does not match the graph's {outputs} outputs")
    declared = {s.name for s in graph.symbols}
    seen: set[str] = set()
    for dim in spec.dims:
        if dim.symbol not in declared or dim.symbol in seen:
            raise MalformedGraph(f"dynamic dimension {dim.symbol!r} is undeclared or repeated")
        if dim.min < 0 or (dim.max and dim.max < dim.min):
            raise MalformedGraph(f"dynamic dimension {dim.symbol!r} has range [{dim.min}, {dim.max}]")
        seen.add(dim.symbol)
    for name in inputs:
        for i, size in enumerate(by_name[name].tensor.shape):
            if not size.expr.isdigit() and size.expr not in seen:
                raise MalformedGraph(
                    f"input {name!r} dimension {i} is {size.expr!r}: the farm exports plain "
                    "dynamic dimensions (torch.export.Dim), not derived ones"
                )


def _weight(
    w: farm_pb2.ExportWeight, by_name: dict[str, graph_pb2.Node], fqns: set[str], named: set[str]
) -> None:
    where = f"weight {w.fqn!r}"
    node = by_name.get(w.placeholder)
    if node is None or w.placeholder in named:
        raise MalformedGraph(f"{where} names no placeholder, or one already taken")
    if not _FQN_RE.match(w.fqn) or w.fqn in fqns:
        raise MalformedGraph(f"{where}: not a distinct dotted attribute path")
    if w.kind not in (Weight.PARAMETER, Weight.BUFFER, Weight.CONSTANT):
        raise MalformedGraph(f"{where}: unknown kind {w.kind}")
    if w.dtype not in DTYPE_ITEMSIZE or w.dtype != node.tensor.dtype:
        raise MalformedGraph(f"{where}: dtype {w.dtype!r} is unknown or not its placeholder's")
    if static_shape(node.tensor) != list(w.shape):
        raise MalformedGraph(f"{where}: shape {list(w.shape)} is not its placeholder's")
    numel = 1
    for d in w.shape:
        numel *= d
    if numel * DTYPE_ITEMSIZE[w.dtype] != len(w.data):
        raise MalformedGraph(f"{where}: {len(w.data)} bytes, shape and dtype say {numel * DTYPE_ITEMSIZE[w.dtype]}")
    fqns.add(w.fqn)
    named.add(w.placeholder)
