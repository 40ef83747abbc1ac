"""Checks a Triton kernel's source before anything compiles it. Free of torch and Triton.

A kernel request carries Python source text. Importing or exec'ing it would run
arbitrary code on the worker, and so would Triton itself: its frontend interprets the
kernel's AST and *calls* any Python callable the kernel reaches at compile time
(`CodeGenerator.call_Function` ends in `fn(*args, **kws)`), and `getattr` is in its
builtin namespace. So the farm never executes the module and constrains what the
function body can name:

- the module holds imports of Triton (`import triton`, `import triton.language as tl`,
  `from triton import jit, language`, `from triton.language import ...`,
  `from triton.language.extra import libdevice`), an optional docstring, and exactly
  one function, decorated with `triton.jit` (or `jit`) and nothing else;
- parameters are plain positional ones; defaults are literal constants; annotations
  are `tl.constexpr` only;
- the body uses an allow-list of statements and expressions: no nested functions,
  lambdas, classes, imports, `global`, `with`, `try`, comprehensions, starred, dicts;
- a name is a parameter, a local the body assigns, an import alias, or one of the
  builtins Triton maps to device code (`range`, `min`, `max`, `len`, `int`, `float`,
  `print`); `getattr`, `hasattr`, `isinstance`, `exec` and the like are not names;
- no identifier or attribute starts with "_", no string constant contains "__";
- a call's callee is a builtin above, an attribute chain rooted at a Triton import,
  or a method of a local value (`x.to(...)`); a local is never called itself;
- Triton's frontend folds constants in Python, string methods included: `"_" + "_"`
  is `"__"`, and `s.format(x)` walks attributes of a worker object at compile time.
  So a string is never a value the kernel can compute with: a string constant (or an
  f-string of names and numbers) appears only as an argument of a call of a Triton
  function or of `print`, or as an `assert` message; it is never assigned, operated
  on, subscripted, or the object of an attribute (`tests/targets/test_kernel_eval.py`);
- an attribute of a local value is one of `LOCAL_ATTRIBUTES`, the public attributes
  of Triton's tensors, dtypes and types that yield no string and no IR handle;
- the Python numbers Triton folds (`**`, `<<`, `*` of constexprs) stay under
  `triton_fold.MAX_CONSTANT_BITS`, and static loops under `triton_fold.MAX_STATIC_ITERATIONS`
  (`torchfarm/kernels/triton_fold.py`, run by `check_signature`, which knows the constexpr values).

On the worker, `workers/triton_compile.py` resolves every attribute chain rooted at a Triton
import against the installed Triton and accepts it only if it ends in a Triton
builtin, a `@triton.jit` function of Triton's own, a dtype, a constexpr or a
`triton.language` class, passing only through `triton.language` modules. Then it
builds the function object from the compiled code object (no `exec`; the body never
runs) with globals holding only the imports. A chain that receives a string must be a
Triton builtin or @jit function, not a class (`tl.constexpr("...")` would make a
string value). docs/targets.md says the same, in full.
"""

from __future__ import annotations

import ast
import copy
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchfarm.kernels import triton_fold

if TYPE_CHECKING:  # protobuf stays optional for what imports only this module
    from torchfarm.v1 import farm_pb2

DENIED_FUNCTIONS = {
    "inline_asm_elementwise": "its assembly goes to the worker's assembler, whose directives "
    "(AMDGPU's `.incbin \"path\"`, `.rept`) read the worker's files into the kernel or make it "
    "assemble without bound",
    "extern_elementwise": "its library path names a file on the worker for the compiler to read "
    "and link; Triton's own math libraries are `tl.extra.cuda.libdevice` and `tl.extra.hip.libdevice`",
}
"""Triton builtins no kernel may call, by name: however it is reached (an alias, a module
that re-exports it), the worker refuses the object too (workers/triton_compile.py)."""

MAX_SOURCE_BYTES = 256 * 1024
"""Longest kernel source accepted."""

MAX_AST_NODES = 20_000
"""Most AST nodes in one kernel; bounds the checker's and Triton's work."""

MAX_POW_EXPONENT = 64
"""`a ** n` is allowed only with a literal n up to this: Triton folds constants in Python."""

ALLOWED_MODULES = {
    "triton": "triton",
    "triton.language": "triton.language",
    "triton.language.extra": "triton.language.extra",
    "triton.language.extra.libdevice": "triton.language.extra.libdevice",
}
"""Modules a kernel may import (`import X`, `import X as Y`, `from X import ...`)."""

KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "print"})
"""Python names Triton's frontend gives a device meaning (or folds as constants)."""

