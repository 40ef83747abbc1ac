"""Rebuilds a serialized graph (`graph_pb2.Graph`) into an FX GraphModule on the worker.

`decode_graph` validates the message, resolves every target through the allow-list
(attribute access on imported modules, never eval), makes fake example inputs under a
fresh `FakeTensorMode(shape_env=ShapeEnv())` with the graph's symbols as real ShapeEnv
symbols, and runs fake-tensor propagation. The result is what
`torch._inductor.standalone_compile(..., dynamic_shapes="from_example_inputs",
fake_mode=decoded.fake_mode)` needs.

Anything wrong with the graph surfaces as a `torchfarm.graph.graph_errors.GraphError`.

Behaviour pinned against torch 2.13.0:
- AOTAutograd's cache (`check_node_safe` in torch/_functorch/_aot_autograd/autograd_cache.py)
  bypasses a graph whose call_method receivers lack `meta["example_value"]`; the
  serializable artifact needs that cache, so every node gets its fake value there.
- `_try_get_metadata_from_dynamo` only asks for `_dynamo_source` on placeholders when
  `gm.meta` has "dynamo_compile_id"; a decoded graph is not a Dynamo graph and sets none.
- `ShapeEnv.create_symbol(..., DimDynamic.DYNAMIC)` names symbols from a hash of the
  source name, so decoding is deterministic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging
import math
import operator
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import sympy
import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from torchfarm.fx import global_state
from torchfarm.fx import meshes as fx_meshes
from torchfarm.fx import torch_library as fx_library
from torchfarm.fx.encode import NUMPY_METHODS, NUMPY_PREFIX
from torchfarm.fx.internals import resolve
from torchfarm.graph import allowlist, customops, graphbounds
from torchfarm.graph.graph_errors import DisallowedOp, GraphError, GraphTooLarge, MalformedGraph
from torchfarm.graph.graphcheck import GraphLimits, SymAst, parse_sym_expr, validate_graph
from torchfarm.v1 import graph_pb2

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

sym_functions = resolve("sym_functions")
int_oo = resolve("int_oo")

log = logging.getLogger(__name__)

Node = graph_pb2.Node
TensorMeta = graph_pb2.TensorMeta

_ROOT_MODULES = frozenset({"torch", "_operator", "math", "builtins"})
"""The only modules a target name may start from."""

MAX_SEQUENCE_REPEAT = 1 << 16
"""Largest n in `sequence * n` during propagation; Dynamo never needs more."""
MAX_INT_BITS = 64
"""Integers computed during propagation must fit in this many bits (sizes are int64)."""


@dataclass
class DecodedGraph:
    """A graph ready for `standalone_compile(gm, example_inputs, fake_mode=fake_mode)`."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    """Fake tensors (Parameters where the client had Parameters) and SymInts."""
    fake_mode: FakeTensorMode
    shape_env: ShapeEnv
    symbols: dict[str, sympy.Expr] = dataclasses.field(default_factory=dict)
    """The client's symbol name → this ShapeEnv's expression for it (a symbol, or an
    integer where the ShapeEnv specialized it): how shipped guards name symbols."""


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------


def resolve_qualified_name(qualname: str) -> Any:
    """The object a qualified name denotes, by attribute access and module import.

    Does not consult the allow-list; `resolve_function` does. Imports only modules on
    the dotted path itself (say `torch._functorch.predispatch`).
    """
    root, *path = qualname.split(".")
    if root not in _ROOT_MODULES:
        raise DisallowedOp(qualname)
    if qualname.startswith("torch.ops.prims."):
        # Inductor's own prims (prims.fma, which a graph captured after Inductor ran can
        # hold) exist once its module is imported: a fresh worker has not yet.
        resolve("inductor_prims")
    obj: Any = importlib.import_module(root)
    prefix = root
    for part in path:
        prefix = f"{prefix}.{part}"
        found = getattr(obj, part, None)
        if found is None and isinstance(obj, types.ModuleType):
            try:
                found = importlib.import_module(prefix)
            except ImportError:
                found = None
        if found is None:
            raise MalformedGraph(f"target {qualname!r} does not exist in this torch")
        obj = found
    return obj


def numpy_call(name: str) -> Callable[..., Any]:
    """The wrapper Dynamo puts in a graph for a numpy call, from the name
    `encode.numpy_name` gave it: an ndarray method, an operator, or a function."""
    inner = name.removeprefix(NUMPY_PREFIX)
    if inner.startswith(NUMPY_METHODS):
        method = inner.removeprefix(NUMPY_METHODS)
        if not method.isidentifier():
            raise MalformedGraph(f"target {name!r} names no ndarray method")
        return cast(Callable[..., Any], resolve("numpy_method_wrapper")(method))
    wrapper = "numpy_operator_wrapper" if inner.startswith("_operator.") else "numpy_to_tensor_wrapper"
    return cast(Callable[..., Any], resolve(wrapper)(resolve_qualified_name(inner)))


def resolve_target(name: str) -> Any:
    """The object a call_function target's name denotes, allowed or not."""
    return numpy_call(name) if name.startswith(NUMPY_PREFIX) else resolve_qualified_name(name)


