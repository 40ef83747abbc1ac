"""Custom ops in a graph (`torch.library`, `torch.ops.<ns>.<name>`): their schemas, checked.

A graph that calls an op some library or the user registered declares it in
`Graph.custom_ops` by its schema string, and each call carries the tensor metadata the
client recorded (`Node.custom`). The worker registers a stand-in of that schema whose
fake implementation answers from that metadata (torchfarm/fx/torch_library.py), so Inductor
compiles around the op as an opaque call; the artifact calls the client's real op.

This module is what the coordinator (and the worker, again) checks, without torch:

- a schema is at most `MAX_SCHEMA_CHARS` long and follows the grammar torch prints
  (`ns::name[.overload](Type arg[=default], ...) -> Ret`), parsed here by a small
  recursive-descent parser, never evaluated;
- its namespace is an identifier not on `DENIED_NAMESPACES` and not `_`-prefixed: a
  graph may not redefine or shadow torch's own operators;
- argument and return types are from a fixed set; the stand-in builds only tensors,
  so an op returns tensors (one, a tuple, or a list);
- an op that mutates (`Tensor(a!)`) or aliases (`Tensor(a)`) an argument is refused by
  name: a stand-in cannot say which outputs share storage, and Inductor's functionalized
  graph would be wrong;
- each CALL_FUNCTION target is either on the allow-list or a declared op's target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchfarm.graph.graph_errors import DisallowedOp, GraphError, GraphTooLarge, MalformedGraph
from torchfarm.v1 import graph_pb2

MAX_SCHEMA_CHARS = 2048
MAX_CUSTOM_OPS = 64
MAX_ARGS = 64
MAX_RETURNS = 16
MAX_NAME_CHARS = 128

DENIED_NAMESPACES = frozenset(
    {
        "aten", "prims", "prim", "quantized", "profiler", "inductor", "higher_order",
        "c10d", "debugprims", "rngprims", "mkldnn", "mkl", "onednn", "torchfarm",
    }
)
"""Namespaces a graph may not declare: torch's own operators (and this project's)."""

DEFAULT_INSTALLED_OP_MODULES: tuple[str, ...] = ("transformers=transformers.integrations.moe",)
"""`namespace=module` entries a worker loads with no setting, each only where its package
is installed: reviewed code whose import registers ops (transformers' mixture-of-experts
`grouped_mm_fallback`, which Qwen3-MoE, gpt-oss, Jamba and Mixtral call) and does nothing
else. A worker imports them at start, never on a request; TORCHFARM_INSTALLED_OP_MODULES
replaces the list (docs/security.md)."""

INSTALLED_OP_SETTING = "TORCHFARM_INSTALLED_OP_MODULES"
"""The worker setting a refusal names, so the operator knows what to set."""


def reviewed_module(namespace: str) -> str | None:
    """The module of `namespace`'s entry in DEFAULT_INSTALLED_OP_MODULES, if it has one."""
    for entry in DEFAULT_INSTALLED_OP_MODULES:
        ns, _, module = entry.partition("=")
        if ns == namespace:
            return module
    return None


