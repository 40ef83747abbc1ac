"""Bounds the Python numbers Triton's frontend folds while it compiles a kernel. Free of torch and Triton.

Triton evaluates every expression of compile-time values (`tl.constexpr` parameters and
locals, literals, `tl.static_range` indices) in Python, as Python ints: `x ** 64` of a
constexpr, `1 << n` or a square repeated in a static loop ask a worker for gigabytes
and hours before any device code exists. This module evaluates the kernel abstractly,
giving each compile-time number an upper bound on its bit length (and its value where
it is known and small), and refuses a kernel any of whose numbers could pass
`MAX_CONSTANT_BITS`, or whose static loops could unroll past `MAX_STATIC_ITERATIONS`.

What Triton turns into device values needs no bound here: a plain assignment makes a
tensor of any number (`_sanitize_value` in Triton's code generator), so only
`tl.constexpr` locals and static-loop indices carry numbers from one statement to the
next; a local assigned under several names is bounded by the largest of them.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

MAX_CONSTANT_BITS = 4096
"""Largest bit length a number Triton folds at compile time may reach."""

MAX_STATIC_ITERATIONS = 4096
"""Most iterations `tl.static_range` loops may unroll, nested loops multiplied."""

MAX_SEQUENCE_REPEAT = 64
"""Largest count a tuple of compile-time values may be repeated by (`(x,) * n`)."""

MAX_LOOP_UNROLL = 64
"""Largest `loop_unroll_factor` of a `tl.range` loop: Triton copies its body that many
times, and the copies count against MAX_STATIC_ITERATIONS with the loops around them."""

MAX_NUM_STAGES = 8
"""Largest `num_stages`, of a kernel (its options) or of one `tl.range` loop: the software
pipeliner keeps that many copies of the loop's buffers, and the compile grows with them
(a 512-stage loop compiled for 47 s)."""

_RANGE_OPTIONS = {"num_stages": (3, MAX_NUM_STAGES), "loop_unroll_factor": (4, MAX_LOOP_UNROLL)}
"""tl.range(start, end, step, num_stages, loop_unroll_factor, ...): each bounded option's
position and bound."""

_STATIC_RANGES = frozenset({"triton.language.static_range", "triton.language.core.static_range"})
_RANGES = frozenset({"triton.language.range", "triton.language.core.range"})

_CONSTEXPR_HELPERS = frozenset({
    "triton.cdiv", "triton.next_power_of_2", "triton.language.cdiv",
    "triton.language.constexpr", "triton.language.core.constexpr",
})
"""Triton functions that return a folded Python number from compile-time arguments."""

_UNKNOWN = object()


class Unbounded(ValueError):
    """A compile-time number or loop of the kernel has no bound under the limits."""


@dataclass(frozen=True)
class _Num:
    """A compile-time Python value: at most `bits` bits, and `value` where known."""

    bits: int
    value: object = _UNKNOWN
    seq: bool = False
    """A tuple or list of such values (Triton's `tl.tuple` of constexprs)."""


def check_folding(
    fn: ast.FunctionDef, imports: dict[str, str], constexprs: dict[str, object]
) -> None:
    """Raises Unbounded if a number `fn` folds could pass the limits, given the
    constexpr parameters' values."""
    try:
        _Folder(fn, imports, constexprs).run()
    except RecursionError:
        raise Unbounded("the kernel's expressions are nested too deeply to bound") from None


def _bits_of(value: object) -> int:
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int):
        return max(1, value.bit_length())
    if isinstance(value, float):
        return 1025 if math.isfinite(value) else 1  # int(1e308) has 1024 bits
    return 64


def _join(a: _Num | None, b: _Num | None) -> _Num | None:
    if a is None:
        return b
    if b is None:
        return a
    value = a.value if a.value == b.value and a.value is not _UNKNOWN else _UNKNOWN
    return _Num(max(a.bits, b.bits), value, a.seq or b.seq)


