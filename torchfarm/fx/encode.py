"""Encodes a Dynamo-captured FX graph into the farm's own format (`graph_pb2.Graph`).

The SDK's Dynamo backend receives `(gm, example_inputs)` and calls `encode_graph`. The
message carries exactly what a compile needs and nothing executable: ops as qualified
names, typed arguments, placeholder metadata (shape, stride, dtype, device, kind,
symbolic sizes) and small inline constants. Weights never leave the client; node meta
(stack traces, source locations, module stacks) is dropped.

The encoding is canonical: the same model gives byte-identical
`SerializeToString(deterministic=True)` in any process, because the farm's cache key is
computed from those bytes.

Behaviour pinned against torch 2.13.0:
- builtin ops report `__module__ == "torch"` and `__qualname__ ==
  "_VariableFunctionsClass.<name>"`; they are importable as `torch.<name>`;
- `F.max_pool2d` and friends are `boolean_dispatch.<locals>.fn` closures, named here
  by the public attribute that holds them;
- Dynamo stores a placeholder's `Source` on `node._dynamo_source`, and a buffer's source
  chain contains a source with `member == "_buffers"`;
- `torch.fx.experimental.symbolic_shapes.ShapeEnv.backed_var_to_val` and `var_to_range`
  hold a symbol's hint and bounds.
"""

from __future__ import annotations

import functools
import logging
import operator
import sys
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from torchfarm.fx import meshes as fx_meshes
from torchfarm.fx import torch_library as fx_library
from torchfarm.fx.internals import resolve
from torchfarm.fx.noops import droppable_nodes, own_qualname
from torchfarm.fx.process_groups import UnresolvedGroup, describe_groups
from torchfarm.graph import allowlist, customops, textcheck
from torchfarm.graph.graph_errors import GraphError
from torchfarm.graph.graphcheck import DTYPE_ITEMSIZE, GraphLimits, validate_graph
from torchfarm.v1 import graph_pb2

log = logging.getLogger(__name__)

Node = graph_pb2.Node
TensorMeta = graph_pb2.TensorMeta


class UnsupportedGraph(Exception):
    """The graph cannot be represented in the farm's format; compile it locally."""


# ---------------------------------------------------------------------------
# Target names
# ---------------------------------------------------------------------------

# Public namespaces searched for a name when an object's own `__module__`/`__qualname__`
# does not lead back to it (closures such as F.max_pool2d). First match wins.
_ALIAS_NAMESPACES = (
    "torch.nn.functional",
    "torch.functional",
    "torch.fft",
    "torch.linalg",
    "torch.special",
    "torch",
)


def lookup_qualified_name(name: str) -> object | None:
    """The object `name` denotes, by attribute access from an imported root module."""
    root, *path = name.split(".")
    obj: object | None = sys.modules.get(root)
    for part in path:
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


@functools.cache
def _public_aliases() -> dict[int, str]:
    aliases: dict[int, str] = {}
    for ns_name in _ALIAS_NAMESPACES:
        ns = lookup_qualified_name(ns_name)
        for attr in sorted(dir(ns)):
            if attr.startswith("_"):
                continue
            obj = getattr(ns, attr, None)
            if callable(obj) and not isinstance(obj, type):
                aliases.setdefault(id(obj), f"{ns_name}.{attr}")
    return aliases


_OP_TYPES = (resolve("OpOverload"), resolve("OpOverloadPacket"))
_HIGHER_ORDER_OP = resolve("HigherOrderOperator")

NUMPY_PREFIX = "numpy:"
"""Marks a numpy call as Dynamo puts it in a graph: a `torch._numpy` function, an
ndarray method or an operator on ndarrays, each inside a wrapper of `torch._dynamo.utils`
that makes tensors of the result. The name after it is the wrapped call's."""

NUMPY_METHODS = "torch._numpy._ndarray.ndarray."
"""Where an ndarray method's name goes after `NUMPY_PREFIX`."""


_NUMPY_NAMESPACES = ("torch._numpy", "torch._numpy.fft", "torch._numpy.linalg", "torch._numpy.random")