@functools.cache
def resolve_function(qualname: str) -> Callable[..., Any]:
    """The callable for an allow-listed call_function target; `DisallowedOp` otherwise."""
    if not allowlist.is_allowed_function(qualname):
        raise DisallowedOp(qualname)
    obj = resolve_target(qualname)
    if not callable(obj):
        raise MalformedGraph(f"target {qualname!r} is not callable")
    return obj


# ---------------------------------------------------------------------------
# Guards for pure-Python ops during propagation
# ---------------------------------------------------------------------------

_REPEATS = {operator.mul, operator.imul}
_EXPONENTIAL = {operator.pow, operator.ipow, operator.lshift, operator.ilshift}


def _int_value(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return hint if isinstance(hint, int) else None
    return None


_BY_NAME = {
    "add": operator.add, "concat": operator.add, "mul": operator.mul,
    "pow": operator.pow, "lshift": operator.lshift,
}


def _check_python_method(name: str, args: Sequence[object], limits: GraphLimits) -> None:
    """The same bounds for `x.__pow__(n)`, `n.__rpow__(x)`, `t.__mul__(n)`, ...: a dunder
    method is the operator under another name (graphbounds.python_operator)."""
    _check_formatting(name, args)
    applied = graphbounds.python_operator(name)
    if applied is None or len(args) != 2:
        return
    op, reflected = applied
    _check_python_op(_BY_NAME[op], args[::-1] if reflected else args, limits)


def _check_python_op(target: object, args: Sequence[object], limits: GraphLimits | None = None) -> None:
    """Refuses Python arithmetic that would take unbounded time or memory.

    Tensor ops run on fake tensors and cost nothing; `_operator` on Python values runs
    for real, so `[0] * 10**12` or `s0 ** 10**9` must be stopped before it starts.
    """
    longest = (limits or GraphLimits()).max_sequence_length
    if target in (operator.mod, operator.imod):
        _check_formatting(f"_operator.{target.__name__}", args)
    if target in _PRODUCTS:
        _check_product(target, args[0] if target is math.prod and len(args) == 1 else args)
    if target in (operator.add, operator.iadd, operator.concat, operator.iconcat) and len(args) == 2:
        a, b = args
        if isinstance(a, (tuple, list, str, bytes)) and isinstance(b, (tuple, list, str, bytes)) \
                and len(a) + len(b) > longest:
            raise MalformedGraph(f"sequence of {len(a) + len(b)} items, more than {longest}")
    if target in _REPEATS and len(args) == 2:
        for seq, count in (args, args[::-1]):
            n = _int_value(count)
            if (
                isinstance(seq, (str, bytes, tuple, list))
                and n is not None
                and (n > MAX_SEQUENCE_REPEAT or len(seq) * n > longest)
            ):
                raise MalformedGraph(f"sequence repeated {n} times")
    if target in _EXPONENTIAL and len(args) == 2:
        base, exponent = (_int_value(a) for a in args)
        if base is not None and exponent is not None and abs(exponent) > MAX_INT_BITS:
            raise MalformedGraph(f"integer {getattr(target, '__name__', target)} by {exponent}")


def _check_formatting(name: str, args: Sequence[object]) -> None:
    """Refuses `%` on a string, whatever node made the string (graphbounds.FORMATTING)."""
    formatted = graphbounds.FORMATTING.get(name)
    if formatted is not None and len(args) == 2 and isinstance(args[formatted], (str, bytes)):
        raise MalformedGraph(f"string formatting ({name} of a string) is not a graph operation")


_PRODUCTS: dict[object, str] = {math.prod: "math.prod", math.lcm: "math.lcm"}


def _check_product(target: object, values: object) -> None:
    """Refuses math.prod or math.lcm of integers whose result would pass MAX_INT_BITS,
    before Python builds it: over 65,536 integers the running product takes seconds per
    node. The result is checked anyway; this bounds every step on the way to it."""
    if not isinstance(values, (list, tuple)):
        return
    ints = [_int_value(v) for v in values]
    if any(n is None for n in ints):
        return  # floats and unbacked symbols: no integer to grow
    step = math.lcm if target is math.lcm else operator.mul
    running = 1
    for n in cast(list[int], ints):
        running = step(running, n)
        if running.bit_length() > MAX_INT_BITS:
            raise MalformedGraph(f"{_PRODUCTS[target]} of {len(ints)} integers needs more than {MAX_INT_BITS} bits")


def _check_outputs(name: str, args: Sequence[object], kwargs: dict[str, Any], limits: GraphLimits) -> None:
    """Refuses an op whose argument asks for more outputs than a sequence may hold
    (graphbounds.output_count, on the actual sizes): `unbind` of a 2**28-row tensor
    allocates 2**28 tensors in C++, past the reach of any time limit."""
    many = graphbounds.many_outputs(name) if isinstance(name, str) else None
    if many is None or not args or not isinstance(args[0], torch.Tensor):
        return
    hints = [_int_value(s) for s in args[0].shape]
    shape = None if any(h is None for h in hints) else cast(list[int], hints)
    count = graphbounds.output_count(many, shape, [_plain(a) for a in args[1:]], {k: _plain(v) for k, v in kwargs.items()})
    if count is not None and count > limits.max_sequence_length:
        raise GraphTooLarge(f"{name} would make {count} outputs, more than {limits.max_sequence_length}")


def _plain(value: object) -> object:
    """An argument as graphbounds.output_count reads it: ints (SymInts at their hints),
    lists and tuples as they are, anything else unknown."""
    if isinstance(value, (list, tuple)):
        return value
    return _int_value(value)


def _check_int_result(result: object) -> None:
    n = _int_value(result)
    if n is not None and n.bit_length() > MAX_INT_BITS:
        raise MalformedGraph(f"integer result needs {n.bit_length()} bits")


def _inside_grad_or_jvp() -> bool:
    """Whether a functorch grad or jvp level is running, innermost or not (hessian's
    jacrev runs a vmap level inside jacfwd's jvp, whose results the jvp level wraps)."""
    kinds = resolve("functorch_transforms")
    return any(level.key() in (kinds.Grad, kinds.Jvp) for level in resolve("functorch_stack")() or ())


class _Propagate(FakeTensorProp):
    """FakeTensorProp that fakes inline constants and bounds Python arithmetic."""

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.fx.GraphModule):
            return value  # a subgraph: the higher-order op that takes it runs it on fakes
        return self._mode.from_tensor(value, static_shapes=True)

    limits = GraphLimits()
    """The decoder's limits; set per graph."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if _inside_grad_or_jvp():
            # Inside `torch.func.grad` (or `jvp`) a result is the level's wrapper of a fake,
            # which torch cannot snapshot as a `val` (the copy's leafness differs, or a
            # view of one cannot be converted to meta). Dynamo leaves it
            # as the `example_value` AOTAutograd's cache looks for, and so does this.
            result = torch.fx.Interpreter.run_node(self, n)
            n.meta["example_value"] = result
            return result
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        # An operator on ndarrays runs the operator itself on whatever is not a tensor.
        _check_python_op(getattr(target, "op", target), args, self.limits)
        _check_outputs(str(getattr(target, "_opname", None) or getattr(target, "__name__", "")), args, kwargs, self.limits)
        result = super().call_function(target, args, kwargs)
        _check_int_result(result)
        return result

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        _check_python_method(target, args, self.limits)
        _check_outputs(target, args, kwargs, self.limits)
        result = super().call_method(target, args, kwargs)
        _check_int_result(result)
        return result


def _flex_bodies(gm: torch.fx.GraphModule) -> set[int]:
    """The ids of `gm`'s submodules that its flex attention calls take as bodies."""
    hops = resolve("flex_attention_hops")
    targets = {hops.flex_attention, hops.flex_attention_backward}
    bodies: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets:
            for arg in resolve("pytree").tree_leaves((node.args, node.kwargs)):
                if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                    bodies.add(id(getattr(gm, str(arg.target))))
    return bodies


