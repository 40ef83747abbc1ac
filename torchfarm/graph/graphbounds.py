"""Bounds on what a graph can make a worker compute or allocate. Free of torch.

A graph of a few hundred bytes can ask a worker for unbounded work in four ways, each
stopped here, on the coordinator and again on the worker (both run `validate_graph`,
which calls these functions), before anything is evaluated:

- a size expression whose exponents nest (`((s0)**64)**64...`): `check_expr` bounds its
  parse-tree nodes and the bits it can reach with every symbol at 64 bits;
- Python operators, by name or as dunder methods (`__pow__`, `__rpow__`, `__mul__`):
  `python_operator` maps both spellings to one operator, so no spelling skips a check;
- sequences that grow node by node (`t + t`, doubling): `SequenceBounds` tracks an upper
  bound on the length of each tuple or list a node can produce;
- tensors too large to fake or to allocate for autotuning: `numel_at_hints` gives a
  placeholder's elements with its symbols at their hints, for the per-placeholder and
  whole-graph element limits in `GraphLimits`;
- ops whose number of outputs comes from an argument (`unbind`, `split`, `chunk`,
  `tensor_split`, ...): `output_count` bounds it, from the literal count or from the
  input's shape where it is known (a placeholder's, at its hints), under the sequence
  limit. One `unbind` of a 2**28-element placeholder makes 2**28 tensors, in C++.

The worker's propagation re-checks the Python operators and the output counts on the
actual values (`torchfarm/fx/decode.py`), with the same functions and limits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

MAX_EXPR_NODES = 1024
"""Parse-tree nodes in one size expression; sympy prints real ones in a few dozen."""

MAX_EXPR_BITS = 64 * 64
"""Bits a size expression may reach with every symbol and integer at 64 bits: `s0**64`."""

SYMBOL_BITS = 64
"""Bits assumed of a symbol's value when bounding an expression (sizes are int64)."""

MAX_OPERATOR_EXPONENT = 64
"""Largest literal exponent or shift a graph may give `**` or `<<` on Python ints."""

_OPERATORS: dict[str, tuple[str, bool]] = {
    # target or method name → (operator, whether the node's first operand is the right one)
    **{f"_operator.{op}": (op.lstrip("i") if op in ("iadd", "imul", "ipow", "ilshift", "iconcat") else op, False)
       for op in ("add", "iadd", "mul", "imul", "pow", "ipow", "lshift", "ilshift", "concat", "iconcat")},
    **{f"__{op}__": (op.lstrip("i") if op.startswith("i") else op, False)
       for op in ("add", "iadd", "mul", "imul", "pow", "ipow", "lshift", "ilshift")},
    **{f"__r{op}__": (op, True) for op in ("add", "mul", "pow", "lshift")},
}
"""Python operators that can grow a value, under every name a graph can call them by."""


FORMATTING: dict[str, int] = {"_operator.mod": 0, "_operator.imod": 0, "__mod__": 0, "__rmod__": 1}
"""`%` under every name a graph can call it by → which operand it formats when that one is
a string: printf formatting runs for real, and `"%0400000000d" % n` is 400 MB made from 20
bytes. Dynamo folds the formatting user code does, so no graph of its needs it."""


def python_operator(target: str) -> tuple[str, bool] | None:
    """("add" | "mul" | "pow" | "lshift" | "concat", reflected) for a call_function target
    or call_method name that applies that Python operator; None for anything else."""
    return _OPERATORS.get(target)


# ---------------------------------------------------------------------------
# Size expressions (trees from graphcheck.parse_sym_expr)
# ---------------------------------------------------------------------------


def expr_bounds(tree: tuple[Any, ...]) -> tuple[int, int]:
    """(parse-tree nodes, upper bound on the bits of the value) of a size expression."""
    kind = tree[0]
    if kind == "int":
        return 1, max(1, tree[1].bit_length())
    if kind == "sym":
        return 1, SYMBOL_BITS
    if kind == "neg":
        nodes, bits = expr_bounds(tree[1])
        return nodes + 1, bits
    if kind == "pow":
        nodes, bits = expr_bounds(tree[1])
        return nodes + 1, bits * max(1, tree[2])
    if kind == "call":
        parts = [expr_bounds(t) for t in tree[2]]
        return 1 + sum(n for n, _ in parts), max(b for _, b in parts) + 1
    parts = [expr_bounds(tree[1]), *(expr_bounds(t) for _, t in tree[2])]  # "chain"
    nodes = 1 + sum(n for n, _ in parts)
    bits = parts[0][1]
    for (op, _), (_, b) in zip(tree[2], parts[1:], strict=False):
        bits = bits + b if op == "*" else max(bits, b) + 1 if op in ("+", "-") else bits
    return nodes, bits