class _Folder:
    def __init__(self, fn: ast.FunctionDef, imports: dict[str, str], constexprs: dict[str, object]):
        self.fn = fn
        self.imports = imports
        self.env: dict[str, _Num | None] = {
            name: _Num(_bits_of(value), value) for name, value in constexprs.items()
        }

    def run(self) -> None:
        bindings = self._bindings()
        # Names defined from one another settle in as many rounds as there are bindings;
        # a name still growing after that is defined in terms of itself (a loop).
        for _ in range(len(bindings) + 2):
            changed = False
            for name, value_of in bindings:
                new = _join(self.env.get(name), value_of())
                if new != self.env.get(name):
                    self.env[name] = new
                    changed = True
            if not changed:
                break
        else:
            raise Unbounded("a tl.constexpr local is defined in terms of itself; its value has no bound")
        self._loops(self.fn.body, 1)
        for stmt in ast.walk(ast.Module(body=self.fn.body, type_ignores=[])):
            if isinstance(stmt, ast.stmt):
                for child in ast.iter_child_nodes(stmt):
                    if isinstance(child, ast.expr):
                        self.eval(child)

    def _bindings(self) -> list[tuple[str, Callable[[], _Num | None]]]:
        """(name, a function giving the value bound to it) for each compile-time binding."""
        out: list[tuple[str, Callable[[], _Num | None]]] = []
        for node in ast.walk(ast.Module(body=self.fn.body, type_ignores=[])):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                out.append((node.target.id, functools.partial(self.eval, node.value)))
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and self._is_static_range(node.iter):
                out.append((node.target.id, functools.partial(self._index, node.iter)))
        return out

    def _is_static_range(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and self._dotted(node.func) in _STATIC_RANGES

    def _dotted(self, node: ast.expr) -> str:
        return dotted(node, self.imports)

    def _range_args(self, call: ast.Call) -> list[_Num | None]:
        return [self.eval(a) for a in [*call.args, *(k.value for k in call.keywords)]]

    def _index(self, call: ast.expr) -> _Num | None:
        assert isinstance(call, ast.Call)
        args = [a for a in self._range_args(call) if a is not None]
        return _Num(max((a.bits for a in args), default=1))

    def _copies(self, call: ast.Call) -> int:
        """How many copies of its body a loop over `call` compiles to; Unbounded where a
        `tl.range` option (`_RANGE_OPTIONS`) passes its bound."""
        if self._is_static_range(call):
            return self._iterations(call)
        if self._dotted(call.func) not in _RANGES:
            return 1
        self._range_option(call, "num_stages")
        return max(self._range_option(call, "loop_unroll_factor"), 1)

    def _range_option(self, call: ast.Call, name: str) -> int:
        """The value of a bounded `tl.range` option (0 where not given); Unbounded past its bound."""
        position, most = _RANGE_OPTIONS[name]
        given = next((k.value for k in call.keywords if k.arg == name), None)
        if given is None and len(call.args) > position:
            given = call.args[position]
        if given is None:
            return 0
        bound = self.eval(given)
        value = bound.value if bound is not None else _UNKNOWN
        if not isinstance(value, int) or value > most:
            raise Unbounded(f"line {call.lineno}: {name} must be a compile-time number of at most {most}")
        return value

    def _iterations(self, call: ast.Call) -> int:
        """An upper bound on a static_range's iteration count."""
        args = self._range_args(call)
        values = [a.value if a is not None else _UNKNOWN for a in args]
        ints = [v for v in values if isinstance(v, int)]
        if len(ints) == len(values) and 1 <= len(ints) <= 3 and ints[-1:] != [0]:
            return len(range(*ints))
        bits = max((a.bits for a in args if a is not None), default=64)
        return 1 << min(bits + 1, 64)

    def _loops(self, body: list[ast.stmt], unrolled: int) -> None:
        for stmt in body:
            inner = unrolled
            if isinstance(stmt, ast.For) and isinstance(stmt.iter, ast.Call):
                inner = unrolled * self._copies(stmt.iter)
                if inner > MAX_STATIC_ITERATIONS:
                    raise Unbounded(
                        f"line {stmt.lineno}: static loops would unroll over {MAX_STATIC_ITERATIONS} iterations"
                    )
            for field in ("body", "orelse"):
                self._loops(getattr(stmt, field, []) or [], inner)

    def _check(self, bits: int, node: ast.AST) -> int:
        if bits > MAX_CONSTANT_BITS:
            raise Unbounded(
                f"line {getattr(node, 'lineno', '?')}: a compile-time number could reach {bits} bits; "
                f"the limit is {MAX_CONSTANT_BITS}"
            )
        return bits

    def eval(self, node: ast.expr) -> _Num | None:
        """The bound of a compile-time value, or None for a device (or Triton) value."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (str, bytes)):
                return None
            return _Num(self._check(_bits_of(node.value), node), node.value)
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if operand is None:
                return None
            if isinstance(node.op, ast.Not):
                return _Num(1)
            return _Num(self._check(operand.bits + 1, node))
        if isinstance(node, (ast.Compare, ast.BoolOp, ast.IfExp)):
            parts = [self.eval(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
            nums = [p for p in parts if p is not None]
            if isinstance(node, ast.Compare) or not nums:
                return _Num(1) if nums else None
            return _Num(max(p.bits for p in nums))
        if isinstance(node, (ast.Tuple, ast.List)):
            nums = [n for n in (self.eval(e) for e in node.elts) if n is not None]
            return _Num(max(n.bits for n in nums), seq=True) if nums else None
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value)
            self.eval(node.slice)
            return None if base is None else _Num(base.bits)
        if isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.eval(part)
            return None
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Attribute):
            # An import chain is a Triton object; an attribute of a value (x.shape,
            # dtype.primitive_bitwidth) is a Triton-sized number, never a folded one.
            if self._dotted(node):
                return None
            self.eval(node.value)
            return _Num(64, seq=True)
        return None

    def _call(self, node: ast.Call) -> _Num | None:
        args = [self.eval(a) for a in [*node.args, *(k.value for k in node.keywords)]]
        self.eval(node.func)
        nums = [a for a in args if a is not None]
        if len(nums) < len(args):
            return None  # of a device value: a device value
        if isinstance(node.func, ast.Name) and node.func.id == "float":
            return _Num(1025)
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max", "int", "len"):
            return _Num(max([64, *(n.bits for n in nums)]))
        if self._dotted(node.func) in _CONSTEXPR_HELPERS:
            # They grow a number by a bit at most.
            return _Num(self._check(max([64, *(n.bits + 1 for n in nums)]), node))
        return None  # Triton's builtins make device values; a value's methods, Triton-sized ones

    def _binop(self, node: ast.BinOp) -> _Num | None:
        a, b = self.eval(node.left), self.eval(node.right)
        if a is None or b is None:
            return None  # a device value: Triton emits IR, Python folds nothing
        op = node.op
        if a.seq or b.seq:
            if isinstance(op, ast.Mult):
                count = b.value if a.seq else a.value
                if not isinstance(count, int) or count > MAX_SEQUENCE_REPEAT:
                    raise Unbounded(
                        f"line {node.lineno}: a tuple may be repeated at most {MAX_SEQUENCE_REPEAT} times"
                    )
            return _Num(max(a.bits, b.bits), seq=True)
        if isinstance(op, (ast.Add, ast.Sub)):
            bits = max(a.bits, b.bits) + 1
        elif isinstance(op, ast.Mult):
            bits = a.bits + b.bits
        elif isinstance(op, ast.Pow):
            if a.value in (0, 1, -1):
                bits = 1
            else:
                bits = a.bits * self._magnitude(b, node)
        elif isinstance(op, ast.LShift):
            bits = a.bits + self._magnitude(b, node)
        elif isinstance(op, ast.Div):
            bits = 1025
        else:  # //, %, >>, &, |, ^, @: no larger than an operand
            bits = max(a.bits, b.bits)
        bits = self._check(max(bits, 1), node)
        return _Num(bits, self._exact(op, a.value, b.value))

    def _magnitude(self, n: _Num, node: ast.AST) -> int:
        """An upper bound on |n| (an exponent or a shift)."""
        if isinstance(n.value, (int, float)):
            return max(1, math.ceil(abs(n.value)))
        if n.bits > 32:
            raise Unbounded(f"line {getattr(node, 'lineno', '?')}: an exponent or shift has no small bound")
        return 1 << n.bits

    @staticmethod
    def _exact(op: ast.operator, a: object, b: object) -> object:
        """The folded value, where both operands are known ints (its size is already bounded)."""
        if not (type(a) is int and type(b) is int):
            return _UNKNOWN
        try:
            if isinstance(op, ast.Add):
                return a + b
            if isinstance(op, ast.Sub):
                return a - b
            if isinstance(op, ast.Mult):
                return a * b
            if isinstance(op, ast.Pow) and b >= 0:
                return a**b
            if isinstance(op, ast.LShift) and b >= 0:
                return a << b
            if isinstance(op, ast.FloorDiv) and b:
                return a // b
        except (OverflowError, ValueError):
            return _UNKNOWN
        return _UNKNOWN


def dotted(node: ast.expr, imports: dict[str, str]) -> str:
    """The import path a Name/Attribute chain names ("tl.constexpr" →
    "triton.language.constexpr"), given the source's import aliases; "" for any other
    expression."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return ""
    return ".".join([imports[node.id], *reversed(parts)])
