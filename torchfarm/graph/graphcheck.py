"""Validates a serialized graph (`graph_pb2.Graph`) from the message alone.

The coordinator runs `validate_graph` on every request before anything else sees it, and
the worker runs it again before decoding. It imports no torch. It checks the format's
rules as written in `proto/torchfarm/v1/graph.proto`:

- a known format version (V2 when the graph has subgraphs);
- subgraphs (a higher-order op's bodies): each checked by the same rules, recursively, up
  to `GraphLimits.max_subgraph_depth`, with nodes, arguments, elements and constant bytes
  counted over all of them together; a subgraph is named only by a GET_ATTR of the graph
  that holds it, and that node only feeds a higher-order op;
- unique node names that are Python identifiers; placeholders first; exactly one OUTPUT
  node, last; arguments only reference earlier nodes;
- every call_function / call_method target on the allow-list, every get_attr naming a
  declared constant; a higher-order op's constants of the kinds their places take, text
  only where it takes text (`torchfarm.graph.hopcheck`); text of a kind no generated
  source can run (`torchfarm.graph.textcheck`);
- placeholder metadata: one of tensor meta, a symint or a device mesh, and DTensor
  metadata only beside tensor meta; known dtype/device, bounded rank, non-negative sizes;
- functional collectives naming declared, well-formed process groups
  (`torchfarm.graph.collectives`); DTensor inputs and placements on declared, well-formed
  device meshes that hold the graph's rank (`torchfarm.graph.dtensor`);
- constants whose data length matches shape and dtype, within a total byte budget;
- symbolic size expressions parsed by a small hand-written parser against the declared
  symbols (never evaluated as code);
- bounded sizes everywhere (`GraphLimits`), and bounded work: size expressions'
  nodes and bits, Python operators under any name (`__pow__` included), the length of
  every sequence a node can produce, and the elements of each placeholder and of the
  whole graph (`torchfarm.graph.graphbounds`).

Errors come from `torchfarm.graph.graph_errors`.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchfarm.graph import allowlist, collectives, customops, dtensor, graphbounds, textcheck
from torchfarm.graph.graph_errors import DisallowedOp, GraphTooLarge, MalformedGraph
from torchfarm.graph.hopcheck import check_hop_constants
from torchfarm.v1 import graph_pb2
from torchfarm.wire import options as farm_options


@dataclass(frozen=True)
class GraphLimits:
    """Bounds on a graph's size. The defaults fit real models with a wide margin."""

    max_nodes: int = 50_000
    """Nodes in the graph and all its subgraphs, placeholders and output included."""
    max_traced_nodes: int = 100_000
    """Nodes the worker's fake propagation runs: each body's counted at every call, and
    once more by itself (`_Totals.traced`); a body buys no budget."""
    max_rank: int = 16
    """Dimensions of any placeholder or constant tensor."""
    max_constant_bytes: int = 1 << 20
    """Bytes of inline constant data, all constants (of every subgraph) together."""
    max_nesting_depth: int = 32
    """Nesting of argument lists/tuples/slices/dicts, and of symbolic expressions."""
    max_arguments: int = 1_000_000
    """Argument values in the whole graph, nested ones included."""
    max_symbols: int = 1_024
    """Declared symbols (dynamic sizes)."""
    max_expr_chars: int = 4_096
    """Characters in one symbolic size expression."""
    max_expr_text: int = 1 << 18
    """Characters of all the distinct size expressions of the graph and its subgraphs: the
    parsing it costs (a repeated expression is parsed once)."""
    max_name_chars: int = 1_024
    """Characters in a node, placeholder, constant, symbol or keyword name."""
    max_placeholder_elements: int = 1 << 32
    """Elements of one placeholder tensor, its symbols at their hints (autotuning allocates it)."""
    max_graph_elements: int = 1 << 38
    """Elements of all placeholders and constants together, symbols at their hints."""
    max_sequence_length: int = 1 << 16
    """Items in any tuple or list a node can produce (`t + t` doubles at each node)."""
    max_subgraph_depth: int = 8
    """Nesting of subgraphs: a checkpointed body inside a cond branch is depth 2."""


# The torch.dtype names a graph may use (str(dtype) without "torch."), with their item
# sizes. Quantized, "bits" and sub-byte integer dtypes are left out on purpose.
DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
}
LAYOUTS = frozenset(
    {
        "strided",
        "sparse_coo",
        "sparse_csr",
        "sparse_csc",
        "sparse_bsr",
        "sparse_bsc",
        "_mkldnn",
        "jagged",
    }
)
MEMORY_FORMATS = frozenset(
    {"contiguous_format", "channels_last", "channels_last_3d", "preserve_format"}
)
DEVICE_TYPES = frozenset({"cpu", "cuda", "xpu", "mps", "meta", "hpu", "mtia", "privateuseone"})
MAX_DEVICE_INDEX = 1 << 16
INT64_MAX = (1 << 63) - 1

# Functions that sympy / torch.utils._sympy print in size expressions, with arities
# (None: two or more).
SYM_FUNCTIONS: dict[str, int | None] = {
    "Mod": 2,
    "PythonMod": 2,
    "FloorDiv": 2,
    "Max": None,
    "Min": None,
}
MAX_SYM_EXPONENT = 64

