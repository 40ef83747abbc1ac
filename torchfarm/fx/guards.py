"""Shape guards a farm compile added: their wire form, and their installation in Dynamo.

In a local `torch.compile`, AOTAutograd and Inductor add guards to Dynamo's own
ShapeEnv while they compile (0/1 and divisibility specializations, `Eq`/`Ne` decisions
taken from size hints, index-width bounds), and Dynamo then guards the frame on them.
On the farm they land in the worker's ShapeEnv. The worker therefore records the
guards its compile added, writes each as a small JSON tree over the *client's* symbol
names (`encode`), and ships them in the signed manifest. The SDK rebuilds them over its
own symbols (`decode`), checks them against this capture's hints (`holds`), and
installs them in Dynamo's ShapeEnv (`install`) before it returns the compiled callable.

A tree is a JSON list `[kind, *operands]`. Kinds are a fixed allow-list of sympy node
kinds; leaves are `["Integer", n]`, `["Rational", p, q]`, `["Float", x]` (finite),
`["Symbol", name]`, `["True"]` and `["False"]`. Nothing is ever parsed as an expression string, evaluated
or unpickled; sizes, depth and exponents are bounded.

Behaviour pinned against torch 2.13.0 (tests/unit/test_guards.py):
- `ShapeEnv.guards` is a list of `ShapeGuard(expr, sloc, size_oblivious)` and
  `ShapeEnv.deferred_runtime_asserts` maps a symbol (or None) to `RuntimeAssert`s;
  both only grow during a compile;
- `ShapeEnv.evaluate_expr(expr)` evaluates a boolean over backed symbols with their
  hints and appends the guard that Dynamo turns into guard code for the frame, once
  the backend has returned;
- `ShapeEnv.backed_var_to_val` maps each backed symbol to its hint;
- an expression over unbacked symbols (`.item()` under `capture_scalar_outputs`) is a
  runtime assert that the compiled code itself checks (`_assert_scalar` nodes that
  `insert_deferred_runtime_asserts` adds), never a guard on the frame's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from torchfarm.fx.internals import resolve

sym_functions = resolve("sym_functions")
free_unbacked_symbols = resolve("free_unbacked_symbols")

Tree = list
"""`[kind, *operands]`, JSON-serializable."""

MAX_GUARDS = 4096
"""Guards one manifest may carry; a compile adds a handful."""
MAX_TREE_NODES = 4096
"""Nodes in one guard's tree."""
MAX_DEPTH = 64
"""Nesting of one guard's tree."""
MAX_INT_BITS = 64
"""Integers in a guard fit in this many bits (sizes are int64)."""
MAX_EXPONENT = 64
"""Largest |n| in `Pow(x, n)`; a guard never needs more."""


class GuardError(ValueError):
    """A guard cannot be written in, or read from, the wire form."""


_RELATIONS: dict[str, Callable[..., Any]] = {
    "Eq": sympy.Eq,
    "Ne": sympy.Ne,
    "Lt": sympy.Lt,
    "Le": sympy.Le,
    "Gt": sympy.Gt,
    "Ge": sympy.Ge,
}
_VARIADIC: dict[str, Callable[..., Any]] = {
    "Add": sympy.Add,
    "Mul": sympy.Mul,
    "And": sympy.And,
    "Or": sympy.Or,
    "Max": sym_functions.Max,
    "Min": sym_functions.Min,
}
_BINARY: dict[str, Callable[..., Any]] = {
    **_RELATIONS,
    "Mod": sym_functions.Mod,
    "PythonMod": sym_functions.PythonMod,
    "FloorDiv": sym_functions.FloorDiv,
    "CleanDiv": sym_functions.CleanDiv,
    "CeilDiv": sym_functions.CeilDiv,
    # Sizes computed through floats (`interpolate(scale_factor=1.5)`), as torch writes them.
    "IntTrueDiv": sym_functions.IntTrueDiv,
    "FloatTrueDiv": sym_functions.FloatTrueDiv,
}
_TERNARY: dict[str, Callable[..., Any]] = {
    "ModularIndexing": sym_functions.ModularIndexing,
}
_UNARY: dict[str, Callable[..., Any]] = {
    "Not": sympy.Not,
    "ToFloat": sym_functions.ToFloat,
    "TruncToInt": sym_functions.TruncToInt,
    "FloorToInt": sym_functions.FloorToInt,
    "CeilToInt": sym_functions.CeilToInt,
    "RoundToInt": sym_functions.RoundToInt,
    "TruncToFloat": sym_functions.TruncToFloat,
}
_ARITY = {
    **{k: (1, None) for k in _VARIADIC},
    **{k: (2, 2) for k in _BINARY},
    **{k: (3, 3) for k in _TERNARY},
    **{k: (1, 1) for k in _UNARY},
}
_CONSTRUCTORS = {**_VARIADIC, **_BINARY, **_TERNARY, **_UNARY}

