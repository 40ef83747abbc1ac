"""Compiles one Triton kernel for an explicit target, without executing the client's code.

Plain functions, no Celery. `compile_kernel(request)`:
1. checks the source with `torchfarm.kernels.triton_check` (structure, names, calls);
2. resolves every dotted name rooted at a Triton import against the installed Triton
   and refuses any that leaves `triton.language` or ends in something other than a
   Triton builtin, one of Triton's own @jit functions, a dtype, a constexpr or a
   `triton.language` class (`resolve_names`);
3. builds the function object from the *compiled code object* of the decorator-less
   `def` (`types.FunctionType`, no `exec`): nothing in the body runs, defaults are the
   checked literals, annotations are set to `tl.constexpr` by us, and its globals hold
   only the resolved imports, with empty `__builtins__`;
4. wraps it in `triton.JITFunction` and runs `triton.compile(ASTSource(...),
   target=GPUTarget(...))`: Triton's frontend walks the AST; the CUDA backend runs the
   wheel's `ptxas`, the AMD backend links the hsaco with the LLVM linker built into
   libtriton. No GPU and no GPU driver is touched;
5. checks that the binary's ELF header is code for the requested arch.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import linecache
import threading
import time
import types
from dataclasses import dataclass
from typing import Any

from torchfarm.kernels import elf, triton_check
from torchfarm.kernels.triton_check import KernelRejected, KernelSource
from torchfarm.v1 import farm_pb2
from torchfarm.wire import targets
from torchfarm.wire.targets import Target

_LOCK = threading.Lock()
"""Triton's JIT registry and linecache are process-global; one build at a time."""

_TRITON_ATTRS = frozenset({"language", "jit", "cdiv", "next_power_of_2"})
"""The only names a kernel may reach on the top-level `triton` module."""


class KernelCompileError(Exception):
    """Triton could not compile the kernel; the message is Triton's."""


@dataclass(frozen=True)
class KernelResult:
    kind: str
    """"cubin" or "hsaco"."""
    binary: bytes
    assembly: str
    """PTX or AMDGCN text."""
    metadata: dict[str, Any]
    """Triton's metadata, JSON-ready."""
    seconds: float


def compile_kernel(request: farm_pb2.KernelRequest, target: Target) -> KernelResult:
    """Compiles `request` for `target` (cuda or rocm). Raises KernelRejected or
    KernelCompileError; nothing the client sent is executed."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    checked = triton_check.check_kernel_source(request.source, request.name)
    signature, constexprs = triton_check.check_signature(request, checked)
    options = triton_check.check_options(request.options)
    namespace = resolve_names(checked)
    if target.device == "cuda":
        gpu = GPUTarget("cuda", targets.cuda_capability(target), targets.warp_size(target))
    elif target.device == "rocm":
        gpu = GPUTarget("hip", target.arch, targets.warp_size(target))
    else:
        raise KernelRejected(f"the farm compiles Triton kernels for cuda and rocm, not {target}")

    t0 = time.perf_counter()
    with _LOCK, _jit_function(checked, namespace, request.source) as fn:
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                target=gpu,
                options=options,
            )
        except Exception as e:  # CompilationError, ptxas errors, MLIR failures
            raise KernelCompileError(f"{type(e).__name__}: {e}") from e
    seconds = time.perf_counter() - t0
    kind = "cubin" if target.device == "cuda" else "hsaco"
    binary = compiled.asm.get(kind)
    if not isinstance(binary, bytes):
        raise KernelCompileError(f"Triton produced no {kind}")
    try:
        elf.check_binary(binary, target.device, target.arch)
    except elf.NotAKernel as e:
        raise KernelCompileError(f"Triton's output is not code for {target}: {e}") from e
    assembly = compiled.asm.get("ptx") or compiled.asm.get("amdgcn") or ""
    return KernelResult(
        kind=kind,
        binary=binary,
        assembly=assembly if isinstance(assembly, str) else assembly.decode(),
        metadata=_jsonable(compiled.metadata._asdict()),
        seconds=seconds,
    )


def resolve_names(checked: KernelSource) -> dict[str, Any]:
    """The kernel's globals: each import alias bound to what it names, once every dotted
    name the body uses has been resolved and accepted. Raises KernelRejected."""
    import triton.language as tl

    namespace = {alias: _import(path) for alias, path in checked.imports.items()}
    for chain in sorted(checked.chains):
        alias, *attrs = chain.split(".")
        obj = namespace[alias]
        where = checked.imports[alias]
        for attr in attrs:
            _check_container(obj, chain)
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise KernelRejected(f"{chain}: {where} has no attribute {attr!r}") from None
            where = f"{where}.{attr}"
            _check_module_path(obj, where, chain)
        if not _allowed_value(obj, tl):
            raise KernelRejected(f"{chain} ({where}) is not something a kernel may use")
        if any(obj is getattr(tl, name, None) for name in triton_check.DENIED_FUNCTIONS):
            raise KernelRejected(f"{chain} ({where}) is not allowed in a kernel")
        if chain in checked.string_sinks and not _takes_strings(obj, tl):
            raise KernelRejected(f"{chain} ({where}) may not take a string: it is not a Triton function")
    return namespace


def _import(path: str) -> Any:
    """An allowed import path: a module in triton_check.ALLOWED_MODULES, or a name in one."""
    if path in triton_check.ALLOWED_MODULES:
        return importlib.import_module(path)
    module, _, attr = path.rpartition(".")
    if module not in triton_check.ALLOWED_MODULES:
        raise KernelRejected(f"import of {path!r} is not allowed")
    obj = getattr(importlib.import_module(module), attr, None)
    if obj is None:
        raise KernelRejected(f"{module} has no {attr!r}")
    _check_module_path(obj, path, path)
    if module == "triton" and attr not in _TRITON_ATTRS:
        raise KernelRejected(f"triton.{attr} is not available to kernels")
    return obj


def _check_module_path(obj: Any, where: str, chain: str) -> None:
    """A module is reached only by its own name: `tl.math.core` is triton.language.core
    under another path, and the checks that bound static loops and folded numbers
    (torchfarm/kernels/triton_fold.py) know Triton's functions by their paths."""
    if isinstance(obj, types.ModuleType) and obj.__name__ != where:
        raise KernelRejected(f"{chain}: {where} is module {obj.__name__} under another path; a kernel "
                             "reaches a module only by its own path")