def evaluate(tree: tuple[Any, ...], values: Mapping[str, int]) -> int:
    """The value of a bounded size expression with its symbols at `values` (Python ints;
    safe once `expr_bounds` is under MAX_EXPR_BITS). Division by zero gives 0."""
    kind = tree[0]
    if kind == "int":
        return cast(int, tree[1])  # an "int" leaf holds a Python int
    if kind == "sym":
        return values[tree[1]]
    if kind == "neg":
        return -evaluate(tree[1], values)
    if kind == "pow":
        return cast(int, evaluate(tree[1], values) ** tree[2])  # typeshed types int ** int as Any
    if kind == "call":
        args = [evaluate(t, values) for t in tree[2]]
        if tree[1] == "Max":
            return max(args)
        if tree[1] == "Min":
            return min(args)
        a, b = args
        if b == 0:
            return 0
        return a // b if tree[1] == "FloorDiv" else a % b
    acc = evaluate(tree[1], values)
    for op, operand in tree[2]:
        v = evaluate(operand, values)
        if op == "+":
            acc += v
        elif op == "-":
            acc -= v
        elif op == "*":
            acc *= v
        else:
            acc = acc // v if v else 0
    return acc


# ---------------------------------------------------------------------------
# Sequence lengths through the graph
# ---------------------------------------------------------------------------

TENSOR, SCALAR, OTHER = "tensor", "scalar", "other"
"""Kinds of node values, besides a sequence (an int: the bound on its length)."""


class SequenceBounds:
    """Static upper bounds on the length of every tuple or list a node produces.

    Only Python's own sequence operators grow a sequence from nothing: `a + b` (and
    `concat`, `__add__`, `__radd__`, `__iadd__`) sums the bounds, `a * n` multiplies them
    by a literal n. A torch function's result is a tensor (or torch's own tuple, which
    torch bounds by tensor sizes); `x.size()` is a sequence of at most `rank` items.
    """

    def __init__(self, max_length: int, rank: int):
        self.max_length = max_length
        self.rank = rank
        self.kinds: dict[str, str | int] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        """Placeholders' shapes at their hints: what `output_count` reads."""

    def placeholder(self, name: str, is_tensor: bool) -> None:
        self.kinds[name] = TENSOR if is_tensor else SCALAR

    def tensor(self, name: str) -> None:
        self.kinds[name] = TENSOR

    def node(
        self, name: str, op: str, target: str, args: list[tuple[str, Any]],
        kwargs: Mapping[str, tuple[str, Any]] | None = None,
    ) -> int | None:
        """Records the node's kind; returns its sequence bound, or None if it is no sequence.
        An op whose outputs an argument counts (`many_outputs`) returns that count, where
        it is known here, though its kind stays a tensor's (torch's own tuple).

        `args` and `kwargs` hold, per argument: ("node", name), ("seq", length),
        ("int", value) or ("other", None)."""
        kind = self._kind(op, target, args)
        self.kinds[name] = kind
        if isinstance(kind, int):
            return kind
        many = many_outputs(target) if op == "call_method" or target.startswith("torch.") else None
        if many is None or not args:
            return None
        tag, receiver = args[0]
        shape = self.shapes.get(receiver) if tag == "node" else None
        plain = {k: _plain(v) for k, v in (kwargs or {}).items()}
        return output_count(many, shape, [_plain(a) for a in args[1:]], plain)

    def _operand(self, arg: tuple[str, Any]) -> str | int:
        tag, value = arg
        if tag == "node":
            return self.kinds.get(value, OTHER)
        if tag == "seq":
            return cast(int, value)  # a "seq" argument holds its length
        if tag == "int":
            return SCALAR
        return OTHER

    def _kind(self, op: str, target: str, args: list[tuple[str, Any]]) -> str | int:
        if op == "call_function" and target.startswith("torch."):
            return TENSOR
        operands = [self._operand(a) for a in args]
        if op == "call_method":
            receiver = operands[0] if operands else OTHER
            if target in ("size", "stride") and len(args) == 1:
                return self.rank
            if receiver == TENSOR and python_operator(target) is None:
                return TENSOR
        if target in ("_operator.getitem", "__getitem__") and len(args) == 2:
            base = operands[0]
            if isinstance(base, int) and args[1][0] == "other":  # a slice: no longer than the base
                return base
            return TENSOR if base == TENSOR else OTHER
        applied = python_operator(target)
        if applied is None or len(operands) != 2:
            return OTHER
        if TENSOR in operands:
            return TENSOR
        name = applied[0]
        if name in ("add", "concat"):
            seqs = [o for o in operands if isinstance(o, int)]
            if not seqs:
                return SCALAR if operands == [SCALAR, SCALAR] else OTHER
            # A non-sequence operand of `+` with a sequence is one of unknown length.
            return sum(o if isinstance(o, int) else self.rank for o in operands)
        if name == "mul":
            pairs = [(args[0], args[1]), (args[1], args[0])]
            repeated = [(o, other) for o, other in pairs if isinstance(self._operand(o), int)]
            if not repeated:
                return SCALAR if operands == [SCALAR, SCALAR] else OTHER
            seq, count = repeated[0]
            length = self._operand(seq)
            assert isinstance(length, int)
            if count[0] == "int":
                return length * max(0, cast(int, count[1]))  # an "int" argument holds an int
            return length  # a count only the worker knows: it checks the actual length
        return SCALAR if SCALAR in operands else OTHER