@functools.cache
def _numpy_aliases() -> dict[int, str]:
    """torch._numpy's public callables by id: many are decorated, so their own
    `__module__` and `__qualname__` do not lead back to them."""
    resolve("torch_numpy")  # imported: Dynamo imports it when a graph calls numpy
    aliases: dict[int, str] = {}
    for ns_name in _NUMPY_NAMESPACES:
        ns = lookup_qualified_name(ns_name)
        for attr in sorted(dir(ns)):
            if not attr.startswith("_") and callable(getattr(ns, attr, None)):
                aliases.setdefault(id(getattr(ns, attr)), f"{ns_name}.{attr}")
    return aliases


def _numpy_function(fn: object) -> str:
    name = _numpy_aliases().get(id(fn))
    return name if name is not None else qualified_name(fn)


def numpy_name(target: object) -> str | None:
    """The name of a wrapped numpy call ("numpy:torch._numpy._ufuncs.lcm"); None if
    `target` is no such wrapper (`decode.numpy_call` makes the wrapper back)."""
    if isinstance(target, resolve("numpy_to_tensor_wrapper")):
        return NUMPY_PREFIX + _numpy_function(target.f)
    if isinstance(target, resolve("numpy_method_wrapper")):
        return NUMPY_PREFIX + NUMPY_METHODS + target.method
    if isinstance(target, resolve("numpy_operator_wrapper")):
        return NUMPY_PREFIX + qualified_name(target.op)
    return None


@functools.cache
def _tensor_methods() -> dict[int, str]:
    """Each Tensor method's function, by id, to its attribute name (first in sorted order
    where one function has two names)."""
    methods: dict[int, str] = {}
    for name in sorted(dir(torch.Tensor)):
        value = getattr(torch.Tensor, name, None)
        if callable(value) and not isinstance(value, type):
            methods.setdefault(id(value), name)
    return methods


def tensor_method_name(target: object) -> str | None:
    """The method's name when `target` is a Tensor method called as a function.

    Dynamo records a method written in Python (`Tensor.split` in torch/_tensor.py) as a
    call of the function `torch._tensor.Tensor.split`, not as `call_method`, when a
    torch-function mode is active (`torch.set_default_device`, `with torch.device(...)`)
    or the code calls `torch.Tensor.split(x, ...)`. On the plain tensors a graph takes
    both forms run the same function, so the format carries one: the method."""
    name = _tensor_methods().get(id(target))
    return name if name is not None and getattr(torch.Tensor, name, None) is target else None


def qualified_name(target: object) -> str:
    """The canonical, importable name of a call_function target.

    `torch.arange` -> "torch.arange" (not "torch._VariableFunctionsClass.arange"),
    `operator.getitem` -> "_operator.getitem", `aten.add.Tensor` ->
    "torch.ops.aten.add.Tensor". Raises `UnsupportedGraph` if no name leads back to it.
    """
    if isinstance(target, _OP_TYPES):
        name = f"torch.ops.{target}"
    elif isinstance(target, _HIGHER_ORDER_OP):
        name = f"torch.ops.{target.namespace}.{target.name()}"
    else:
        module = getattr(target, "__module__", None)
        qualname = own_qualname(target)
        name = f"{module}.{qualname}" if module and qualname else ""
        if module == "torch" and qualname and qualname.startswith("_VariableFunctionsClass."):
            name = "torch." + qualname.partition(".")[2]
    if name and lookup_qualified_name(name) is target:
        return name
    alias = _public_aliases().get(id(target))
    if alias is not None:
        return alias
    if "handle_from_local.<locals>" in str(getattr(target, "__qualname__", "")):
        raise UnsupportedGraph(
            "DTensor.from_local as this torch's Dynamo records it (a closure over the mesh and "
            "placements) cannot be sent to the farm; torch 2.12 and newer record the call itself"
        )
    if (str(getattr(target, "__module__", "")).startswith("torch._dynamo.")
            and "setattr.<locals>._lower_version_count_by_" in str(getattr(target, "__qualname__", ""))):
        raise UnsupportedGraph(
            "the version counter step of `.data =` as Dynamo records it, beside the `set_` that "
            "replaces the tensor's storage (`module.to(...)` inside forward does both)"
        )
    raise UnsupportedGraph(f"call target {_described(target)} has no importable qualified name")