STRING_BUILTINS = frozenset({"print"})
"""Builtins that may take a string argument (print is Triton's device_print)."""

LOCAL_ATTRIBUTES = frozenset({
    # tl.tensor (values, methods Triton binds to the tensor)
    "dtype", "shape", "type", "numel", "T", "abs", "advance", "argmax", "argmin",
    "associative_scan", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min",
    "atomic_or", "atomic_xchg", "atomic_xor", "broadcast_to", "cast", "cdiv", "ceil", "cos",
    "cumprod", "cumsum", "erf", "exp", "exp2", "expand_dims", "flip", "floor", "gather",
    "histogram", "item", "log", "log2", "logical_and", "logical_or", "max", "min", "permute",
    "ravel", "reduce", "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort",
    "split", "sqrt", "sqrt_rn", "store", "sum", "to", "trans", "view", "xor_sum",
    # tl.dtype, pointer and block types, constexpr, tuple
    "element_ty", "scalar", "primitive_bitwidth", "int_bitwidth", "fp_mantissa_width",
    "exponent_bias", "address_space", "value", "values", "nbytes", "get_block_shapes",
    "get_int_max_value", "get_int_min_value", "is_bf16", "is_block", "is_bool", "is_const",
    "is_dtype", "is_floating", "is_fp16", "is_fp32", "is_fp64", "is_fp8", "is_fp8e4b15",
    "is_fp8e4b8", "is_fp8e4nv", "is_fp8e5", "is_fp8e5b16", "is_int", "is_int1", "is_int16",
    "is_int32", "is_int64", "is_int8", "is_int_signed", "is_int_unsigned", "is_ptr",
    "is_standard_floating", "is_uint16", "is_uint32", "is_uint64", "is_uint8", "is_void",
    "with_element_ty",
})
"""Attributes a kernel may take of a local value: Triton's, none yielding a string
(`name`, `codegen_name`, `mangle`), an IR object (`handle`, `to_ir`) or a str method."""

_STATEMENTS = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.If, ast.For,
    ast.While, ast.Break, ast.Continue, ast.Pass, ast.Assert,
)
_EXPRESSIONS = (
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Attribute,
    ast.Name, ast.Constant, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.keyword,
    ast.JoinedStr, ast.FormattedValue,
)
_OPERATORS = (
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
)


class KernelRejected(ValueError):
    """The source is not a kernel the farm compiles; the message names the first problem."""


@dataclass
class KernelSource:
    """What the checker learned about a kernel, for the worker that builds it."""

    name: str
    params: tuple[str, ...]
    constexpr_params: frozenset[str]
    defaults: tuple[object, ...]
    """Defaults of the last len(defaults) parameters, as Python constants."""
    imports: dict[str, str]
    """Local alias → dotted path it names ("tl" → "triton.language", "jit" → "triton.jit")."""
    function: ast.FunctionDef
    """The function with its decorator removed: what Triton will parse."""
    chains: set[str] = field(default_factory=set)
    """Every dotted name rooted at an import ("tl.load", "triton.cdiv"), to resolve."""
    string_sinks: set[str] = field(default_factory=set)
    """The chains called with a string argument: each must be a Triton function."""