# sympy class name → wire kind, for the classes whose names differ from the kind.
_KIND_OF_CLASS = {
    "Equality": "Eq",
    "Unequality": "Ne",
    "StrictLessThan": "Lt",
    "LessThan": "Le",
    "StrictGreaterThan": "Gt",
    "GreaterThan": "Ge",
}


# ---------------------------------------------------------------------------
# Writing (the worker)
# ---------------------------------------------------------------------------


def encode(expr: sympy.Basic, names: Mapping[sympy.Symbol, str]) -> Tree:
    """`expr` as a tree, with each symbol renamed by `names` (the worker's symbols to
    the client's names). Raises GuardError for a symbol or a node kind it cannot write."""
    tree = _encode(expr, names, 1)
    _check_size(tree)
    return tree


def _encode(expr: sympy.Basic, names: Mapping[sympy.Symbol, str], depth: int) -> Tree:
    if depth > MAX_DEPTH:
        raise GuardError(f"guard nested deeper than {MAX_DEPTH}")
    if expr is sympy.true:
        return ["True"]
    if expr is sympy.false:
        return ["False"]
    if expr.is_Symbol:
        name = names.get(expr)
        if name is None:
            raise GuardError(f"guard mentions {expr}, which is not one of the graph's symbols")
        return ["Symbol", name]
    if expr.is_Integer:
        return ["Integer", _int(int(expr))]
    if expr.is_Rational:
        return ["Rational", _int(int(expr.p)), _int(int(expr.q))]
    if expr.is_Float:
        return ["Float", _float(float(expr))]
    cls = type(expr).__name__
    kind = _KIND_OF_CLASS.get(cls, cls)
    if kind == "Pow":
        base, exponent = expr.args
        if not exponent.is_Integer or abs(int(exponent)) > MAX_EXPONENT:
            raise GuardError(f"guard has the power {expr}")
        return ["Pow", _encode(base, names, depth + 1), ["Integer", int(exponent)]]
    if kind not in _ARITY:
        raise GuardError(f"guard has a {cls} ({expr}), which the wire form does not carry")
    return [kind, *(_encode(a, names, depth + 1) for a in expr.args)]


def _float(x: float) -> float:
    if not math.isfinite(x):
        raise GuardError(f"guard has the number {x}")
    return x


def _int(n: int) -> int:
    if n.bit_length() >= MAX_INT_BITS:
        raise GuardError(f"integer {n} in a guard needs more than {MAX_INT_BITS} bits")
    return n


def _check_size(tree: Tree) -> None:
    count = 0
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_TREE_NODES:
            raise GuardError(f"guard has more than {MAX_TREE_NODES} nodes")
        if isinstance(node, list) and node and node[0] not in ("Integer", "Rational", "Float", "Symbol"):
            stack.extend(node[1:])


# ---------------------------------------------------------------------------
# Reading (the client)
# ---------------------------------------------------------------------------


def decode(tree: Any, symbols: Mapping[str, sympy.Symbol]) -> sympy.Basic:
    """The sympy boolean a tree stands for, over `symbols` (client name → symbol).

    Raises GuardError for anything but a well-formed tree of allowed kinds, within the
    bounds above, over known symbols."""
    if isinstance(tree, list):
        _check_size(tree)
    expr = _decode(tree, symbols, 1)
    if not isinstance(expr, sympy.logic.boolalg.Boolean):
        raise GuardError(f"guard {expr} is not a condition")
    return expr