def _described(target: object) -> str:
    """`module.qualname` for a message: a repr may hold an address, which would make the
    same refusal read differently in every process."""
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return type(target).__qualname__ + " object"


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _device(device: torch.device) -> graph_pb2.Device:
    return graph_pb2.Device(type=device.type, index=-1 if device.index is None else device.index)


def _bound(value: sympy.Expr) -> int | None:
    try:
        return int(value)
    except (TypeError, AttributeError, ValueError):  # int_oo, -int_oo
        return None


def _tensor_bytes(t: torch.Tensor) -> bytes:
    if sys.byteorder != "little":
        raise UnsupportedGraph("inline constants need a little-endian client")
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    # tolist() keeps numpy optional; constants are at most GraphLimits.max_constant_bytes.
    return bytes(flat.view(torch.uint8).tolist())


def _index_rank(item: object) -> int:
    """How many dimensions one item of an index tuple consumes (numpy rules)."""
    if item is None or isinstance(item, bool):
        return 0
    if isinstance(item, torch.fx.Node):
        value = item.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            return value.dim() if value.dtype in (torch.bool, torch.uint8) else 1
        if isinstance(value, (int, torch.SymInt)):
            return 1
        raise UnsupportedGraph(f"cannot tell what index {item.name} consumes")
    if isinstance(item, (int, slice, list, torch.SymInt)):
        return 1
    raise UnsupportedGraph(f"unsupported index item {item!r}")


def _expand_ellipsis(tensor: object, index: object) -> object:
    """Rewrites `x[..., i]` as `x[:, :, i]`: the format has no Ellipsis value.

    Numpy indexing defines `...` as exactly the `:` slices needed to cover the rank, so
    the rewrite is exact. It needs the tensor's rank, which is static even under
    dynamic shapes.
    """
    items = index if isinstance(index, tuple) else (index,)
    if not any(item is Ellipsis for item in items):
        return index
    value = tensor.meta.get("example_value") if isinstance(tensor, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or sum(i is Ellipsis for i in items) != 1:
        raise UnsupportedGraph("cannot expand an Ellipsis index")
    fill = value.dim() - sum(_index_rank(i) for i in items if i is not Ellipsis)
    if fill < 0:
        raise UnsupportedGraph("index has more items than the tensor has dimensions")
    expanded: list[object] = []
    for item in items:
        expanded.extend([slice(None)] * fill if item is Ellipsis else [item])
    return tuple(expanded)


_INDEXING = (operator.getitem, operator.setitem)
# Dynamo's example values are FakeTensors (Parameters keep their class and pass
# isinstance(.., Parameter)); DTensor and other wrapper subclasses cannot be described.
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter, resolve("FakeTensor"))