BASE_TYPES = frozenset(
    {
        "Tensor", "int", "float", "bool", "str", "SymInt", "SymFloat", "SymBool", "Scalar",
        "ScalarType", "Device", "Layout", "MemoryFormat",
    }
)
"""Argument types a stand-in can receive. `Generator` and other objects are refused."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT = re.compile(r"-?[0-9][0-9.e+\-]*|True|False|None|'[^'\\]{0,64}'|\"[^\"\\]{0,64}\"|[A-Za-z_][A-Za-z0-9_.]*")


class RefusedCustomOp(DisallowedOp):
    """A custom op the farm will not compile around, with why (`.target` names it)."""

    def __init__(self, op: str, why: str) -> None:
        self.target = op
        GraphError.__init__(self, f"custom op {op} {why}")


_REFUSED_OP = re.compile(r"custom op (torch\.ops\.[A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_]) [^\n]*")


def refused_op(message: str) -> tuple[str, str] | None:
    """The op a `RefusedCustomOp` named and its refusal, found in a job error's message
    that carries it (the SDK splits the graph at that op's calls: sdk/split.py); None if
    it names none."""
    found = _REFUSED_OP.search(message)
    return (found.group(1), found.group(0)) if found else None


@dataclass(frozen=True)
class Schema:
    namespace: str
    name: str
    overload: str
    args: tuple[tuple[str, str], ...]
    """(type, name), in order; a `*` marker is left out."""
    returns: tuple[str, ...]

    @property
    def target(self) -> str:
        """The CALL_FUNCTION target that names this op's overload."""
        return f"torch.ops.{self.namespace}.{self.name}.{self.overload or 'default'}"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, why: str) -> MalformedGraph:
        return MalformedGraph(f"custom op schema {self.text[:80]!r}: {why} at character {self.pos}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def eat(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.eat(token):
            raise self.fail(f"expected {token!r}")

    def ident(self) -> str:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        if m is None or len(m.group()) > MAX_NAME_CHARS:
            raise self.fail("expected a name")
        self.pos = m.end()
        return m.group()

    def type_(self, qualified: str) -> str:
        base = self.ident()
        if base not in BASE_TYPES:
            raise RefusedCustomOp(qualified, f"takes or returns a {base!r}, which the farm does not support")
        if self.eat("("):
            # An alias annotation: Tensor(a) aliases, Tensor(a!) mutates.
            self.ident()
            what = "mutates an argument (Tensor(a!))" if self.eat("!") else "aliases an argument (Tensor(a))"
            raise RefusedCustomOp(qualified, f"{what}: mutating and aliasing custom ops are not supported")
        text = base
        if self.eat("["):
            size = self.text[self.pos:self.text.find("]", self.pos)] if "]" in self.text[self.pos:] else ""
            if size and (not size.isdigit() or len(size) > 3):
                raise self.fail("bad list size")
            self.pos += len(size)
            self.expect("]")
            text += "[]"
        if self.eat("?"):
            text += "?"
        return text

    def default(self) -> None:
        self.skip()
        if self.eat("["):
            if not self.eat("]"):
                self.default()
                while self.eat(","):
                    self.default()
                self.expect("]")
            return
        m = _DEFAULT.match(self.text, self.pos)
        if m is None:
            raise self.fail("unsupported default value")
        self.pos = m.end()

    def args(self, qualified: str) -> tuple[tuple[str, str], ...]:
        self.expect("(")
        out: list[tuple[str, str]] = []
        if self.eat(")"):
            return ()
        while True:
            if self.eat("*"):
                pass
            else:
                t = self.type_(qualified)
                name = self.ident()
                if self.eat("="):
                    self.default()
                out.append((t, name))
                if len(out) > MAX_ARGS:
                    raise GraphTooLarge(f"custom op {qualified} has more than {MAX_ARGS} arguments")
            if self.eat(")"):
                return tuple(out)
            self.expect(",")

    def returns(self, qualified: str) -> tuple[str, ...]:
        self.expect("->")
        if not self.eat("("):
            return (self.ret(qualified),)
        out = [self.ret(qualified)]
        while self.eat(","):
            out.append(self.ret(qualified))
            if len(out) > MAX_RETURNS:
                raise GraphTooLarge(f"custom op {qualified} has more than {MAX_RETURNS} returns")
        self.expect(")")
        return tuple(out)

    def ret(self, qualified: str) -> str:
        t = self.type_(qualified)
        if t not in ("Tensor", "Tensor[]"):
            raise RefusedCustomOp(qualified, f"returns {t!r}: only ops returning tensors are supported")
        self.skip()
        m = _IDENT.match(self.text, self.pos)  # an optional return name
        if m is not None:
            self.pos = m.end()
        return t


def parse_schema(text: str) -> Schema:
    """The schema `text` names, checked; raises a `GraphError` subclass otherwise."""
    if len(text) > MAX_SCHEMA_CHARS:
        raise GraphTooLarge(f"custom op schema longer than {MAX_SCHEMA_CHARS} characters")
    if not text.isascii() or not text.isprintable():
        raise MalformedGraph("custom op schema has non-printable or non-ASCII characters")
    p = _Parser(text)
    namespace = p.ident()
    p.expect("::")
    name = p.ident()
    overload = p.ident() if p.eat(".") else ""
    qualified = f"{namespace}::{name}" + (f".{overload}" if overload else "")
    if namespace in DENIED_NAMESPACES or namespace.startswith("_"):
        raise RefusedCustomOp(qualified, f"is in the reserved namespace {namespace!r}")
    args = p.args(qualified)
    returns = p.returns(qualified)
    p.skip()
    if p.pos != len(text):
        raise p.fail("trailing text")
    return Schema(namespace, name, overload, args, returns)


def declared_ops(graph: graph_pb2.Graph) -> dict[str, Schema]:
    """The graph's custom ops by CALL_FUNCTION target, each schema checked."""
    if len(graph.custom_ops) > MAX_CUSTOM_OPS:
        raise GraphTooLarge(f"{len(graph.custom_ops)} custom ops, more than {MAX_CUSTOM_OPS}")
    ops: dict[str, Schema] = {}
    for op in graph.custom_ops:
        schema = parse_schema(op.schema)
        if op.target != schema.target:
            raise MalformedGraph(f"custom op target {op.target!r} does not match its schema {schema.target!r}")
        if op.target in ops:
            raise MalformedGraph(f"custom op {op.target!r} declared twice")
        ops[op.target] = schema
    return ops
