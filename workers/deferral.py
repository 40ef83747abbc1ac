"""Lowering without building: Inductor runs to its wrapper code and kernel sources, and
every C++ kernel build is deferred to the kernel-generation jobs (workers/jobs/).

`defer_kernel_builds()` replaces `CppCodeCache.load_async` (a classmethod that
`CppPythonBindingsCodeCache` and `CppWrapperCodeCache` inherit) for the duration of a
block. The replacement calls the real `load_async` *without* `submit_fn`, which keys
the source, writes it and registers the real lazy loader in `cls.cache` but builds
nothing (sdk/loader.py), records the call as a `KernelLoad`, and hands Inductor a
getter that yields a stub `types.ModuleType`. `load_pybinding_async` asserts that the
result is a ModuleType and returns its entry function; `AsyncCompile.cpp` returns its
`kernel`; a C++ template's benchmark looks its kernel up by name. All are stubs that
raise `DeferredKernelCalled`: lowering only binds them,
so `standalone_compile(aot=True)` and `serialize()` complete with no compiler run. A
compile that does call one (max-autotune benchmarking a C++ template, say) is noted in
`DeferredLoads.stub_calls`, and the caller compiles the whole graph instead.

What the block leaves behind is removed when it ends: the generated wrapper modules
imported meanwhile (`PyCodeCache.modules_no_attr`/`modules`, `sys.modules`) hold
references to stubs, and a later compile of the same graph in this process would
otherwise reuse them. `cls.cache` never holds a stub, but the loaders registered
meanwhile are dropped too: they were made with the precompiled header stubbed out, and
a kernel job in this process that reused one would build without the header (measured:
about four times slower per kernel).

Torch 2.13 internals (pinned in tests/unit/test_deferral.py): `CppCodeCache.load_async`'s
signature and its `cls.cache[key] = load_fn` closure (as sdk/loader.py); the module-level
`codecache._precompile_header`; `CppPythonBindingsCodeCache.entry_function`;
`PyCodeCache.modules_no_attr` and `PyCodeCache.modules`.
"""

from __future__ import annotations

import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torchfarm.fx.cpp_kernels import load_fn_outputs, spec_args
from torchfarm.fx.hooks import KernelLoad
from torchfarm.fx.internals import resolve

_DEFER_LOCK = threading.Lock()
"""One deferral at a time in a process: it patches a class attribute."""


class DeferredKernelCalled(RuntimeError):
    """A kernel whose build was deferred was called during the compile."""


@dataclass
class DeferredLoads:
    """What a deferred compile asked for: every `load_async` call, and stub calls."""

    records: list[KernelLoad] = field(default_factory=list)
    stub_calls: list[str] = field(default_factory=list)
    """Keys of kernels that were *called* while deferred; non-empty means the compile
    needed real kernels and its result must not be used."""


def _stub_module(cls: type, key: str, loads: DeferredLoads) -> types.ModuleType:
    def deferred(*args: Any, **kwargs: Any) -> Any:
        loads.stub_calls.append(key)
        raise DeferredKernelCalled(
            f"kernel {key} was called during a compile whose kernel builds are deferred"
        )

    def entry_point(name: str) -> Any:
        # Any other name is an entry point looked up to be called: max-autotune's C++
        # templates benchmark each candidate by name (CppBenchmarkRequest.make_run_fn).
        if name.startswith("__"):
            raise AttributeError(name)
        return deferred

    stub = types.ModuleType(f"torchfarm_deferred_{key}")
    stub.kernel = deferred  # type: ignore[attr-defined]
    setattr(stub, getattr(cls, "entry_function", "kernel"), deferred)
    stub.key = key  # type: ignore[attr-defined]  # what _load_library would set
    stub.__getattr__ = entry_point  # type: ignore[method-assign]  # PEP 562
    return stub


def _deferring(
    func: Any, loads: DeferredLoads, on_load: Callable[[KernelLoad], None] | None
) -> classmethod:
    signature = inspect.signature(func)

    def load_async(cls: type, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(cls, *args, **kwargs)
        bound.apply_defaults()
        call = {k: v for k, v in bound.arguments.items() if k != "cls"}
        call["submit_fn"] = None  # keys and registers the loader; builds nothing
        load_fn = func(cls, **call)
        key, targets = load_fn_outputs(cls, load_fn)
        load = KernelLoad(cls.__name__, spec_args(bound.arguments), key, tuple(targets))
        loads.records.append(load)
        if on_load is not None:
            on_load(load)
        stub = _stub_module(cls, key, loads)
        return lambda: stub

    return classmethod(load_async)


def _no_precompiled_header(*args: Any, **kwargs: Any) -> None:
    # The header only speeds up builds, and none happen here.
    return None


@contextmanager
def defer_kernel_builds(
    on_load: Callable[[KernelLoad], None] | None = None,
) -> Iterator[DeferredLoads]:
    """Inside the block no C++ kernel is built; every one asked for is recorded, and
    passed to `on_load` as it is asked for (the staged path sends its build then)."""
    codecache = resolve("codecache")

    owner: Any = codecache.CppCodeCache  # its load_async is swapped for the block
    loads = DeferredLoads()
    with _DEFER_LOCK:
        original = owner.__dict__["load_async"]
        real_header = codecache._precompile_header
        py = codecache.PyCodeCache
        memo_before = set(py.modules_no_attr)
        modules_before = len(py.modules)
        owner.load_async = _deferring(original.__func__, loads, on_load)
        codecache._precompile_header = _no_precompiled_header
        try:
            with forgetting_new_loaders():
                yield loads
        finally:
            owner.load_async = original
            codecache._precompile_header = real_header
            _forget_modules(py, memo_before, modules_before)


@contextmanager
def forgetting_new_loaders() -> Iterator[None]:
    """Drops the kernel loaders registered in the C++ code caches during the block.

    Loaders registered while the precompiled header is stubbed out (here, and in
    `torchfarm.fx.cpp_kernels.local_outputs`) carry builders without it; a kernel job in this process
    that reused one would build without the header."""
    codecache = resolve("codecache")

    caches = _code_caches(codecache)
    before = [set(c) for c in caches]
    try:
        yield
    finally:
        for cache, keys in zip(caches, before, strict=False):
            for key in set(cache) - keys:
                del cache[key]


def _code_caches(codecache: Any) -> list[dict[str, Any]]:
    """The distinct `cache` dicts of the C++ code caches (a subclass may share its
    parent's)."""
    dicts: list[dict[str, Any]] = []
    for name in ("CppCodeCache", "CppPythonBindingsCodeCache", "CppWrapperCodeCache"):
        cache = getattr(codecache, name).cache
        if not any(cache is d for d in dicts):
            dicts.append(cache)
    return dicts


def _forget_modules(py: type[Any], memo_before: set[str], modules_before: int) -> None:
    """Drops the wrapper modules imported during the block: they are bound to stubs."""
    added: list[types.ModuleType] = py.modules[modules_before:]
    del py.modules[modules_before:]
    for path in set(py.modules_no_attr) - memo_before:
        added.append(py.modules_no_attr.pop(path))
    for mod in added:
        if sys.modules.get(mod.__name__) is mod:
            del sys.modules[mod.__name__]