class _Encoder:
    def __init__(
        self, gm: torch.fx.GraphModule, limits: GraphLimits,
        outer: _Encoder | None = None, depth: int = 0,
    ) -> None:
        self.gm = gm
        self.limits = limits
        self.graph = graph_pb2.Graph(format=graph_pb2.GRAPH_FORMAT_V1)
        self.root: _Encoder = outer.root if outer is not None else self
        """The outermost graph's encoder: it holds the symbols and the constant budget."""
        self.depth = depth
        self.symbols: set[str] = set()
        self.constants: set[str] = set()
        self.subgraphs: dict[str, graph_pb2.Graph] = {}
        self.constant_bytes = 0
        self.meshes: list[object] = []
        """The outermost graph's device meshes, in the order placeholders first name them."""

    # -- symbolic sizes ----------------------------------------------------
    def size(self, value: object) -> graph_pb2.SymExpr:
        if isinstance(value, int):
            return graph_pb2.SymExpr(expr=str(value), hint=value)
        if not isinstance(value, torch.SymInt):
            raise UnsupportedGraph(f"unsupported size {value!r}")
        node = value.node
        expr = node.expr
        if expr.is_number:
            return graph_pb2.SymExpr(expr=str(int(expr)), hint=int(expr))
        for symbol in sorted(expr.free_symbols, key=str):
            self.declare(symbol, node.shape_env)
        hint = node.hint
        if not isinstance(hint, int):
            raise UnsupportedGraph(f"size {expr} has no hint (unbacked)")
        return graph_pb2.SymExpr(expr=str(expr), hint=hint)

    def declare(self, symbol: sympy.Symbol, shape_env: Any) -> None:
        if self.root is not self:
            self.root.declare(symbol, shape_env)  # a subgraph uses the outermost graph's symbols
            return
        name = str(symbol)
        if name in self.symbols:
            return
        hint = shape_env.backed_var_to_val.get(symbol)
        if hint is None:
            raise UnsupportedGraph(f"symbol {name} is unbacked")
        if not getattr(hint, "is_Integer", isinstance(hint, int)):
            # A jagged nested tensor's ragged size: its value is a nested int, j1.
            raise UnsupportedGraph(f"symbol {name} stands for {hint}, not an integer (a nested tensor's size)")
        vr = shape_env.var_to_range.get(symbol)
        low = _bound(vr.lower) if vr is not None else None
        high = _bound(vr.upper) if vr is not None else None
        self.symbols.add(name)
        self.graph.symbols.add(
            name=name,
            hint=int(hint),
            min=max(low or 0, 0),
            max=high if high is not None and 0 < high < 2**63 else 0,
        )

    # -- placeholders ------------------------------------------------------
    def placeholder(self, node: torch.fx.Node, example: object, out: graph_pb2.Node) -> None:
        # A decomposed graph's nodes (workers/aot_seam.py) carry "val", Dynamo's "example_value".
        value = node.meta.get("example_value", node.meta.get("val", example))
        if isinstance(value, torch.SymInt):
            out.symint.CopyFrom(self.size(value))
            return
        mesh = next((v for v in (value, example) if fx_meshes.is_mesh(v)), None)
        if mesh is not None:
            out.mesh.mesh = self.mesh_index(mesh, node)
            return
        if fx_meshes.is_dtensor(value):
            self.dtensor(node, value, example, out)
            return
        self.tensor_meta(node, value, example, out.tensor)

    def tensor_meta(self, node: torch.fx.Node, value: object, example: object, meta: graph_pb2.TensorMeta) -> None:
        if not isinstance(value, torch.Tensor):
            raise UnsupportedGraph(
                f"placeholder {node.name} is a {type(value).__name__}, not a tensor or SymInt"
            )
        for v in (value, example):
            if isinstance(v, torch.Tensor) and type(v) not in _PLAIN_TENSOR_TYPES:
                raise UnsupportedGraph(
                    f"placeholder {node.name} is a tensor subclass {type(v).__name__}"
                )
        if value.layout != torch.strided:
            raise UnsupportedGraph(f"placeholder {node.name} has layout {value.layout}")
        dtype = dtype_name(value.dtype)
        if dtype not in DTYPE_ITEMSIZE:
            raise UnsupportedGraph(f"placeholder {node.name} has dtype {dtype}")
        offset = value.storage_offset()
        if not isinstance(offset, int):
            raise UnsupportedGraph(f"placeholder {node.name} has a symbolic storage offset")
        meta.shape.extend(self.size(s) for s in value.shape)
        meta.stride.extend(self.size(s) for s in value.stride())
        meta.dtype = dtype
        meta.device.CopyFrom(_device(value.device))
        meta.requires_grad = value.requires_grad
        meta.storage_offset = offset
        meta.kind = _kind(node, value, example)

    def mesh_index(self, mesh: object, node: torch.fx.Node) -> int:
        if self.root is not self:
            raise UnsupportedGraph(f"placeholder {node.name}: a subgraph takes a device mesh")
        for i, known in enumerate(self.meshes):
            if fx_meshes.same_mesh(known, mesh):
                return i
        self.meshes.append(mesh)
        return len(self.meshes) - 1

    def dtensor(self, node: torch.fx.Node, value: torch.Tensor, example: object, out: graph_pb2.Node) -> None:
        """The local tensor as the placeholder's TensorMeta; its mesh, placements and
        global sizes beside it."""
        try:
            placements = fx_meshes.placements_of(value)
        except fx_meshes.Undescribable as e:
            raise UnsupportedGraph(f"placeholder {node.name}: {e}") from e
        local = fx_meshes.local_tensor(value)
        self.tensor_meta(node, local, local, out.tensor)
        out.tensor.requires_grad = value.requires_grad
        out.tensor.kind = _kind(node, value, example)
        meta = out.dtensor
        meta.mesh = self.mesh_index(value.device_mesh, node)  # type: ignore[attr-defined]
        meta.placements.extend(placements)
        meta.shape.extend(self.size(s) for s in value.shape)
        meta.stride.extend(self.size(s) for s in value.stride())

    # -- constants ---------------------------------------------------------
    def constant(self, target: str) -> None:
        if target in self.constants:
            return
        value: object = self.gm
        for part in target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.fx.GraphModule):
            self.subgraph(target, value)
            return
        if isinstance(value, torch.nn.Module):
            raise UnsupportedGraph(f"get_attr {target} is a {type(value).__name__}, not a graph")
        if not isinstance(value, torch.Tensor):
            raise UnsupportedGraph(
                f"get_attr {target} is a {type(value).__name__}, not a tensor constant"
            )
        if not target.isidentifier():
            raise UnsupportedGraph(f"constant name {target!r} is not an identifier")
        if value.layout != torch.strided or value.device.type != "cpu":
            # graph.proto's Constant has no device field; see the SDK's fallback.
            raise UnsupportedGraph(f"constant {target} is not a dense CPU tensor")
        dtype = dtype_name(value.dtype)
        if dtype not in DTYPE_ITEMSIZE:
            raise UnsupportedGraph(f"constant {target} has dtype {dtype}")
        self.root.constant_bytes += value.numel() * value.element_size()
        if self.root.constant_bytes > self.limits.max_constant_bytes:
            raise UnsupportedGraph(
                f"inline constants exceed {self.limits.max_constant_bytes} bytes"
            )
        self.constants.add(target)
        self.graph.constants.add(
            name=target,
            shape=list(value.shape),
            dtype=dtype,
            data=_tensor_bytes(value),
            requires_grad=value.requires_grad,
        )

    # -- custom ops (torchfarm/fx/torch_library.py) -----------------------------
    def custom_op(self, node: torch.fx.Node, text: str, out: graph_pb2.Node) -> None:
        try:
            schema = customops.parse_schema(text)
            out.target = schema.target  # a packet's call names its overload
            if all(op.target != out.target for op in self.graph.custom_ops):
                self.graph.custom_ops.add(target=out.target, schema=text)
            out.custom.CopyFrom(
                fx_library.record_call(node, schema, lambda v: fx_library.tensor_meta(v, self.size))
            )
        except (GraphError, TypeError) as e:
            raise UnsupportedGraph(str(e)) from e
    # -- subgraphs ---------------------------------------------------------
    def subgraph(self, target: str, gm: torch.fx.GraphModule) -> None:
        """A higher-order op's body (checkpoint's, cond's branches, ...): encoded as a graph
        of its own, named by `target` (two get_attr nodes may name one body)."""
        if target in self.subgraphs:
            return
        if not target.isidentifier():
            raise UnsupportedGraph(f"subgraph name {target!r} is not an identifier")
        if self.depth + 1 > self.limits.max_subgraph_depth:
            raise UnsupportedGraph(f"subgraphs nested deeper than {self.limits.max_subgraph_depth}")
        inner = _Encoder(gm, self.limits, outer=self, depth=self.depth + 1)
        inner.encode_nodes([])
        self.subgraphs[target] = inner.graph

    # -- arguments ---------------------------------------------------------
    def arg(self, value: object, depth: int = 1) -> graph_pb2.Argument:
        if depth > self.limits.max_nesting_depth:
            raise UnsupportedGraph(f"arguments nested deeper than {self.limits.max_nesting_depth}")
        a = graph_pb2.Argument()
        if isinstance(value, torch.fx.Node):
            a.node = value.name
        elif value is None:
            a.none.SetInParent()
        elif isinstance(value, bool):
            a.bool_value = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise UnsupportedGraph(f"integer {value} does not fit in 64 bits")
            a.int_value = value
        elif isinstance(value, float):
            a.float_value = value
        elif isinstance(value, complex):
            a.complex_value.real, a.complex_value.imag = value.real, value.imag
        elif isinstance(value, str):
            a.str_value = value
        elif isinstance(value, list):
            a.list.SetInParent()  # an empty list is still a list
            a.list.items.extend(self.arg(v, depth + 1) for v in value)
        elif type(value) in (tuple, torch.Size):
            a.tuple.SetInParent()
            a.tuple.items.extend(self.arg(v, depth + 1) for v in value)  # type: ignore[attr-defined]
        elif isinstance(value, slice):
            for field in ("start", "stop", "step"):
                getattr(a.slice, field).CopyFrom(self.arg(getattr(value, field), depth + 1))
        elif isinstance(value, torch.SymInt):
            a.sym.CopyFrom(self.size(value))
        elif _torch_constant(value, a):
            pass
        elif type(value) in (dict, torch.fx.immutable_collections.immutable_dict):
            a.immutable_dict.SetInParent()
            for key, item in value.items():  # type: ignore[attr-defined]
                if not isinstance(key, (str, int)):
                    raise UnsupportedGraph(f"dict key {key!r} is not a str or int")
                a.immutable_dict.items.extend([self.arg(key, depth + 1), self.arg(item, depth + 1)])
        else:
            raise UnsupportedGraph(
                f"cannot encode argument of type {type(value).__name__}: {value!r}"
            )
        return a

    # -- nodes -------------------------------------------------------------
    def node(self, node: torch.fx.Node, example: object) -> None:
        out = self.graph.nodes.add(name=node.name)
        args: Sequence[object] = node.args
        if node.op == "placeholder":
            out.op = Node.PLACEHOLDER
            out.target = str(node.target)
            self.placeholder(node, example, out)
            return
        method = tensor_method_name(node.target) if node.op == "call_function" else None
        if method is not None:
            if not args or not isinstance(args[0], torch.fx.Node):
                raise UnsupportedGraph(f"node {node.name}: Tensor.{method} called on no node")
            out.op = Node.CALL_METHOD
            out.target = method
            if not allowlist.is_allowed_method(method):
                raise UnsupportedGraph(allowlist.refusal(method, "method"))
        elif node.op == "call_function":
            out.op = Node.CALL_FUNCTION
            out.target = numpy_name(node.target) or qualified_name(node.target)
            schema = fx_library.describe(node.target)
            if schema is not None:
                self.custom_op(node, schema, out)
            elif not allowlist.is_allowed_function(out.target):
                raise UnsupportedGraph(allowlist.refusal(out.target, "op"))
            if node.target in _INDEXING and len(args) >= 2:
                args = (args[0], _expand_ellipsis(args[0], args[1]), *args[2:])
        elif node.op == "call_method":
            out.op = Node.CALL_METHOD
            out.target = str(node.target)
            if not allowlist.is_allowed_method(out.target):
                raise UnsupportedGraph(allowlist.refusal(out.target, "method"))
        elif node.op == "get_attr":
            out.op = Node.GET_ATTR
            out.target = str(node.target)
            self.constant(out.target)
        elif node.op == "output":
            out.op = Node.OUTPUT
            out.target = "output"
        else:
            raise UnsupportedGraph(f"node {node.name}: {node.op} nodes are not supported")
        kwargs = dict(node.kwargs)
        if out.op == Node.CALL_FUNCTION and textcheck.is_message(out.target):
            # An assert's quotes would have the farm refuse the graph (textcheck.py).
            args = [textcheck.as_message(a) if isinstance(a, str) else a for a in args]
            kwargs = {k: textcheck.as_message(v) if isinstance(v, str) else v for k, v in kwargs.items()}
        out.args.extend(self.arg(a) for a in args)
        for key in sorted(kwargs):
            out.kwargs.add(name=key, value=self.arg(kwargs[key]))


    def encode_nodes(self, example_inputs: Sequence[object]) -> None:
        """Every node but the droppable ones; then the subgraphs they named, sorted."""
        placeholders = iter(example_inputs)
        dropped = droppable_nodes(self.gm)
        for node in self.gm.graph.nodes:
            example = next(placeholders, None) if node.op == "placeholder" else None
            if node not in dropped:
                self.node(node, example)
        for name in sorted(self.subgraphs):
            self.graph.subgraphs.add(name=name, graph=self.subgraphs[name])
        if self.depth > 0 or self.subgraphs:
            # V2 only where a graph has subgraphs: every other graph keeps its V1 bytes, so
            # its cache key does not change.
            self.graph.format = graph_pb2.GRAPH_FORMAT_V2