def _decode(tree: Any, symbols: Mapping[str, sympy.Symbol], depth: int) -> sympy.Basic:
    if depth > MAX_DEPTH:
        raise GuardError(f"guard nested deeper than {MAX_DEPTH}")
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise GuardError(f"malformed guard node {str(tree)[:60]!r}")
    kind, args = tree[0], tree[1:]
    if kind in ("True", "False") and not args:
        return sympy.true if kind == "True" else sympy.false
    if kind == "Integer" and len(args) == 1:
        return sympy.Integer(_wire_int(args[0]))
    if kind == "Rational" and len(args) == 2:
        p, q = _wire_int(args[0]), _wire_int(args[1])
        if q == 0:
            raise GuardError("guard divides by zero")
        return sympy.Rational(p, q)
    if kind == "Float" and len(args) == 1:
        if type(args[0]) is not float:
            raise GuardError(f"guard number {str(args[0])[:40]!r} is not a float")
        return sympy.Float(_float(args[0]))
    if kind == "Symbol" and len(args) == 1:
        symbol = symbols.get(args[0]) if isinstance(args[0], str) else None
        if symbol is None:
            raise GuardError(f"guard names {str(args[0])[:40]!r}, not a symbol of this graph")
        return symbol
    if kind == "Pow" and len(args) == 2:
        exponent = _decode(args[1], symbols, depth + 1)
        if not exponent.is_Integer or abs(int(exponent)) > MAX_EXPONENT:
            raise GuardError("guard has a power with a large or symbolic exponent")
        return sympy.Pow(_decode(args[0], symbols, depth + 1), exponent)
    arity = _ARITY.get(kind)
    if arity is None:
        raise GuardError(f"guard node kind {kind[:40]!r} is not allowed")
    low, high = arity
    if len(args) < low or (high is not None and len(args) > high):
        raise GuardError(f"guard node {kind} has {len(args)} operands")
    operands = [_decode(a, symbols, depth + 1) for a in args]
    try:
        return _CONSTRUCTORS[kind](*operands)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise GuardError(f"guard node {kind}: {e}") from e


def _wire_int(value: Any) -> int:
    if type(value) is not int:
        raise GuardError(f"guard integer {str(value)[:40]!r} is not an integer")
    return _int(value)


def decode_all(trees: Sequence[Any], symbols: Mapping[str, sympy.Symbol]) -> list[sympy.Basic]:
    if len(trees) > MAX_GUARDS:
        raise GuardError(f"the artifact carries {len(trees)} guards, more than {MAX_GUARDS}")
    return [decode(t, symbols) for t in trees]


def holds(expr: sympy.Basic, hints: Mapping[sympy.Symbol, int]) -> bool:
    """Whether the guard is true at `hints` (symbol → value). GuardError if it does not
    reduce to true or false there (a symbol without a hint)."""
    value = expr.xreplace({s: sympy.Integer(v) for s, v in hints.items()})
    if value is sympy.true:
        return True
    if value is sympy.false:
        return False
    raise GuardError(f"guard {expr} does not evaluate at this capture's sizes ({value})")


def install(shape_env: Any, guards: Iterable[sympy.Basic]) -> None:
    """Adds each guard to `shape_env` (Dynamo's, for the frame being compiled) the way
    Inductor would have: evaluated at the hints, so Dynamo guards the frame on it."""
    for expr in guards:
        if shape_env.evaluate_expr(expr) is not sympy.true:
            raise GuardError(f"guard {expr} is false in this process's shape environment")


# ---------------------------------------------------------------------------
# The worker's side: what a compile added
# ---------------------------------------------------------------------------


def snapshot(shape_env: Any) -> tuple[int, frozenset]:
    """A mark of what `shape_env` holds now: its guard count and its runtime asserts."""
    return len(shape_env.guards), frozenset(_asserts(shape_env))


def added_since(shape_env: Any, mark: tuple[int, frozenset]) -> list[sympy.Basic]:
    """The guard and runtime-assert expressions added after `snapshot` returned `mark`,
    without repeats, guards first in the order they were added.

    Those over an unbacked symbol (a while_loop's trip count, say) are left out: no
    input's size gives its value, so Dynamo cannot check them before a call either; the
    compiled code asserts them at run time, as in a local compile."""
    count, asserts_before = mark
    exprs = [g.expr for g in shape_env.guards[count:]]
    exprs += [e for e in _asserts(shape_env) if e not in asserts_before]
    seen: set[sympy.Basic] = set()
    out = []
    for e in exprs:
        if free_unbacked_symbols(e):
            continue
        if e not in seen and e is not sympy.true:
            seen.add(e)
            out.append(e)
    return out