def _plain(arg: tuple[str, Any]) -> Any:
    """An operand as `output_count` reads it: an int, a sequence of its length, or None."""
    tag, value = arg
    if tag == "int":
        return value
    return range(value) if tag == "seq" else None


# ---------------------------------------------------------------------------
# Ops whose number of outputs an argument sets
# ---------------------------------------------------------------------------

_MANY_OUTPUTS: dict[str, str] = {
    "unbind": "dim", "split": "size", "unsafe_split": "size", "split_with_sizes": "size",
    "unsafe_split_with_sizes": "size", "chunk": "count", "unsafe_chunk": "count",
    "tensor_split": "sections", "hsplit": "sections", "vsplit": "sections", "dsplit": "sections",
}
"""Op base name → how its argument after the tensor sets its outputs: "dim" (one per
index of `dim`), "size" (an int: pieces of that size along `dim`; a list: one per
item), "count" (at most that many), "sections" (an int: that many; a list: one more)."""

_DIM_DEFAULT = {"hsplit": 1, "vsplit": 0, "dsplit": 2}
"""hsplit, vsplit and dsplit take no `dim`; tensor_split's and the others' defaults to 0."""


def many_outputs(target: str) -> str | None:
    """The base name of an op whose output count an argument sets, for a call_function
    target (`torch.unbind`, `torch.functional.split`, `torch.ops.aten.unbind.int`) or a
    method name (`unbind`); None for anything else. `_copy` variants count as theirs."""
    parts = target.split(".")
    if target.startswith("torch.ops.") and len(parts) >= 4:
        name = parts[3]
    elif "." in target and not target.startswith("torch."):
        return None
    else:
        name = parts[-1]
    name = name.removesuffix("_copy")
    return name if name in _MANY_OUTPUTS else None


def output_count(name: str, shape: Sequence[int] | None, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    """An upper bound on the outputs of `many_outputs` op `name` on a tensor of `shape`
    (None: unknown), given the arguments after the tensor: ints, sequences (their length
    counts) or anything else (unknown). None where it cannot be bounded without more;
    the worker bounds it then, on the values (torchfarm/fx/decode.py)."""
    how = _MANY_OUTPUTS[name]
    if how == "dim":
        return _extent(shape, args[0] if args else kwargs.get("dim", 0))
    count = args[0] if args else next((kwargs[k] for k in _COUNT_KWARGS if k in kwargs), None)
    extent = _extent(shape, args[1] if len(args) > 1 else kwargs.get("dim", _DIM_DEFAULT.get(name, 0)))
    if isinstance(count, Sequence) and not isinstance(count, str):
        return len(count) + (1 if how == "sections" else 0)
    n = count if isinstance(count, int) and not isinstance(count, bool) else None
    if how == "size":
        if extent is None:
            return None
        # Pieces of `n` indices; of at least one where the size is not known here.
        return -(-extent // n) if n is not None and n > 0 else max(extent, 1)
    if n is None:
        return None
    count = n
    if how == "count":
        return count if extent is None else max(1, min(count, extent))
    return count  # "sections": exactly that many, empty ones included


_COUNT_KWARGS = (
    "split_size_or_sections", "split_size", "split_sizes", "chunks", "sections", "indices",
    "tensor_indices_or_sections",
)
"""The keywords torch's Python and its schemas give the count argument."""


def _extent(shape: Sequence[int] | None, dim: object) -> int | None:
    """`shape[dim]`, or None where either is unknown or out of range."""
    if not shape or not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < len(shape):
        return None
    return shape[dim]