def refused_calls(gm: torch.fx.GraphModule, *, limits: GraphLimits = GraphLimits()) -> dict[torch.fx.Node, str]:
    """The call nodes of `gm` the format refuses on their own (an op the farm does not
    take, an argument it cannot hold), each with the refusal `encode_graph` would raise.

    A refused subgraph (a get_attr) refuses the calls that take it. What refuses the
    graph as a whole (a placeholder, its size) is not here: `encode_graph` still raises
    it. The SDK runs these calls eagerly and sends the rest (sdk/split.py)."""
    encoder = _Encoder(gm, limits)
    dropped = droppable_nodes(gm)
    refused: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in dropped:
            continue
        try:
            encoder.node(node, None)
        except UnsupportedGraph as e:
            refused[node] = str(e)
    for node in [n for n in refused if n.op == "get_attr"]:
        for user in node.users:
            refused.setdefault(user, refused[node])
        del refused[node]
    return refused


def _torch_constant(value: object, a: graph_pb2.Argument) -> bool:
    """Sets `a` to a dtype, device, layout, memory format or DTensor placement; False
    for any other value."""
    if isinstance(value, torch.dtype):
        a.dtype = dtype_name(value)
    elif isinstance(value, torch.device):
        a.device.CopyFrom(_device(value))
    elif isinstance(value, torch.layout):
        a.layout = str(value).removeprefix("torch.")
    elif isinstance(value, torch.memory_format):
        a.memory_format = str(value).removeprefix("torch.")
    elif fx_meshes.is_placement(value):
        try:
            a.placement.CopyFrom(fx_meshes.describe_placement(value))
        except fx_meshes.Undescribable as e:
            raise UnsupportedGraph(str(e)) from e
    else:
        return False
    return True


