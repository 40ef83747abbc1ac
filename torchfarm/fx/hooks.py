"""Process-wide hooks on Inductor's C++ toolchain: count compiler runs
(`count_kernel_builds`), record every kernel Inductor keys or loads
(`record_kernel_loads`), and check an export's sources before AOTInductor builds them
(`checked_aot_sources`).

Both hooks patch a class attribute, so they see every thread of the process (C++
kernels build in AsyncCompile's thread pool). Listeners register under one lock and
the patch is removed when the last one leaves, so hooks nest and may overlap.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torchfarm.fx.cpp_kernels import check_code, check_sources, load_fn_outputs, spec_args
from torchfarm.fx.internals import resolve

log = logging.getLogger(__name__)

class _ClassHook:
    def __init__(self, owner: Callable[[], type], name: str, wrap: Callable[[Any, _ClassHook], Any]):
        self._owner, self._name, self._wrap = owner, name, wrap
        self._lock = threading.Lock()
        self._listeners: list[Any] = []
        self._original: Any = None
        self._patched: Any = None

    def listeners(self) -> list[Any]:
        with self._lock:
            return list(self._listeners)

    @contextmanager
    def listen(self, listener: Any) -> Iterator[Any]:
        owner = self._owner()
        with self._lock:
            if not self._listeners:
                self._original = owner.__dict__[self._name]
                self._patched = self._wrap(self._original, self)
                setattr(owner, self._name, self._patched)
            self._listeners.append(listener)
        try:
            yield listener
        finally:
            with self._lock:
                self._listeners.remove(listener)
                if not self._listeners:
                    if owner.__dict__.get(self._name) is self._patched:
                        setattr(owner, self._name, self._original)
                    else:
                        log.warning("%s.%s was re-patched by someone else; left as is",
                                    owner.__name__, self._name)


@dataclass
class BuildCounter:
    """C++ compiler runs seen while active: (target path, start, end) per run."""

    runs: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.runs)

    @property
    def kernels(self) -> list[str]:
        """Targets that are kernel code (.so/.o), not precompiled or preprocessed headers."""
        return [t for t, _, _ in self.runs if t.endswith((".so", ".o"))]

    def wall_seconds(self) -> float:
        """Time during which at least one compiler ran (runs overlap in the thread pool)."""
        total, end = 0.0, float("-inf")
        for _, s, e in sorted(self.runs, key=lambda r: r[1]):
            if e > end:
                total += e - max(s, end)
                end = e
        return total


def _wrap_build(original: Callable[..., Any], hook: _ClassHook) -> Callable[..., Any]:
    @functools.wraps(original)
    def build(self: Any) -> None:
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            run = (self.get_target_file_path(), start, time.perf_counter())
            for counter in hook.listeners():
                counter.runs.append(run)

    return build


def _cpp_builder() -> type:
    return resolve("CppBuilder")


_BUILD_HOOK = _ClassHook(_cpp_builder, "build", _wrap_build)


@contextmanager
def count_kernel_builds() -> Iterator[BuildCounter]:
    """Counts C++ compiler runs (kernels and headers) in this process during the block."""
    with _BUILD_HOOK.listen(BuildCounter()) as counter:
        yield counter


@dataclass(frozen=True)
class KernelLoad:
    """One `load_async` call: which cache, its key-relevant args, its key and outputs."""

    cache: str
    args: dict[str, Any]
    key: str
    targets: tuple[str, ...]


def _bound_classmethod(
    original: classmethod, body: Callable[[type, dict[str, Any], Callable[[], Any]], Any]
) -> classmethod:
    """`original` with `body(cls, arguments, call)` in its place: `arguments` are the
    call's, bound by name with defaults applied; `call()` runs the original."""
    import inspect

    func = original.__func__
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(cls: type, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(cls, *args, **kwargs)
        bound.apply_defaults()
        return body(cls, bound.arguments, lambda: func(cls, *args, **kwargs))

    return classmethod(wrapper)


def _wrap_load_async(original: classmethod, hook: _ClassHook) -> classmethod:
    def load_async(cls: type, arguments: dict[str, Any], call: Callable[[], Any]) -> Any:
        # Before the build starts: the worker builds no kernel Inductor would not write.
        check_sources(arguments)
        load_fn = call()
        key, targets = load_fn_outputs(cls, load_fn)
        record = KernelLoad(cls.__name__, spec_args(arguments), key, tuple(targets))
        for records in hook.listeners():
            records.append(record)
        return load_fn

    return _bound_classmethod(original, load_async)


def _cpp_code_cache() -> type:
    return resolve("CppCodeCache")


_LOAD_HOOK = _ClassHook(_cpp_code_cache, "load_async", _wrap_load_async)


@contextmanager
def record_kernel_loads() -> Iterator[list[KernelLoad]]:
    """Records every C++ kernel Inductor keys or loads in this process during the block
    (all `CppCodeCache` subclasses inherit `load_async`)."""
    with _LOAD_HOOK.listen([]) as records:
        yield records


def _wrap_aot_compile(original: classmethod, hook: _ClassHook) -> classmethod:
    def compile(cls: type, arguments: dict[str, Any], call: Callable[[], Any]) -> Any:
        check_code(arguments["wrapper_code"], arguments["kernel_code"])
        return call()

    return _bound_classmethod(original, compile)


_AOT_HOOK = _ClassHook(lambda: resolve("AotCodeCompiler"), "compile", _wrap_aot_compile)


@contextmanager
def checked_aot_sources() -> Iterator[None]:
    """While it is open, AOTInductor builds no wrapper or kernels whose C++ holds what
    Inductor never writes (cpp_kernels.check_code): the export job's depth behind
    graphcheck, as the load hook is the graph compile's."""
    with _AOT_HOOK.listen(None):
        yield