# Pure-Python call_function targets. Dynamo folds them when all operands are constants,
# so a node with no node operand is not from Dynamo; refusing it keeps arbitrary
# Python arithmetic (say 10 ** 10 ** 9) off the worker.
_PURE_PYTHON_PREFIXES = ("_operator.", "math.")

HIGHER_ORDER_PREFIX = "torch.ops.higher_order."
"""Targets that take subgraphs; which of them a graph may call, the allow-list says."""

GETATTR = "builtins.getattr"
"""The one builtin a graph may call: it reads an allow-listed Tensor attribute."""

SDPA_BACKEND = "torch.nn.attention._backend_from_string"
SET_SDPA_KERNEL = "torch.nn.attention._sdpa_kernel"
"""What Dynamo puts in the graph for `sdpa_kernel(...)` inside the compiled code: each
backend by name, then a call that enables those (and, on exit, one that enables the
prior ones). The second changes the process's SDPA state while the worker traces;
`global_state.preserved` puts it back after."""

FUNCTORCH_GRAD = (
    "torch._C._autograd._saved_tensors_hooks_disable",
    "torch._C._autograd._saved_tensors_hooks_enable",
    "torch._C._functorch._grad_increment_nesting",
    "torch._C._functorch._grad_decrement_nesting",
    "torch._C._functorch._wrap_for_grad",
    "torch._C._functorch.set_inplace_requires_grad_allowed",
    "torch._functorch.eager_transforms._set_tensor_requires_grad",
    "torch._functorch.eager_transforms._autograd_grad",
    "torch._functorch.predispatch._unwrap_for_grad",
    "torch._C._functorch._unwrap_for_grad",  # what torch 2.11 and 2.12 record
)
"""What Dynamo records for `torch.func.grad` (grad_and_value, vjp, jacrev) inside the
compiled code: a grad level entered and left, its inputs wrapped and unwrapped, the
gradient taken, and saved-tensor hooks switched off around it (the disabling call takes
the message a hook's use would raise; it registers none). What a graph leaves changed,
`torchfarm/fx/global_state.py` `preserved` undoes."""

FUNCTORCH_JVP = (
    "torch._C._set_fwd_grad_enabled",
    "torch._functorch.predispatch._jvp_increment_nesting",
    "torch._functorch.predispatch._jvp_decrement_nesting",
    "torch._functorch.predispatch._enter_dual_level",
    "torch._functorch.predispatch._exit_dual_level",
    "torch._functorch.predispatch._make_dual",
    "torch._functorch.predispatch._unpack_dual",
    "torch.autograd.forward_ad._maybe_load_decompositions",
    # What torch 2.11 and 2.12 record (their `_make_dual`, `_unpack_dual` are ATen's).
    "torch._C._functorch._jvp_increment_nesting",
    "torch._C._functorch._jvp_decrement_nesting",
    "torch._C._enter_dual_level",
    "torch._C._exit_dual_level",
)
"""What Dynamo records for forward mode inside the compiled code (`torch.func.jvp`,
jacfwd, hessian; `torch.autograd.forward_ad`'s dual tensors): a jvp level entered and
left, forward gradients switched on, a dual level entered and left, dual tensors made
and taken apart, and the import of the decompositions forward mode uses. What a graph
leaves changed, `torchfarm/fx/global_state.py` `preserved` undoes."""

Node = graph_pb2.Node
_PLACEHOLDER_FIELDS = ("tensor", "symint", "dtensor", "mesh")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)

# ---------------------------------------------------------------------------
# Symbolic expressions
# ---------------------------------------------------------------------------

SymAst = tuple[Any, ...]
"""Parse tree of a size expression, read by `torchfarm.fx.decode`:
("int", value), ("sym", name), ("neg", tree), ("pow", tree, exponent),
("call", function, (tree, ...)), and ("chain", tree, ((op, tree), ...)) for a run of
same-precedence operators ("+", "-" or "*", "//") applied left to right. Runs are flat so
that a long sum does not nest deeply."""

# ASCII only: `\d` would otherwise accept other scripts' digits, which int() also reads.
_TOKEN_RE = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|[-+*(),]))", re.ASCII)


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise MalformedGraph(f"bad character in size expression {text!r} at {pos}")
        tokens.append(m.group(m.lastindex or 0))
        pos = m.end()
    return tokens