def _kind(node: torch.fx.Node, value: torch.Tensor, example: object) -> TensorMeta.Kind:
    if isinstance(value, torch.nn.Parameter) or isinstance(example, torch.nn.Parameter):
        return TensorMeta.PARAMETER
    source = getattr(node, "_dynamo_source", None)
    while source is not None:
        if getattr(source, "member", None) == "_buffers":
            return TensorMeta.BUFFER
        source = getattr(source, "base", None)
    return TensorMeta.INPUT


def _checkpoint_policy(gm: torch.fx.GraphModule) -> str:
    """The `context_fn` a checkpointed body carries (Dynamo keeps it in the body's meta,
    where AOTAutograd's partitioner reads it), by name; empty if none does."""
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            policy = module.meta.get("_checkpoint_context_fn")
            if policy is not None:
                return _callable_name(policy)
    return ""


def _callable_name(fn: object) -> str:
    """`f`, or `f(g)` for a functools.partial of `f` over a function `g` (the policy
    `create_selective_checkpoint_contexts` is given)."""
    if isinstance(fn, functools.partial):
        inner = [_callable_name(a) for a in fn.args if callable(a)]
        return f"{_callable_name(fn.func)}({', '.join(inner)})"
    return str(getattr(fn, "__qualname__", type(fn).__name__))