def check_kernel_source(source: str, name: str) -> KernelSource:
    """Parses and checks `source`; raises KernelRejected with the first violation."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise KernelRejected(f"kernel source is over {MAX_SOURCE_BYTES} bytes")
    try:
        tree = ast.parse(source, filename="<kernel>", mode="exec")
    except SyntaxError as e:
        raise KernelRejected(f"kernel source does not parse: line {e.lineno}: {e.msg}") from e
    except (RecursionError, MemoryError):
        raise KernelRejected("kernel source nests expressions too deeply") from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_AST_NODES:
        raise KernelRejected(f"kernel source has {count} syntax nodes; the limit is {MAX_AST_NODES}")
    imports: dict[str, str] = {}
    functions: list[ast.FunctionDef] = []
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            _check_import(stmt, imports)
        elif isinstance(stmt, ast.FunctionDef):
            functions.append(stmt)
        elif i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str):
            continue  # module docstring
        else:
            raise KernelRejected(
                f"line {stmt.lineno}: only imports of triton and one @triton.jit function may "
                f"appear at the top level, not {type(stmt).__name__}"
            )
    if len(functions) != 1:
        raise KernelRejected(f"the source must define exactly one function; it defines {len(functions)}")
    fn = functions[0]
    if fn.name != name:
        raise KernelRejected(f"the source defines {fn.name!r}, not the requested {name!r}")
    try:
        return _Checker(fn, imports).run()
    except RecursionError:
        raise KernelRejected("kernel source nests expressions too deeply") from None


def _check_import(stmt: ast.Import | ast.ImportFrom, imports: dict[str, str]) -> None:
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.name not in ALLOWED_MODULES:
                raise KernelRejected(f"line {stmt.lineno}: import of {alias.name!r} is not allowed")
            if alias.asname:
                imports[alias.asname] = alias.name
            else:  # `import triton.language` binds `triton`
                imports[alias.name.split(".")[0]] = alias.name.split(".")[0]
        return
    if stmt.level or stmt.module not in ALLOWED_MODULES:
        raise KernelRejected(f"line {stmt.lineno}: import from {stmt.module!r} is not allowed")
    for alias in stmt.names:
        if alias.name == "*" or alias.name.startswith("_"):
            raise KernelRejected(f"line {stmt.lineno}: 'from {stmt.module} import {alias.name}' is not allowed")
        _check_denied(alias.name, stmt.lineno)
        imports[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    for local in imports:
        _check_identifier(local, stmt.lineno)


def _check_denied(name: str, line: int) -> None:
    if name in DENIED_FUNCTIONS:
        raise KernelRejected(f"line {line}: {name} is not allowed in a kernel: {DENIED_FUNCTIONS[name]}")


def _check_identifier(ident: str, line: int) -> None:
    if ident.startswith("_"):
        raise KernelRejected(f"line {line}: names starting with '_' are not allowed ({ident!r})")


class _Checker:
    def __init__(self, fn: ast.FunctionDef, imports: dict[str, str]):
        self.fn = fn
        self.imports = imports
        self.chains: set[str] = set()
        self.string_sinks: set[str] = set()

    def run(self) -> KernelSource:
        fn = self.fn
        self._check_decorators()
        args = fn.args
        if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg:
            raise KernelRejected(f"{fn.name}: only plain positional parameters are allowed")
        params = tuple(a.arg for a in args.args)
        constexprs = set()
        for a in args.args:
            _check_identifier(a.arg, a.lineno)
            if a.annotation is not None:
                if not self._is_constexpr(a.annotation):
                    raise KernelRejected(f"{fn.name}: parameter {a.arg!r}: only tl.constexpr annotations are allowed")
                constexprs.add(a.arg)
        defaults = []
        for d in args.defaults:
            if not isinstance(d, ast.Constant) or not isinstance(d.value, (int, float, bool, type(None))):
                raise KernelRejected(f"{fn.name}: parameter defaults must be numbers, booleans or None")
            defaults.append(d.value)
        if len(params) != len(set(params)):
            raise KernelRejected(f"{fn.name}: duplicate parameter names")
        self.locals = set(params) | self._assigned_names()
        shadowed = self.locals & (set(self.imports) | KERNEL_BUILTINS)
        if shadowed:
            raise KernelRejected(f"{fn.name}: {sorted(shadowed)} shadow an import or a builtin")
        for stmt in fn.body:
            self._stmt(stmt)
        stripped = copy.copy(fn)
        stripped.decorator_list = []
        return KernelSource(
            name=fn.name, params=params, constexpr_params=frozenset(constexprs),
            defaults=tuple(defaults), imports=dict(self.imports), function=stripped,
            chains=self.chains, string_sinks=self.string_sinks,
        )

    def _check_decorators(self) -> None:
        decs = self.fn.decorator_list
        if len(decs) != 1 or self._dotted(decs[0]) not in ("triton.jit",):
            raise KernelRejected(f"{self.fn.name}: the function must have exactly one decorator, @triton.jit")
        if self.fn.returns is not None:
            raise KernelRejected(f"{self.fn.name}: return annotations are not allowed")

    def _dotted(self, node: ast.expr) -> str:
        return triton_fold.dotted(node, self.imports)

    def _is_constexpr(self, node: ast.expr) -> bool:
        return self._dotted(node) in ("triton.language.constexpr", "triton.language.core.constexpr")

    def _assigned_names(self) -> set[str]:
        names = set()
        for node in ast.walk(ast.Module(body=self.fn.body, type_ignores=[])):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
        return names

    def _stmt(self, node: ast.stmt) -> None:
        if not isinstance(node, _STATEMENTS):
            raise KernelRejected(f"line {node.lineno}: {type(node).__name__} is not allowed in a kernel")
        if isinstance(node, ast.AnnAssign) and not self._is_constexpr(node.annotation):
            raise KernelRejected(f"line {node.lineno}: only tl.constexpr annotations are allowed")
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.AnnAssign) and child is node.annotation:
                continue
            if isinstance(child, ast.stmt):
                self._stmt(child)
            elif isinstance(node, ast.Assert) and child is node.msg:
                self._argument(child, node.lineno)
            else:
                self._expr(child, node.lineno)

    def _argument(self, node: ast.AST, line: int) -> None:
        """An expression in a place that may hold a string: a call argument or assert message."""
        line = getattr(node, "lineno", line)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "__" in node.value:
                raise KernelRejected(f"line {line}: string constants may not contain '__'")
            return
        if isinstance(node, ast.JoinedStr):
            self._fstring(node, line)
            return
        self._expr(node, line)

    def _fstring(self, node: ast.JoinedStr, line: int) -> None:
        for part in node.values:
            if isinstance(part, ast.Constant):
                if "__" in str(part.value):
                    raise KernelRejected(f"line {line}: string constants may not contain '__'")
                continue
            if not (isinstance(part, ast.FormattedValue) and part.format_spec is None
                    and isinstance(part.value, ast.Name) and part.value.id in self.locals):
                raise KernelRejected(f"line {line}: an f-string may format only plain local names")
            self._name(part.value, line)

    def _expr(self, node: ast.AST, line: int) -> None:
        line = getattr(node, "lineno", line)
        if isinstance(node, _OPERATORS):
            return
        if not isinstance(node, _EXPRESSIONS):
            raise KernelRejected(f"line {line}: {type(node).__name__} is not allowed in a kernel")
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (str, bytes)):
                raise KernelRejected(
                    f"line {line}: a string may appear only as an argument of a Triton function "
                    "or print, or as an assert message (Triton folds string expressions in Python)"
                )
            return
        if isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
            raise KernelRejected(f"line {line}: an f-string may appear only where a string may")
        if isinstance(node, ast.Name):
            self._name(node, line)
            return
        if isinstance(node, ast.Attribute):
            self._attribute(node, line)
            return
        if isinstance(node, ast.Call):
            self._call(node, line)
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exp = node.right
            if not (isinstance(exp, ast.Constant) and isinstance(exp.value, int)
                    and 0 <= exp.value <= MAX_POW_EXPONENT):
                raise KernelRejected(f"line {line}: '**' needs a literal exponent of at most {MAX_POW_EXPONENT}")
        if isinstance(node, ast.keyword) and node.arg is not None:
            _check_identifier(node.arg, line)
        for child in ast.iter_child_nodes(node):
            self._expr(child, line)

    def _name(self, node: ast.Name, line: int) -> None:
        _check_identifier(node.id, line)
        if isinstance(node.ctx, ast.Store):
            return
        if node.id in self.locals or node.id in KERNEL_BUILTINS:
            return
        if node.id in self.imports:
            self.chains.add(node.id)
            return
        raise KernelRejected(f"line {line}: name {node.id!r} is not defined in the kernel")

    def _attribute(self, node: ast.Attribute, line: int) -> None:
        parts = []
        root: ast.AST = node
        while isinstance(root, ast.Attribute):
            _check_identifier(root.attr, line)
            parts.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.imports:
            _check_identifier(root.id, line)
            _check_denied(parts[0], line)
            self.chains.add(".".join([root.id, *reversed(parts)]))
            return
        # An attribute of a local value (a tensor's .dtype, .to): Triton's attributes only,
        # then check the value itself.
        for attr in parts:
            if attr not in LOCAL_ATTRIBUTES:
                raise KernelRejected(f"line {line}: attribute {attr!r} of a value is not allowed in a kernel")
        self._expr(root, line)

    def _call(self, node: ast.Call, line: int) -> None:
        func = node.func
        chain = ""
        if isinstance(func, ast.Name):
            if func.id in self.locals:
                raise KernelRejected(f"line {line}: calling the local {func.id!r} is not allowed")
            self._name(func, line)
            chain = func.id if func.id in self.imports else ""
        elif isinstance(func, ast.Attribute):
            self._attribute(func, line)
            chain = self._chain(func)
        else:
            raise KernelRejected(f"line {line}: only named functions and methods may be called")
        # Strings go only to Triton's functions (checked on the worker) and print as
        # arguments, and to a value's Triton methods as keywords (`x.to(fp_downcast_rounding="rtne")`).
        takes_strings = bool(chain) or (isinstance(func, ast.Name) and func.id in STRING_BUILTINS)
        for arg in node.args:
            self._call_argument(arg, line, takes_strings, chain)
        for kw in node.keywords:
            if kw.arg is None:
                raise KernelRejected(f"line {line}: '**' arguments are not allowed in a kernel")
            _check_identifier(kw.arg, line)
            self._call_argument(kw.value, line, takes_strings or isinstance(func, ast.Attribute), chain)

    def _call_argument(self, arg: ast.expr, line: int, takes_strings: bool, chain: str) -> None:
        if not takes_strings:
            self._expr(arg, line)
            return
        self._argument(arg, line)
        is_string = isinstance(arg, ast.JoinedStr) or (isinstance(arg, ast.Constant) and isinstance(arg.value, str))
        if chain and is_string:
            self.string_sinks.add(chain)

    def _chain(self, node: ast.Attribute) -> str:
        """The dotted name of an attribute chain rooted at an import, else ""."""
        parts = []
        root: ast.AST = node
        while isinstance(root, ast.Attribute):
            parts.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.imports:
            return ".".join([root.id, *reversed(parts)])
        return ""


TRITON_SCALAR_TYPES = frozenset({
    "i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64",
    "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16", "fp16", "bf16", "fp32", "fp64",
})
"""Triton's argument types; a pointer is one of these after "*" (or "*k", read-only)."""