class _BodyPropagate(_Propagate):
    """Fake values on a subgraph's nodes as Dynamo leaves them: `example_value` only, not
    detached. FakeTensorProp's `val` is detached (`snapshot_fake`), and invoke_subgraph's
    autograd, reading `val` first, took every output of its body for one that needs no
    gradient (a backward with no tangents); with no `val` it runs the body instead."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        n.meta.pop("val", None)
        if n.op != "output":
            n.meta["example_value"] = result
        return result


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

_SYM_FUNCTIONS: dict[str, Callable[..., sympy.Expr]] = {
    "Mod": sym_functions.Mod,
    "PythonMod": sym_functions.PythonMod,
    "FloorDiv": sym_functions.FloorDiv,
    "Max": sym_functions.Max,
    "Min": sym_functions.Min,
}


def _sympy(tree: SymAst, symbols: dict[str, sympy.Expr]) -> sympy.Expr:
    kind = tree[0]
    if kind == "int":
        return sympy.Integer(tree[1])
    if kind == "sym":
        return symbols[tree[1]]
    if kind == "neg":
        return -_sympy(tree[1], symbols)
    if kind == "pow":
        return _sympy(tree[1], symbols) ** tree[2]
    if kind == "call":
        return _SYM_FUNCTIONS[tree[1]](*(_sympy(t, symbols) for t in tree[2]))
    acc = _sympy(tree[1], symbols)  # "chain": left to right
    for op, operand in tree[2]:
        value = _sympy(operand, symbols)
        if op == "+":
            acc = acc + value
        elif op == "-":
            acc = acc - value
        elif op == "*":
            acc = acc * value
        else:
            acc = sym_functions.FloorDiv(acc, value)
    return acc


def _device(device: graph_pb2.Device) -> torch.device:
    return (
        torch.device(device.type, device.index) if device.index >= 0 else torch.device(device.type)
    )


def _constant_tensor(const: graph_pb2.Constant) -> torch.Tensor:
    """The constant, a real tensor even where a fake mode is active (a decomposition
    decodes inside its request's, workers/aot_seam.py)."""
    dtype = getattr(torch, const.dtype)
    shape = tuple(const.shape)
    with resolve("unset_fake_temporarily")():
        if not const.data:
            t = torch.empty(shape, dtype=dtype)
        else:
            raw = torch.frombuffer(bytearray(const.data), dtype=torch.uint8)
            t = raw.view(dtype).reshape(shape).clone()
        return t.requires_grad_(const.requires_grad)


class _Decoder:
    def __init__(
        self, graph: graph_pb2.Graph, limits: GraphLimits,
        fake_mode: FakeTensorMode | None = None, bound: dict[str, sympy.Expr] | None = None,
    ) -> None:
        self.pb = graph
        self.limits = limits
        self.fake_mode = fake_mode or resolve("FakeTensorMode")(shape_env=resolve("ShapeEnv")())
        # Every fake mode here has a ShapeEnv: made above, or the decoded request's own.
        self.shape_env = cast("ShapeEnv", self.fake_mode.shape_env)
        self.bound = bound
        """Set when the graph's symbols are an existing ShapeEnv's: name → expression."""
        self.symbols: dict[str, sympy.Expr] = {}
        self.sizes: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}
        """Each size expression's value and hint, by its text: graphs repeat a few of them
        thousands of times, and parsing and sympy are slow (symbols never change)."""
        self.env: dict[str, torch.fx.Node] = {}
        self.children: list[tuple[torch.fx.GraphModule, list[Any], _Decoder]] = []
        self.meshes: list[Any] = []

    def declare(self, sym: graph_pb2.Symbol) -> None:
        if self.bound is not None:
            if sym.name not in self.bound:
                raise MalformedGraph(f"symbol {sym.name} is not one of the request's")
            self.symbols[sym.name] = self.bound[sym.name]
            return
        expr = self.shape_env.create_symbol(
            sym.hint,
            source=resolve("ConstantSource")(f"torchfarm_{sym.name}"),
            dynamic_dim=resolve("DimDynamic"),
            do_not_specialize_zero_one=sym.min < 2,
        )
        if isinstance(expr, sympy.Symbol):
            self.shape_env.constrain_symbol_range(expr, sym.min, sym.max or int_oo)
        self.symbols[sym.name] = expr

    def size(self, expr: graph_pb2.SymExpr) -> int | torch.SymInt:
        found = self.sizes.get(expr.expr)
        if found is None:
            tree = parse_sym_expr(expr.expr, self.symbols, self.limits)
            value = _sympy(tree, self.symbols)
            hint = value.xreplace(self.shape_env.backed_var_to_val)
            if not hint.is_Integer:
                raise MalformedGraph(f"size {expr.expr!r} is not an integer")
            found = self.sizes[expr.expr] = (value, hint)
        value, hint = found
        if value.is_number:
            return int(value)
        return self.shape_env.create_symintnode(value, hint=int(hint))

    def symint(self, expr: graph_pb2.SymExpr) -> torch.SymInt:
        """A SymInt input, a SymInt even where its value is a number: Dynamo passes a size
        it specialized as a SymInt, and Inductor compares a higher-order op's operands with
        its body's placeholders by kind (`torch.cond` given a plain int there failed the
        compile)."""
        value = self.size(expr)
        if isinstance(value, int):
            node = resolve("SymNode")(sympy.Integer(value), self.shape_env, int, value)
            return torch.SymInt(node)
        return value

    def tensor(self, meta: graph_pb2.TensorMeta, local: bool = False) -> torch.Tensor:
        """A fake tensor of `meta`; with `local`, a DTensor's local tensor: no grad, no
        Parameter (the DTensor made of it has them)."""
        shape = [self.size(s) for s in meta.shape]
        stride = [self.size(s) for s in meta.stride]
        dtype = getattr(torch, meta.dtype)
        device = _device(meta.device)
        with self.fake_mode:
            if meta.storage_offset == 0:
                t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            else:
                # A view into a larger storage, as the client's input was.
                empty = any(isinstance(n, int) and n == 0 for n in shape)
                extent = 0 if empty else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=False))
                base = torch.empty(meta.storage_offset + extent, dtype=dtype, device=device)
                t = base.as_strided(shape, stride, meta.storage_offset).detach()
        if local:
            return t
        t.requires_grad_(meta.requires_grad)
        if meta.kind == TensorMeta.PARAMETER:
            t = torch.nn.Parameter(t, requires_grad=meta.requires_grad)
        elif meta.requires_grad:
            t = _computed(t)
        return t

    def placeholder(self, pb: graph_pb2.Node) -> Any:
        """A placeholder's example input: a fake tensor or DTensor, a SymInt, or a mesh."""
        if pb.HasField("symint"):
            return self.symint(pb.symint)
        if pb.HasField("mesh"):
            return self.meshes[pb.mesh.mesh]
        if not pb.HasField("dtensor"):
            return self.tensor(pb.tensor)
        local = self.tensor(pb.tensor, local=True)
        with self.fake_mode:
            return fx_meshes.build_dtensor(
                local, self.meshes[pb.dtensor.mesh], pb.dtensor, self.size,
                requires_grad=pb.tensor.requires_grad, parameter=pb.tensor.kind == TensorMeta.PARAMETER,
            )

    def value(self, arg: graph_pb2.Argument) -> Any:
        kind = arg.WhichOneof("kind")
        if kind == "node":
            return self.env[arg.node]
        if kind == "none":
            return None
        if kind in ("bool_value", "int_value", "float_value", "str_value"):
            return getattr(arg, kind)
        if kind == "complex_value":
            return complex(arg.complex_value.real, arg.complex_value.imag)
        if kind == "list":
            return [self.value(a) for a in arg.list.items]
        if kind == "tuple":
            return tuple(self.value(a) for a in arg.tuple.items)
        if kind == "slice":
            return slice(
                self.value(arg.slice.start), self.value(arg.slice.stop), self.value(arg.slice.step)
            )
        if kind == "dtype":
            return getattr(torch, arg.dtype)
        if kind == "device":
            return _device(arg.device)
        if kind == "layout":
            return getattr(torch, arg.layout)
        if kind == "memory_format":
            return getattr(torch, arg.memory_format)
        if kind == "sym":
            return self.size(arg.sym)
        if kind == "immutable_dict":
            items = [self.value(a) for a in arg.immutable_dict.items]
            return dict(zip(items[::2], items[1::2], strict=False))
        if kind == "placement":
            return fx_meshes.placement(arg.placement)
        raise MalformedGraph(f"unknown argument kind {kind}")

    def subgraph(self, graph: graph_pb2.Graph) -> torch.fx.GraphModule:
        """A higher-order op's body: the same fake mode and the outermost graph's symbols.
        Its placeholders' fakes (the body's parameters, not the graph's inputs) are kept
        for `propagate_subgraphs`."""
        inner = _Decoder(graph, self.limits, fake_mode=self.fake_mode, bound=self.symbols)
        inner.symbols = self.symbols
        gm, inputs = inner.build()
        self.children.append((gm, inputs, inner))
        return gm

    def propagate_subgraphs(self, parent: torch.fx.GraphModule) -> None:
        """Fake values on every subgraph node, as Dynamo left them: higher-order ops read
        them (invoke_subgraph's autograd takes which outputs need a gradient from its
        body's output metadata, and without it traced a backward with no tangents).
        Flex attention's bodies run as Dynamo traced them, under the mode that makes
        `captured[h]` an index op rather than a data-dependent `.item()`."""
        flex = _flex_bodies(parent)
        for gm, inputs, inner in self.children:
            propagate = _BodyPropagate(gm, mode=self.fake_mode)
            propagate.limits = self.limits
            indexing = resolve("TransformGetItemToIndex")() if id(gm) in flex else contextlib.nullcontext()
            with indexing:
                propagate.propagate_dont_convert_inputs(*inputs)
            inner.propagate_subgraphs(gm)

    def build(self) -> tuple[torch.fx.GraphModule, list[Any]]:
        """The GraphModule and its fake example inputs, one per placeholder."""
        for sym in self.pb.symbols:
            self.declare(sym)
        self.meshes = [fx_meshes.build_mesh(m, self.pb.rank) for m in self.pb.meshes]
        root = torch.nn.Module()
        attrs: dict[str, str] = {}
        for i, const in enumerate(self.pb.constants):
            # Private attribute names: a constant called "training" must not clobber Module state.
            attrs[const.name] = attr = f"_torchfarm_constant_{i}"
            root.register_buffer(attr, _constant_tensor(const))
        for i, sub in enumerate(self.pb.subgraphs):
            attrs[sub.name] = attr = f"_torchfarm_subgraph_{i}"
            root.add_module(attr, self.subgraph(sub.graph))
        custom = customops.declared_ops(self.pb)
        if custom:
            fx_library.install(
                self.pb.custom_ops,
                [pb.custom if pb.HasField("custom") else None for pb in self.pb.nodes],
                [pb.target for pb in self.pb.nodes],
                self.size,
            )
        fx = torch.fx.Graph()
        inputs: list[Any] = []
        for pb in self.pb.nodes:
            args = tuple(self.value(a) for a in pb.args)
            kwargs = {kw.name: self.value(kw.value) for kw in pb.kwargs}
            if pb.op == Node.PLACEHOLDER:
                node = fx.create_node("placeholder", pb.name, name=pb.name)
                # The client's target becomes a parameter name in generated code; use
                # FX's sanitized node name instead.
                node.target = node.name
                inputs.append(self.placeholder(pb))
                if pb.HasField("tensor") and pb.tensor.kind in (TensorMeta.PARAMETER, TensorMeta.BUFFER):
                    node.meta[STATIC_INPUT] = True
            elif pb.op == Node.CALL_FUNCTION:
                fn = fx_library.resolve(custom[pb.target]) if pb.target in custom else resolve_function(pb.target)
                node = fx.create_node("call_function", fn, args, kwargs, name=pb.name)
            elif pb.op == Node.CALL_METHOD:
                if not allowlist.is_allowed_method(pb.target):
                    raise DisallowedOp(pb.target, kind="method")
                node = fx.create_node("call_method", pb.target, args, kwargs, name=pb.name)
            elif pb.op == Node.GET_ATTR:
                node = fx.create_node("get_attr", attrs[pb.target], name=pb.name)
            else:
                node = fx.output(args[0])
            self.env[pb.name] = node
        return torch.fx.GraphModule(root, fx), inputs

    def run(self) -> DecodedGraph:
        gm, inputs = self.build()
        with global_state.preserved(), _as_dynamo_propagates():
            # Bodies first: a higher-order op reads its bodies' fake values when it runs
            # (torch 2.11's while_loop, for its schema).
            self.propagate_subgraphs(gm)
            propagate = _Propagate(gm, mode=self.fake_mode)
            propagate.limits = self.limits
            propagate.propagate_dont_convert_inputs(*inputs)
        _mark_example_values(gm)
        return DecodedGraph(
            gm=gm,
            example_inputs=inputs,
            fake_mode=self.fake_mode,
            shape_env=self.shape_env,
            symbols=dict(self.symbols),
        )