def _check_container(obj: Any, chain: str) -> None:
    """Attributes may be taken only of Triton's language modules and classes."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
        if name == "triton" or name.startswith("triton.language"):
            return
        raise KernelRejected(f"{chain}: reaches module {name}, outside triton.language")
    if inspect.isclass(obj) and obj.__module__.startswith("triton.language"):
        return
    from triton.language import dtype

    if isinstance(obj, dtype):
        return
    raise KernelRejected(f"{chain}: attributes of {type(obj).__name__} are not allowed")


def _allowed_value(obj: Any, tl: Any) -> bool:
    from triton.runtime.jit import JITCallable

    if isinstance(obj, types.ModuleType):
        return False  # a module may be passed through, never held
    if isinstance(obj, (bool, int, float)) or obj is None:
        return True
    if isinstance(obj, (tl.dtype, tl.constexpr)):
        return True
    if isinstance(obj, JITCallable):  # Triton's own device functions (tl.cdiv, tl.sigmoid)
        return obj.__module__.startswith("triton.language")
    if tl.core.is_builtin(obj):
        return getattr(obj, "__module__", "").startswith("triton.language")
    if inspect.isclass(obj):
        return obj.__module__.startswith("triton.language")
    if inspect.isfunction(obj):  # triton.cdiv, triton.next_power_of_2: pure helpers
        return obj.__module__ in ("triton", "triton.runtime.jit") and obj.__name__ in _TRITON_ATTRS
    return False


def _takes_strings(obj: Any, tl: Any) -> bool:
    """A string may go only to Triton's builtins and @jit functions: a class or a constexpr
    (`tl.constexpr("...")`) would hand the kernel a string value to fold and format."""
    from triton.runtime.jit import JITCallable

    if inspect.isclass(obj) or isinstance(obj, (tl.constexpr, tl.dtype)):
        return False
    return isinstance(obj, JITCallable) or bool(tl.core.is_builtin(obj))


class _jit_function:
    """Context manager: the JITFunction for a checked kernel, cleaned up afterwards."""

    def __init__(self, checked: KernelSource, namespace: dict[str, Any], source: str):
        self.checked = checked
        self.namespace = namespace
        self.digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        self.filename = f"<torchfarm-kernel-{self.digest}>"
        self.module = f"torchfarm_kernel_{self.digest}"

    def __enter__(self) -> Any:
        import triton
        import triton.language as tl

        text = ast.unparse(ast.Module(body=[self.checked.function], type_ignores=[])) + "\n"
        # Compiling is parsing plus code generation: nothing runs. The module's code
        # object holds the function's code object as a constant; we take that, not the
        # module, so not even the `def` statement is executed.
        module_code = compile(text, self.filename, "exec", dont_inherit=True)
        code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
        fn_globals = {"__builtins__": {}, "__name__": self.module, **self.namespace}
        fn = types.FunctionType(
            code, fn_globals, self.checked.name, self.checked.defaults or None
        )
        fn.__module__ = self.module
        fn.__annotations__ = {p: tl.constexpr for p in self.checked.constexpr_params}
        # Triton reads the function's source through inspect/linecache.
        linecache.cache[self.filename] = (len(text), None, text.splitlines(True), self.filename)
        self.jit = triton.JITFunction(fn)
        return self.jit

    def __exit__(self, *exc: object) -> None:
        linecache.cache.pop(self.filename, None)
        from triton.runtime import jit

        # Triton 3.7 keeps every JITFunction made in a module-level registry (for its
        # preload); forget ours. Triton 3.6 has none.
        registry = getattr(jit, "_triton_jit_function_registry", {})
        registry.pop(f"{self.module}:{self.checked.name}", None)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "__dict__"):  # GPUTarget and other small records
        return {k: _jsonable(v) for k, v in vars(value).items()}
    return str(value)


def metadata_json(result: KernelResult) -> str:
    return json.dumps(result.metadata, sort_keys=True)