def _asserts(shape_env: Any) -> list[sympy.Basic]:
    return [ra.expr for ras in shape_env.deferred_runtime_asserts.values() for ra in ras]


# ---------------------------------------------------------------------------
# The client's side: Dynamo's ShapeEnv for the graph being compiled
# ---------------------------------------------------------------------------


@dataclass
class CaptureShapes:
    """The symbols of one captured graph in Dynamo's ShapeEnv, by the names the graph
    was encoded with, and their hints (this capture's sizes)."""

    shape_env: Any
    """Dynamo's ShapeEnv for the frame; None for a graph with no symbols."""
    symbols: dict[str, sympy.Symbol]
    hints: dict[sympy.Symbol, int]
    positions: dict[sympy.Symbol, int] = field(default_factory=dict)
    """The symbols the graph takes as inputs of their own (Dynamo lifts each size it
    keeps symbolic to a SymInt placeholder), and where: a call's value of each."""

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, names: Iterable[str]) -> CaptureShapes:
        wanted = set(names)
        shape_env = _find_shape_env(gm) if wanted else None
        if shape_env is None:
            return cls(None, {}, {})
        hints = {s: int(v) for s, v in shape_env.backed_var_to_val.items() if str(s) in wanted}
        positions = {}
        for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
            value = node.meta.get("example_value")
            if isinstance(value, torch.SymInt) and value.node.expr in hints:
                positions[value.node.expr] = i
        return cls(shape_env, {str(s): s for s in hints}, hints, positions)

    def read(self, trees: Sequence[Any]) -> list[sympy.Basic]:
        """The manifest's guards over this capture's symbols; GuardError if they cannot be."""
        if trees and self.shape_env is None:
            raise GuardError("the artifact carries shape guards, but this graph has no symbols")
        return decode_all(trees, self.symbols)

    def false_ones(self, guards: Iterable[sympy.Basic]) -> list[sympy.Basic]:
        """The guards that do not hold at this capture's sizes."""
        return [g for g in guards if not holds(g, self.hints)]

    def install(self, guards: Sequence[sympy.Basic]) -> None:
        if guards:
            install(self.shape_env, guards)

    def call_guard(self, guards: Sequence[sympy.Basic]) -> CallGuard:
        """The guards, checked at each call from its size inputs: for a graph that
        already runs, whose frame's guards Dynamo built without them (wait=False).
        GuardError if a guard names a size the graph does not take as an input."""
        named = set().union(*(g.free_symbols for g in guards))
        missing = sorted(str(s) for s in named - set(self.positions))
        if missing:
            raise GuardError(f"its shape guards name {', '.join(missing)}, which this graph takes "
                             "from no input of its own, so no call can check them")
        return CallGuard(list(guards), {s: self.positions[s] for s in sorted(named, key=str)})


class CallGuard:
    """An artifact's shape guards, checked at each call of a graph from the call's size
    inputs; each set of sizes is checked once."""

    MAX_SIZES = 4096
    """Sets of sizes remembered; past it, the memory starts afresh."""

    def __init__(self, guards: list[sympy.Basic], positions: dict[sympy.Symbol, int]):
        self._guards = guards
        self._positions = positions
        self._seen: dict[tuple[int, ...], bool] = {}

    def admits(self, args: Sequence[Any]) -> bool:
        """Whether every guard holds at these call arguments' sizes."""
        sizes = tuple(int(args[i]) for i in self._positions.values())
        verdict = self._seen.get(sizes)
        if verdict is None:
            if len(self._seen) >= self.MAX_SIZES:
                self._seen.clear()
            hints = dict(zip(self._positions, sizes, strict=True))
            verdict = self._seen[sizes] = all(holds(g, hints) for g in self._guards)
        return verdict


def _find_shape_env(gm: torch.fx.GraphModule) -> Any:
    context = resolve("TracingContext.try_get")()
    if context is not None and context.fake_mode is not None and context.fake_mode.shape_env is not None:
        return context.fake_mode.shape_env
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if isinstance(value, torch.SymInt):
            return value.node.shape_env
        if isinstance(value, torch.Tensor):
            for size in value.shape:
                if isinstance(size, torch.SymInt):
                    return size.node.shape_env
    return None