class _SymParser:
    """Recursive descent over: expr := term (('+'|'-') term)*;
    term := unary (('*'|'//') unary)*; unary := '-' unary | power;
    power := atom ('**' INT)?; atom := INT | NAME | FUNC '(' expr, ... ')' | '(' expr ')'."""

    def __init__(self, text: str, symbols: Container[str], max_depth: int) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0
        self.symbols = symbols
        self.max_depth = max_depth
        self.depth = 0

    def fail(self, why: str) -> MalformedGraph:
        return MalformedGraph(f"bad size expression {self.text!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise self.fail(f"expected {expected or 'a token'}, got {tok!r}")
        self.pos += 1
        return tok

    def parse(self) -> SymAst:
        if not self.tokens:
            raise self.fail("empty")
        tree = self.expr()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return tree

    def expr(self) -> SymAst:
        self.depth += 1
        if self.depth > self.max_depth:
            raise self.fail("nested too deeply")
        tree = self.chain(("+", "-"), self.term)
        self.depth -= 1
        return tree

    def term(self) -> SymAst:
        return self.chain(("*", "//"), self.unary)

    def chain(self, ops: tuple[str, str], operand: Callable[[], SymAst]) -> SymAst:
        first = operand()
        rest: list[tuple[str, SymAst]] = []
        while self.peek() in ops:
            op = self.take()
            rest.append((op, operand()))
        return ("chain", first, tuple(rest)) if rest else first

    def unary(self) -> SymAst:
        if self.peek() == "-":
            self.take()
            self.depth += 1
            if self.depth > self.max_depth:
                raise self.fail("nested too deeply")
            tree = ("neg", self.unary())
            self.depth -= 1
            return tree
        return self.power()

    def power(self) -> SymAst:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            exponent = self.take()
            if not exponent.isdigit() or int(exponent) > MAX_SYM_EXPONENT:
                raise self.fail(f"exponent must be an integer up to {MAX_SYM_EXPONENT}")
            return ("pow", base, int(exponent))
        return base

    def atom(self) -> SymAst:
        tok = self.take()
        if tok.isdigit():
            if len(tok) > 19 or int(tok) > INT64_MAX:
                raise self.fail("integer out of range")
            return ("int", int(tok))
        if tok == "(":
            tree = self.expr()
            self.take(")")
            return tree
        if tok in SYM_FUNCTIONS:
            self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            arity = SYM_FUNCTIONS[tok]
            if (arity is None and len(args) < 2) or (arity is not None and len(args) != arity):
                raise self.fail(f"{tok} takes {arity or 'two or more'} arguments")
            return ("call", tok, tuple(args))
        if _NAME_RE.match(tok) and tok in self.symbols:
            return ("sym", tok)
        raise self.fail(f"unknown name or token {tok!r}")


def _has_symbol(tree: SymAst) -> bool:
    kind = tree[0]
    if kind == "sym":
        return True
    if kind in ("neg", "pow"):
        return _has_symbol(tree[1])
    if kind == "call":
        return any(_has_symbol(t) for t in tree[2])
    if kind == "chain":
        return _has_symbol(tree[1]) or any(_has_symbol(t) for _, t in tree[2])
    return False


def parse_sym_expr(text: str, symbols: Container[str], limits: GraphLimits) -> SymAst:
    """Parses a size expression as sympy prints it ("s0", "2*s1 + 1", "(s0//2)")."""
    if len(text) > limits.max_expr_chars:
        raise GraphTooLarge(f"size expression longer than {limits.max_expr_chars} characters")
    tree = _SymParser(text, symbols, limits.max_nesting_depth).parse()
    nodes, bits = graphbounds.expr_bounds(tree)
    if nodes > graphbounds.MAX_EXPR_NODES:
        raise GraphTooLarge(f"size expression {text[:80]!r} has {nodes} nodes, more than {graphbounds.MAX_EXPR_NODES}")
    if bits > graphbounds.MAX_EXPR_BITS:
        raise GraphTooLarge(
            f"size expression {text[:80]!r} can reach {bits} bits, more than {graphbounds.MAX_EXPR_BITS}"
        )
    return tree


# ---------------------------------------------------------------------------
# The graph
# ---------------------------------------------------------------------------


@dataclass
class _Parsed:
    """A size expression as one validation parsed it, and its value at the symbols' hints
    once asked: symbols are only ever added and never change their hints, so both hold
    wherever the same text recurs."""

    tree: SymAst
    has_symbol: bool
    at_hints: int | None = None


@dataclass
class _Totals:
    """What the outermost graph and all its subgraphs share: symbols, process groups,
    and the counts bounded over the whole tree."""

    format: int
    symbols: set[str] = field(default_factory=set)
    hints: dict[str, int] = field(default_factory=dict)
    groups: dict[str, graph_pb2.ProcessGroup] = field(default_factory=dict)
    """The outermost graph's groups, by name: collectives in any subgraph name them."""
    used_groups: set[str] = field(default_factory=set)
    meshes: list[graph_pb2.DeviceMesh] = field(default_factory=list)
    """The outermost graph's device meshes: DTensor placeholders name them by index."""
    used_meshes: set[int] = field(default_factory=set)
    nodes: int = 0
    arguments: int = 0
    elements: int = 0
    constant_bytes: int = 0
    traced: int = 0
    """Nodes the worker's fake propagation runs: each graph's own, and a body's again
    at every higher-order call of it, recursively."""
    parsed: dict[str, _Parsed] = field(default_factory=dict)
    """Each distinct size expression, by its text: real graphs repeat a few of them
    thousands of times, and the parser is pure Python."""
    expr_text: int = 0
    """Characters of the distinct size expressions parsed (`GraphLimits.max_expr_text`)."""


class _Checker:
    def __init__(
        self, graph: graph_pb2.Graph, limits: GraphLimits,
        totals: _Totals | None = None, path: str = "", depth: int = 0,
    ) -> None:
        self.graph = graph
        self.limits = limits
        self.totals = totals or _Totals(format=graph.format)
        self.symbols = self.totals.symbols
        self.hints = self.totals.hints
        self.path = path
        """"subgraph 'a': subgraph 'b': " for a nested graph, in every error message."""
        self.depth = depth
        self.constants: set[str] = set()
        self.subgraphs: set[str] = set()
        self.referenced: set[str] = set()
        self.subgraph_nodes: set[str] = set()
        """GET_ATTR nodes that name a subgraph: only a higher-order op may take them."""
        self.body_of: dict[str, str] = {}
        """GET_ATTR node → the subgraph it names."""
        self.body_cost: dict[str, int] = {}
        """Subgraph → the nodes one call of it runs (`traced`)."""
        self.traced = len(graph.nodes)
        """The nodes one run of this graph runs, bodies at each of their calls included."""
        self.takes_subgraphs = False
        self.defined: set[str] = set()
        self.sequences = graphbounds.SequenceBounds(limits.max_sequence_length, limits.max_rank)
        self.custom_ops = customops.declared_ops(graph)
        self.sdpa_backends: set[str] = set()
        """Nodes that name an SDPA backend (`SDPA_BACKEND` calls)."""

    def name(self, what: str, name: str) -> None:
        if len(name) > self.limits.max_name_chars:
            raise GraphTooLarge(f"{what} name longer than {self.limits.max_name_chars} characters")
        if not _NAME_RE.match(name) or keyword.iskeyword(name):
            raise MalformedGraph(f"{what} name {name!r} is not a Python identifier")

    def run(self) -> None:
        g, lim = self.graph, self.limits
        self.header()
        self.totals.nodes += len(g.nodes)
        if self.totals.nodes > lim.max_nodes:
            raise GraphTooLarge(f"{self.totals.nodes} nodes, more than {lim.max_nodes} (subgraphs included)")
        if len(g.symbols) > lim.max_symbols:
            raise GraphTooLarge(f"{len(g.symbols)} symbols, more than {lim.max_symbols}")
        if len(g.constants) > lim.max_nodes:
            raise GraphTooLarge(f"{len(g.constants)} constants, more than {lim.max_nodes}")
        for sym in g.symbols:
            self.symbol(sym)
        if self.depth == 0:
            self.totals.groups = collectives.check_groups(g)
            self.totals.meshes = dtensor.check_meshes(g, DEVICE_TYPES)
        for const in g.constants:
            self.totals.constant_bytes += self.constant(const)
            if self.totals.constant_bytes > lim.max_constant_bytes:
                raise GraphTooLarge(f"inline constants exceed {lim.max_constant_bytes} bytes")
        self.declare_subgraphs()
        if not g.nodes or g.nodes[-1].op != Node.OUTPUT:
            raise MalformedGraph(f"{self.path}the last node must be the OUTPUT node")
        seen_compute = False
        placeholder_targets: set[str] = set()
        for index, node in enumerate(g.nodes):
            self.name("node", node.name)
            if node.name in self.defined:
                raise MalformedGraph(f"duplicate node name {node.name!r}")
            if node.op == Node.PLACEHOLDER:
                if seen_compute:
                    raise MalformedGraph(f"placeholder {node.name!r} after a computation")
                if node.target in placeholder_targets:
                    raise MalformedGraph(f"duplicate placeholder target {node.target!r}")
                placeholder_targets.add(node.target)
            else:
                seen_compute = True
            if node.op == Node.OUTPUT and index != len(g.nodes) - 1:
                raise MalformedGraph(f"OUTPUT node {node.name!r} is not last")
            self.node(node)
            self.defined.add(node.name)
        if self.depth == 0 and (unused := sorted(set(self.totals.groups) - self.totals.used_groups)):
            raise MalformedGraph(f"process groups {unused} are declared but no collective uses them")
        if self.depth == 0 and len(self.totals.used_meshes) != len(self.totals.meshes):
            raise MalformedGraph("a device mesh is declared but no placeholder names it")
        unused = sorted(self.subgraphs - self.referenced)
        if unused:
            raise MalformedGraph(f"{self.path}subgraph {unused[0]!r} is named by no get_attr node")
        self.totals.traced += self.traced  # each body also runs once by itself (its own propagation)
        self.check_traced(self.totals.traced)

    def check_traced(self, traced: int) -> None:
        """Bodies buy no budget: the worker's fake propagation runs a body at each call
        (torchfarm/fx/decode.py), so `n` nodes called `k` times cost `n * k`."""
        if traced > self.limits.max_traced_nodes:
            raise GraphTooLarge(
                f"{self.path or 'the graph '}runs {traced} nodes with each body counted at every call, "
                f"more than {self.limits.max_traced_nodes}"
            )

    def header(self) -> None:
        """The format version, and what a subgraph may not declare."""
        g = self.graph
        if self.depth == 0:
            if g.format not in (graph_pb2.GRAPH_FORMAT_V1, graph_pb2.GRAPH_FORMAT_V2):
                raise MalformedGraph(f"unknown graph format {g.format}")
            if g.subgraphs and g.format == graph_pb2.GRAPH_FORMAT_V1:
                raise MalformedGraph("a GRAPH_FORMAT_V1 graph has no subgraphs (V2 has)")
            return
        if g.format != self.totals.format:
            raise MalformedGraph(f"{self.path}format {g.format}, not its outer graph's {self.totals.format}")
        if g.symbols:
            raise MalformedGraph(f"{self.path}declares symbols; a subgraph uses its outermost graph's")
        if g.groups:
            raise MalformedGraph(f"{self.path}declares process groups; a subgraph uses its outermost graph's")
        if g.meshes or g.rank:
            raise MalformedGraph(f"{self.path}declares device meshes or a rank; a subgraph uses its outermost graph's")

    def declare_subgraphs(self) -> None:
        """Checks each subgraph, depth first, before the nodes that name them."""
        previous = None
        for sub in self.graph.subgraphs:
            where = f"{self.path}subgraph {sub.name!r}"
            self.name("subgraph", sub.name)
            if previous is not None and sub.name <= previous:
                raise MalformedGraph(f"{where}: subgraphs must be unique and sorted by name")
            previous = sub.name
            if sub.name in self.constants:
                raise MalformedGraph(f"{where}: a constant has the same name")
            if self.depth + 1 > self.limits.max_subgraph_depth:
                raise GraphTooLarge(f"{where}: subgraphs nested deeper than {self.limits.max_subgraph_depth}")
            if not sub.HasField("graph"):
                raise MalformedGraph(f"{where}: no graph")
            self.subgraphs.add(sub.name)
            body = _Checker(sub.graph, self.limits, self.totals, f"{where}: ", self.depth + 1)
            body.run()
            self.body_cost[sub.name] = body.traced

    def symbol(self, sym: graph_pb2.Symbol) -> None:
        self.name("symbol", sym.name)
        if sym.name in SYM_FUNCTIONS:
            raise MalformedGraph(f"symbol name {sym.name!r} is reserved")
        if sym.name in self.symbols:
            raise MalformedGraph(f"duplicate symbol {sym.name!r}")
        if (
            sym.min < 0
            or sym.hint < sym.min
            or (sym.max != 0 and not sym.min <= sym.hint <= sym.max)
        ):
            raise MalformedGraph(
                f"symbol {sym.name!r}: hint {sym.hint} outside [{sym.min}, {sym.max or 'inf'}]"
            )
        self.symbols.add(sym.name)
        self.hints[sym.name] = sym.hint

    def count_elements(self, numel: int, where: str) -> None:
        """Adds a placeholder's or constant's elements to the graph's total."""
        self.totals.elements += numel
        if self.totals.elements > self.limits.max_graph_elements:
            raise GraphTooLarge(
                f"{where}: placeholders and constants hold over {self.limits.max_graph_elements} elements"
            )

    def constant(self, const: graph_pb2.Constant) -> int:
        self.name(f"{self.path}constant", const.name)
        if const.name in self.constants:
            raise MalformedGraph(f"duplicate constant {const.name!r}")
        self.constants.add(const.name)
        itemsize = self.dtype(const.dtype, f"constant {const.name!r}")
        numel = self.dims(const.shape, f"constant {const.name!r}")
        self.count_elements(numel, f"constant {const.name!r}")
        if numel * itemsize != len(const.data):
            raise MalformedGraph(
                f"constant {const.name!r} has {len(const.data)} bytes, "
                f"shape and dtype say {numel * itemsize}"
            )
        return len(const.data)

    def dims(self, shape: Iterable[int], where: str) -> int:
        dims = list(shape)
        if len(dims) > self.limits.max_rank:
            raise GraphTooLarge(f"{where} has rank {len(dims)}, more than {self.limits.max_rank}")
        numel = 1
        extent = 1  # torch computes it in int64, empty or not
        for d in dims:
            if d < 0:
                raise MalformedGraph(f"{where} has negative size {d}")
            numel *= d
            extent *= max(d, 1)
        if extent > INT64_MAX:
            raise MalformedGraph(f"{where}: the product of its sizes is over int64")
        return numel

    def dtype(self, name: str, where: str) -> int:
        if name not in DTYPE_ITEMSIZE:
            raise MalformedGraph(f"{where}: unknown dtype {name!r}")
        return DTYPE_ITEMSIZE[name]

    def device(self, dev: graph_pb2.Device, where: str) -> None:
        if dev.type not in DEVICE_TYPES:
            raise MalformedGraph(f"{where}: unknown device type {dev.type!r}")
        if not -1 <= dev.index < MAX_DEVICE_INDEX:
            raise MalformedGraph(f"{where}: bad device index {dev.index}")

    def parsed(self, text: str) -> _Parsed:
        """`text` parsed once per validation; the distinct texts' total is bounded, so a
        graph cannot buy seconds of parsing with expressions each within its own bounds."""
        found = self.totals.parsed.get(text)
        if found is None:
            self.totals.expr_text += len(text)
            if self.totals.expr_text > self.limits.max_expr_text:
                raise GraphTooLarge(
                    f"distinct size expressions exceed {self.limits.max_expr_text} characters "
                    "together (max_expr_text)"
                )
            tree = parse_sym_expr(text, self.symbols, self.limits)
            found = self.totals.parsed[text] = _Parsed(tree, _has_symbol(tree))
        return found

    def at_hints(self, text: str) -> int:
        """The value of an expression `sym_expr` checked, its symbols at their hints."""
        found = self.totals.parsed[text]
        if found.at_hints is None:
            found.at_hints = graphbounds.evaluate(found.tree, self.hints)
        return found.at_hints

    def sym_expr(self, expr: graph_pb2.SymExpr, where: str, size: bool) -> SymAst:
        parsed = self.parsed(expr.expr)
        tree = parsed.tree
        if not parsed.has_symbol and tree[0] != "int":
            # sympy folds constants, so "3 - 5" or "-2" never come from a real graph.
            raise MalformedGraph(f"{where}: constant size {expr.expr!r} is not a plain integer")
        if size and (expr.hint < 0 or (tree[0] == "int" and tree[1] != expr.hint)):
            raise MalformedGraph(f"{where}: size {expr.expr!r} with hint {expr.hint}")
        return tree

    def node(self, node: graph_pb2.Node) -> None:
        where = f"{self.path}node {node.name!r}"
        self.takes_subgraphs = node.op == Node.CALL_FUNCTION and node.target.startswith(HIGHER_ORDER_PREFIX)
        is_placeholder = node.op == Node.PLACEHOLDER
        if not is_placeholder and any(node.HasField(f) for f in _PLACEHOLDER_FIELDS):
            raise MalformedGraph(f"{where}: only placeholders carry tensor, symint or mesh metadata")
        if node.HasField("custom") and node.target not in self.custom_ops:
            raise MalformedGraph(f"{where}: only calls of declared custom ops carry custom metadata")
        if node.op == Node.PLACEHOLDER:
            self.placeholder(node, where)
        elif node.op == Node.CALL_FUNCTION:
            self.call_function(node, where)
        elif node.op == Node.CALL_METHOD:
            if not allowlist.is_allowed_method(node.target):
                raise DisallowedOp(node.target, kind="method")
            if not node.args or node.args[0].WhichOneof("kind") != "node":
                raise MalformedGraph(f"{where}: a method call needs a node as its first argument")
        elif node.op == Node.GET_ATTR:
            if node.target in self.subgraphs:
                self.referenced.add(node.target)
                self.subgraph_nodes.add(node.name)
                self.body_of[node.name] = node.target
            elif node.target not in self.constants:
                raise MalformedGraph(f"{where}: get_attr of undeclared constant or subgraph {node.target!r}")
            if node.args or node.kwargs:
                raise MalformedGraph(f"{where}: get_attr takes no arguments")
        elif node.op == Node.OUTPUT:
            if node.target != "output" or len(node.args) != 1 or node.kwargs:
                raise MalformedGraph(f"{where}: OUTPUT must have target 'output' and one argument")
        else:
            raise MalformedGraph(f"{where}: unknown op {node.op}")
        for arg in node.args:
            self.argument(arg, where, 1)
        if self.takes_subgraphs:
            self.count_calls(node)
        self.bound_work(node, where)
        previous = None
        for kw in node.kwargs:
            self.name("keyword", kw.name)
            if previous is not None and kw.name <= previous:
                raise MalformedGraph(f"{where}: kwargs must be unique and sorted by name")
            previous = kw.name
            self.argument(kw.value, where, 1)
        textcheck.check_node_texts(
            node, where, message=node.target in self.custom_ops or textcheck.is_message(node.target)
        )

    def count_calls(self, node: graph_pb2.Node) -> None:
        """Adds what a higher-order op's bodies run at this call to `traced`."""
        for name in _references([*node.args, *(kw.value for kw in node.kwargs)]):
            if name in self.body_of:
                self.traced += self.body_cost[self.body_of[name]]
        self.check_traced(self.totals.traced + self.traced)

    def bound_work(self, node: graph_pb2.Node, where: str) -> None:
        """Python operators under any name, and the sequences nodes can grow."""
        if node.op == Node.PLACEHOLDER:
            self.sequences.placeholder(node.name, node.HasField("tensor"))
            return
        if node.op == Node.GET_ATTR:
            if node.name not in self.subgraph_nodes:
                self.sequences.tensor(node.name)
            return
        if node.op not in (Node.CALL_FUNCTION, Node.CALL_METHOD):
            return
        formatted = graphbounds.FORMATTING.get(node.target)
        if formatted is not None and len(node.args) == 2 and node.args[formatted].WhichOneof("kind") == "str_value":
            raise MalformedGraph(f"{where}: string formatting ({node.target} of a string) is not a graph operation")
        applied = graphbounds.python_operator(node.target)
        if applied is not None and applied[0] in ("pow", "lshift") and len(node.args) == 2:
            _bound_exponent(node, applied, where)
        op = "call_method" if node.op == Node.CALL_METHOD else "call_function"
        kwargs = {kw.name: _operand(kw.value) for kw in node.kwargs}
        length = self.sequences.node(node.name, op, node.target, [_operand(a) for a in node.args], kwargs)
        if length is not None and length > self.limits.max_sequence_length:
            if applied is not None and applied[0] == "mul":
                raise MalformedGraph(
                    f"{where}: sequence repeated to {length} items, more than {self.limits.max_sequence_length}"
                )
            raise GraphTooLarge(
                f"{where}: {node.target} can produce a sequence of up to {length} items, "
                f"more than {self.limits.max_sequence_length}"
            )

    def call_function(self, node: graph_pb2.Node, where: str) -> None:
        if node.target in self.custom_ops:
            self.custom_call(node, where)
        elif not allowlist.is_allowed_function(node.target):
            raise DisallowedOp(node.target, kind="higher-order op" if self.takes_subgraphs else "op")
        if self.takes_subgraphs:
            check_hop_constants(node, where)
        if node.target == GETATTR:
            _check_getattr(node, where)
        elif node.target in (SDPA_BACKEND, SET_SDPA_KERNEL):
            self.sdpa_call(node, where)
        if (group := collectives.check_collective(node, self.totals.groups, where)) is not None:
            self.totals.used_groups.add(group)
        if node.target.startswith(_PURE_PYTHON_PREFIXES) and not any(
            a.WhichOneof("kind") == "node" for a in node.args
        ):
            raise MalformedGraph(f"{where}: {node.target} without a node operand")

    def sdpa_call(self, node: graph_pb2.Node, where: str) -> None:
        """`SDPA_BACKEND` of a backend torch has, by name, or `SET_SDPA_KERNEL` of
        such nodes, each once, and a constant priority flag."""
        args = node.args
        if node.target == SDPA_BACKEND:
            if len(args) != 1 or node.kwargs or args[0].WhichOneof("kind") != "str_value":
                raise MalformedGraph(f"{where}: {SDPA_BACKEND} takes one constant backend name")
            if args[0].str_value not in farm_options.SDPA_BACKENDS:
                raise MalformedGraph(f"{where}: SDPA backend {args[0].str_value[:40]!r} is not one torch has")
            self.sdpa_backends.add(node.name)
            return
        if (len(args) != 2 or node.kwargs or args[0].WhichOneof("kind") != "list"
                or args[1].WhichOneof("kind") != "bool_value"):
            raise MalformedGraph(f"{where}: {SET_SDPA_KERNEL} takes a list of backends and a constant flag")
        names = [a.node if a.WhichOneof("kind") == "node" else "" for a in args[0].list.items]
        if not all(name in self.sdpa_backends for name in names) or len(set(names)) != len(names):
            raise MalformedGraph(f"{where}: {SET_SDPA_KERNEL} takes distinct {SDPA_BACKEND} nodes")

    def custom_call(self, node: graph_pb2.Node, where: str) -> None:
        """A custom op's recorded tensors: the same checks as a placeholder's metadata."""
        call = node.custom
        if not call.outputs or len(call.inputs) + len(call.outputs) > customops.MAX_ARGS:
            raise MalformedGraph(f"{where}: a custom op call needs 1 to {customops.MAX_ARGS} recorded tensors")
        for meta in (*call.inputs, *call.outputs):
            if len(meta.shape) != len(meta.stride) or len(meta.shape) > self.limits.max_rank:
                raise MalformedGraph(f"{where}: bad recorded tensor rank")
            for size in (*meta.shape, *meta.stride):
                self.sym_expr(size, where, size=True)
            self.dtype(meta.dtype, where)
            self.device(meta.device, where)

    def placeholder(self, node: graph_pb2.Node, where: str) -> None:
        self.name("placeholder target", node.target)
        if node.args or node.kwargs:
            raise MalformedGraph(f"{where}: placeholders take no arguments")
        if sum(node.HasField(f) for f in ("tensor", "symint", "mesh")) != 1:
            raise MalformedGraph(f"{where}: a placeholder needs one of tensor meta, a symint or a mesh")
        if node.HasField("dtensor") and not node.HasField("tensor"):
            raise MalformedGraph(f"{where}: DTensor metadata needs tensor meta for its local shard")
        if node.HasField("symint"):
            self.sym_expr(node.symint, where, size=False)
            return
        if node.HasField("mesh"):
            self.mesh_input(node.mesh, where)
            return
        if node.HasField("dtensor"):
            self.dtensor(node.dtensor, where)
        meta = node.tensor
        if len(meta.shape) != len(meta.stride):
            raise MalformedGraph(f"{where}: shape and stride differ in length")
        if len(meta.shape) > self.limits.max_rank:
            raise GraphTooLarge(
                f"{where} has rank {len(meta.shape)}, more than {self.limits.max_rank}"
            )
        for expr in (*meta.shape, *meta.stride):
            self.sym_expr(expr, where, size=True)
        dims = tuple(max(0, self.at_hints(expr.expr)) for expr in meta.shape)
        self.sequences.shapes[node.name] = dims
        numel = 1
        for size in dims:
            numel *= size
        if numel > self.limits.max_placeholder_elements:
            raise GraphTooLarge(
                f"{where} has {numel} elements at its hints, more than {self.limits.max_placeholder_elements}"
            )
        self.count_elements(numel, where)
        self.dtype(meta.dtype, where)
        self.device(meta.device, where)
        if meta.kind == graph_pb2.TensorMeta.KIND_UNSPECIFIED:
            raise MalformedGraph(f"{where}: tensor kind unspecified")
        if meta.kind not in graph_pb2.TensorMeta.Kind.values():
            raise MalformedGraph(f"{where}: unknown tensor kind {meta.kind}")
        if meta.storage_offset < 0:
            raise MalformedGraph(f"{where}: negative storage offset")

    def mesh_input(self, mesh: graph_pb2.MeshInput, where: str) -> None:
        if self.depth > 0:
            raise MalformedGraph(f"{where}: a subgraph takes no device mesh")
        if not 0 <= mesh.mesh < len(self.totals.meshes):
            raise MalformedGraph(f"{where}: device mesh {mesh.mesh} is not declared")
        self.totals.used_meshes.add(mesh.mesh)

    def dtensor(self, meta: graph_pb2.DTensorMeta, where: str) -> None:
        """A DTensor's global sizes and placements; its local tensor is `node.tensor`."""
        if self.depth > 0:
            raise MalformedGraph(f"{where}: a subgraph's placeholders are no DTensors")
        dtensor.check_dtensor(meta, self.totals.meshes, where)
        if len(meta.shape) > self.limits.max_rank:
            raise GraphTooLarge(f"{where} has rank {len(meta.shape)}, more than {self.limits.max_rank}")
        for size in (*meta.shape, *meta.stride):
            self.sym_expr(size, where, size=True)
        self.totals.used_meshes.add(meta.mesh)

    def reference(self, name: str, where: str) -> None:
        if name not in self.defined:
            raise MalformedGraph(f"{where}: reference to {name!r}, not an earlier node")
        if name in self.subgraph_nodes and not self.takes_subgraphs:
            raise MalformedGraph(f"{where}: subgraph {name!r} given to a node that is no higher-order op")

    def argument(self, arg: graph_pb2.Argument, where: str, depth: int) -> None:
        self.totals.arguments += 1
        if self.totals.arguments > self.limits.max_arguments:
            raise GraphTooLarge(f"more than {self.limits.max_arguments} argument values")
        if depth > self.limits.max_nesting_depth:
            raise GraphTooLarge(
                f"{where}: arguments nested deeper than {self.limits.max_nesting_depth}"
            )
        kind = arg.WhichOneof("kind")
        if kind is None:
            raise MalformedGraph(f"{where}: argument without a value")
        if kind == "node":
            self.reference(arg.node, where)
        elif kind in ("list", "tuple"):
            for item in getattr(arg, kind).items:
                self.argument(item, where, depth + 1)
        elif kind == "immutable_dict":
            items = arg.immutable_dict.items
            if len(items) % 2:
                raise MalformedGraph(f"{where}: dict with an odd number of items")
            for key in items[::2]:
                if key.WhichOneof("kind") not in ("str_value", "int_value", "bool_value"):
                    raise MalformedGraph(f"{where}: dict keys must be str, int or bool")
            for item in items:
                self.argument(item, where, depth + 1)
        elif kind == "slice":
            for part in (arg.slice.start, arg.slice.stop, arg.slice.step):
                self.argument(part, where, depth + 1)
        elif kind == "dtype":
            self.dtype(arg.dtype, where)
        elif kind == "device":
            self.device(arg.device, where)
        elif kind == "layout":
            if arg.layout not in LAYOUTS:
                raise MalformedGraph(f"{where}: unknown layout {arg.layout!r}")
        elif kind == "memory_format":
            if arg.memory_format not in MEMORY_FORMATS:
                raise MalformedGraph(f"{where}: unknown memory format {arg.memory_format!r}")
        elif kind == "sym":
            self.sym_expr(arg.sym, where, size=False)
        elif kind == "placement":
            dtensor.check_placement(arg.placement, where)
        # none, bool_value, int_value, float_value, complex_value, str_value need no check.


def _operand(arg: graph_pb2.Argument) -> tuple[str, Any]:
    """An argument as graphbounds.SequenceBounds reads it."""
    kind = arg.WhichOneof("kind")
    if kind == "node":
        return ("node", arg.node)
    if kind in ("list", "tuple"):
        return ("seq", len(getattr(arg, kind).items))
    if kind == "int_value":
        return ("int", arg.int_value)
    return ("other", None)


def _references(args: Iterable[graph_pb2.Argument]) -> Iterator[str]:
    """The node names among `args`, inside lists and tuples too (flex_attention takes a
    mask body inside its block-mask tuple)."""
    for arg in args:
        kind = arg.WhichOneof("kind")
        if kind == "node":
            yield arg.node
        elif kind in ("list", "tuple"):
            yield from _references(getattr(arg, kind).items)


def _bound_exponent(node: graph_pb2.Node, applied: tuple[str, bool], where: str) -> None:
    """`**` and `<<` grow an integer exponentially in their right operand only: a literal
    exponent or shift past the limit is refused unless the base is a float. The base is
    not bounded: `10000 ** (freq_seq / d)` (Funnel's and most sinusoidal position
    encodings) has a literal base and a tensor exponent. An exponent only the worker
    knows, it checks on the actual values (torchfarm/fx/decode.py)."""
    name, reflected = applied
    base, exponent = node.args[::-1] if reflected else node.args  # x.__rpow__(n) is n ** x
    if (
        exponent.WhichOneof("kind") == "int_value"
        and abs(exponent.int_value) > graphbounds.MAX_OPERATOR_EXPONENT
        and base.WhichOneof("kind") != "float_value"
    ):
        what = "exponent" if name == "pow" else "shift"
        raise MalformedGraph(
            f"{where}: {node.target} with {what} {exponent.int_value}; "
            f"the limit is {graphbounds.MAX_OPERATOR_EXPONENT}"
        )


def _check_getattr(node: graph_pb2.Node, where: str) -> None:
    """`getattr(tensor, "T")`: a node and a constant attribute name from the allow-list,
    so the call can reach neither dunders nor methods nor autograd state."""
    if len(node.args) != 2 or node.kwargs or node.args[0].WhichOneof("kind") != "node":
        raise MalformedGraph(f"{where}: {GETATTR} takes a node and a constant name")
    if node.args[1].WhichOneof("kind") != "str_value":
        raise MalformedGraph(f"{where}: {GETATTR} needs a constant attribute name")
    name = node.args[1].str_value
    if not allowlist.is_allowed_attribute(name):
        raise DisallowedOp(name, kind="Tensor attribute")


def validate_graph(graph: graph_pb2.Graph, limits: GraphLimits = GraphLimits()) -> None:
    """Raises a `GraphError` subclass unless `graph` follows the format and `limits`."""
    _Checker(graph, limits).run()