NUM_WARPS = (1, 2, 4, 8, 16, 32)
"""Accepted `num_warps` (0 asks for Triton's default)."""



def check_signature(request: farm_pb2.KernelRequest, checked: KernelSource) -> tuple[dict[str, str], dict[str, object]]:
    """(signature, constexprs) for Triton's ASTSource, from a KernelRequest's fields.

    Every parameter must appear, in order, with a Triton type; `tl.constexpr`
    parameters must be typed "constexpr", and every "constexpr" one needs a value
    (a JSON number, boolean or null; an int fits in 64 bits; each name given once) or a
    default. Given those values, the numbers Triton folds must stay bounded (`triton_fold`).
    """
    args = [(a.name, a.type) for a in request.signature]
    names = [n for n, _ in args]
    if tuple(names) != checked.params:
        raise KernelRejected(
            f"signature names {names} do not match the parameters {list(checked.params)}"
        )
    values: dict[str, object] = {}
    for option in request.constexprs:
        if option.name not in checked.params:
            raise KernelRejected(f"constexpr {option.name!r} is not a parameter")
        if option.name in values:
            # The kernel key sorts the pairs and the last value would win: two orders of
            # one list would share a key and compile differently.
            raise KernelRejected(f"constexpr {option.name!r} is given twice")
        try:
            value = json.loads(option.json_value)
        except ValueError as e:
            raise KernelRejected(f"constexpr {option.name!r}: not JSON: {e}") from e
        if not isinstance(value, (int, float, bool)) and value is not None:
            raise KernelRejected(f"constexpr {option.name!r} must be a number, a boolean or null")
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise KernelRejected(f"constexpr {option.name!r} must fit in 64 bits")
        values[option.name] = value
    first_default = len(checked.params) - len(checked.defaults)
    defaults = dict(zip(checked.params[first_default:], checked.defaults, strict=True))
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    for name, ty in args:
        if name in checked.constexpr_params and ty != "constexpr":
            raise KernelRejected(f"parameter {name!r} is tl.constexpr; its type must be 'constexpr'")
        if ty == "constexpr":
            if name in values:
                constexprs[name] = values[name]
            elif name in defaults:
                constexprs[name] = defaults[name]
            else:
                raise KernelRejected(f"constexpr parameter {name!r} has no value")
        elif ty.removeprefix("*k").removeprefix("*") not in TRITON_SCALAR_TYPES:
            raise KernelRejected(f"parameter {name!r}: unknown Triton type {ty!r}")
        elif name in values:
            raise KernelRejected(f"parameter {name!r} has a constexpr value but type {ty!r}")
        signature[name] = ty
    try:
        triton_fold.check_folding(checked.function, checked.imports, constexprs)
    except triton_fold.Unbounded as e:
        raise KernelRejected(str(e)) from e
    return signature, constexprs


def check_options(options: farm_pb2.KernelOptions) -> dict[str, int]:
    """Triton compile options from KernelOptions; zeros mean Triton's defaults."""
    out: dict[str, int] = {}
    warps, stages = options.num_warps, options.num_stages
    if warps:
        if warps not in NUM_WARPS:
            raise KernelRejected(f"num_warps must be one of {NUM_WARPS}, not {warps}")
        out["num_warps"] = warps
    if stages:
        if not 1 <= stages <= triton_fold.MAX_NUM_STAGES:  # 0 asks for Triton's default
            raise KernelRejected(f"num_stages must be 1 to {triton_fold.MAX_NUM_STAGES}, not {stages}")
        out["num_stages"] = stages
    return out