def _as_dynamo_propagates() -> contextlib.AbstractContextManager[None]:
    """The Python dispatcher, on as Dynamo has it when it fakes a node (`get_fake_value`):
    ops whose C++ kernel takes concrete sizes only (`constant_pad_nd`) reach their
    Python meta or decomposition with it. Without it `F.pad` by a symbolic amount (`math.lcm`
    of a dynamic size) failed with "SymIntArrayRef expected to contain only concrete
    integers" on a graph Dynamo had traced."""
    return cast(contextlib.AbstractContextManager[None], resolve("enable_python_dispatcher")())


STATIC_INPUT = "torchfarm_static_input"
"""Set in the meta of a placeholder that was a parameter or a buffer in the client's
graph: what Dynamo passes as a static input (workers/compiler.py `static_inputs`)."""


def _mark_example_values(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]


def decode_graph(graph: graph_pb2.Graph, limits: GraphLimits = GraphLimits()) -> DecodedGraph:
    """Validates and rebuilds `graph`; raises `GraphError` subclasses only."""
    validate_graph(graph, limits)
    with _type_errors():
        return _Decoder(graph, limits).run()


def decode_graph_into(
    graph: graph_pb2.Graph, fake_mode: FakeTensorMode, symbols: dict[str, sympy.Expr],
    inputs: Sequence[Any] | None = None, *, propagate: bool = True,
    limits: GraphLimits = GraphLimits(),
) -> torch.fx.GraphModule:
    """Rebuilds a graph derived from a decoded request (workers/aot_seam.py) inside that
    request's `fake_mode`: `symbols` binds each symbol name the graph uses to the
    ShapeEnv's expression, and `inputs`, when given, are the placeholders' values
    (else fake tensors are made from the graph's metadata). Every node gets its fake
    value in `meta["val"]`; with `propagate=False` only the placeholders do, for a
    graph whose every reader propagates fake values itself first (Inductor compiling a
    partitioned graph). Raises `GraphError` subclasses only."""
    validate_graph(graph, limits)
    with _type_errors():
        decoder = _Decoder(graph, limits, fake_mode=fake_mode, bound=symbols)
        gm, made = decoder.build()
        values = made if inputs is None else list(inputs)
        if propagate:
            with global_state.preserved(), _as_dynamo_propagates():
                _Propagate(gm, mode=fake_mode).propagate_dont_convert_inputs(*values)
                decoder.propagate_subgraphs(gm)
        else:
            for node, value in zip(gm.graph.find_nodes(op="placeholder"), values, strict=True):
                node.meta["val"] = value
        return gm


def _computed(t: torch.Tensor) -> torch.Tensor:
    """`t` with autograd history, as Dynamo's fake of an activation has: an input that
    requires grad and is no parameter is, after a graph break, the last graph's output,
    which the graph may write in place (`hidden *= scale`), as eager may. A leaf could
    not be, and a graph that writes one in place outside no_grad fails in eager too. The
    history is the one Dynamo's fakes get (meta_utils), which keeps every size and stride."""
    return cast("torch.Tensor", resolve("DelayedError")("an example input has no backward", 1)(t))


@contextlib.contextmanager
def _type_errors() -> Iterator[None]:
    try:
        yield
    except GraphError:
        raise
    except Exception as e:  # noqa: BLE001 - torch rejected the graph while building it
        # Validation covers structure; what is left is a graph that does not type-check
        # (wrong shapes for an op, a bad argument type), which torch reports with
        # whatever exception it likes.
        log.info("graph rejected during fake propagation: %s: %s", type(e).__name__, e)
        raise MalformedGraph(f"graph does not type-check: {type(e).__name__}: {e}") from e