def written_aliases(gm: torch.fx.GraphModule, example_inputs: Sequence[object] | None = None) -> list[str]:
    """Placeholders that share memory (views of one tensor) where the graph writes one
    of them in place, by name; empty if none. Dynamo's fake inputs keep the real ones'
    sharing, and an in-place write while it traced bumped their shared version counter.
    Making the fake of a tensor that shares another's memory without being its view
    (two `split` outputs of one graph) bumps its counter once too: given the real
    `example_inputs`, a write is a version past the one fakes made of them start at."""
    fake = resolve("FakeTensor")
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    reals = list(example_inputs) if example_inputs is not None else []
    groups: dict[object, list[tuple[str, torch.Tensor, object]]] = {}
    for i, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if type(value) is not fake or value.layout != torch.strided:
            continue
        real = reals[i] if len(reals) == len(placeholders) else None
        groups.setdefault(StorageWeakRef(value.untyped_storage()), []).append((node.name, value, real))
    shared = [members for members in groups.values() if len(members) > 1]
    if not shared:
        return []
    starts = _fresh_versions([real for members in shared for _, _, real in members])
    for members in shared:
        if any(value._version > starts.get(id(real), 0) for _, value, real in members):
            return [name for name, _, _ in members]
    return []


def _fresh_versions(given: list[object]) -> dict[int, int]:
    """The version each real tensor's fake starts at, made as Dynamo makes them: in one
    fake mode, so tensors that share memory share it there too."""
    reals = [r for r in given if isinstance(r, torch.Tensor) and type(r) is not resolve("FakeTensor")]
    if len(reals) != len(given):
        return {}
    mode = resolve("FakeTensorMode")()
    try:
        return {id(r): mode.from_tensor(r)._version for r in reals}
    except Exception:  # noqa: BLE001 - a tensor subclass torch cannot fake apart: every version past 0 is a write
        return {}


def encode_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    limits: GraphLimits = GraphLimits(),
) -> graph_pb2.Graph:
    """Encodes a Dynamo graph; raises `UnsupportedGraph` if the format cannot hold it.

    `example_inputs` are what the Dynamo backend received, one per placeholder; their
    metadata is read from each placeholder's `meta["example_value"]` when present. The
    result has passed `validate_graph`, so the coordinator will not reject it.
    """
    policy = _checkpoint_policy(gm)
    if policy:
        raise UnsupportedGraph(
            f"selective activation checkpointing: its policy ({policy}) is this process's Python, "
            "which the farm does not run; sent without it, the farm would save other activations"
        )
    written = written_aliases(gm, example_inputs)
    if written:
        raise UnsupportedGraph(
            f"inputs {' and '.join(written)} share memory and the graph writes them in place: "
            "the format describes each input apart, and a compile that took them as apart "
            "would compute wrongly"
        )
    encoder = _Encoder(gm, limits)
    encoder.encode_nodes(example_inputs)
    graph = encoder.graph
    try:
        graph.groups.extend(describe_groups(gm))
        graph.meshes.extend(fx_meshes.describe_mesh(m) for m in encoder.meshes)
    except (UnresolvedGroup, fx_meshes.Undescribable) as e:
        raise UnsupportedGraph(str(e)) from e
    if encoder.meshes:
        graph.rank = torch.distributed.get_rank()
        if len(encoder.meshes) == 1 and not graph.groups:
            fx_meshes.share_submesh(graph, encoder.meshes[0])
    try:
        validate_graph(graph, limits)
    except GraphError as e:
        raise UnsupportedGraph(f"encoded graph is not valid: {e}") from e
    log.debug(
        "encoded graph: %d nodes, %d symbols, %d constant bytes",
        len(graph.nodes),
        len(graph.symbols),
        encoder.constant_bytes,
    )
    return graph
