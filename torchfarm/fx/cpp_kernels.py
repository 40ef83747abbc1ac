"""C++ kernel specs: a kernel as the arguments of the `CppCodeCache.load_async` call that
Inductor made for it, and what the *local* Inductor would build it to.

Why (torch-facts.md): Inductor finds each kernel's .so by a hash of its source plus the
full compiler command line, which holds absolute include paths of the torch
installation. A worker and a client whose torch live at different paths compute
different keys, so a kernel travels as a spec (source text included) plus its binary;
the client asks its own Inductor where that spec builds to (`sdk/loader.py`), and the
worker builds from the spec (`workers/compiler.py`).

Torch internals relied on, pinned for torch 2.13.0 (tests/unit/test_compiler_loader.py
fails loudly if any changes):
- `torch._inductor.codecache.CppCodeCache.load_async(cls, main_code, device_type,
  submit_fn, extra_flags, optimized_code, needs_vec_isa, kernel_needs_vec_isa)`: every C++
  kernel, whether from `AsyncCompile.cpp`, `.cpp_pybinding` (`CppPythonBindingsCodeCache`)
  or the cpp_wrapper (`CppWrapperCodeCache`), is keyed and loaded here. Called without
  `submit_fn` it computes the key and writes the source, but builds nothing.
- It stores the returned `load_fn` in `cls.cache[key]`, and `load_fn` closes over
  `worker_fn = partial(_worker_compile_cpp, lock_path, builders)`: `_worker_compile_cpp`
  runs a `CppBuilder` only when its `get_target_file_path()` is missing. Those target
  paths are exactly the files that must exist for "no local build".
- With `config.cpp_cache_precompile_headers` on (the OSS default), the first
  `load_async` of a key in a process calls the module-level `_precompile_header`, which
  runs the compiler on a header even when the .so exists. The header only speeds up
  builds and is not in the key, so we stub that function while asking for keys.
- `CppBuilder.build` is the one place a C++ compiler is started (`hooks.py` counts it).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchfarm.fx.internals import load_async_args, resolve


class KernelSpecError(ValueError):
    """A kernel spec that is malformed, names an unknown code cache, or that the local
    Inductor cannot place."""


KERNEL_SPEC_FORMAT = "torchfarm.cpp-kernel/1"
"""Schema of a kernel's `source` blob: canonical JSON of one `load_async` call."""

CODE_CACHES = ("CppCodeCache", "CppPythonBindingsCodeCache", "CppWrapperCodeCache")
"""Inductor code-cache classes a spec may name; each sets its own compile flags."""

SPEC_ARGS = (
    "main_code",
    "device_type",
    "extra_flags",
    "optimized_code",
    "needs_vec_isa",
    "kernel_needs_vec_isa",
)
"""`load_async` parameters that feed the key. `submit_fn` only schedules the build."""


@dataclass(frozen=True)
class KernelSpec:
    """One build output of one `load_async` call: `output` indexes its builders'
    targets, the last being the linked library (earlier ones are object files that the
    cpp_wrapper's split build links)."""

    cache: str
    args: dict[str, Any]
    output: int
    outputs: int

    def to_bytes(self) -> bytes:
        body = {
            "format": KERNEL_SPEC_FORMAT,
            "cache": self.cache,
            "args": self.args,
            "output": self.output,
            "outputs": self.outputs,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> KernelSpec:
        try:
            body = json.loads(data)
            if body.get("format") != KERNEL_SPEC_FORMAT:
                raise ValueError(f"unknown kernel spec format {body.get('format')!r}")
            if body["cache"] not in CODE_CACHES:
                raise ValueError(f"unknown code cache {body['cache']!r}")
            args = body["args"]
            _check_args(args)
            spec = cls(body["cache"], args, int(body["output"]), int(body["outputs"]))
            if not 0 <= spec.output < spec.outputs:
                raise ValueError(f"output {spec.output} of {spec.outputs}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise KernelSpecError(f"malformed kernel spec: {e}") from e
        return spec

    def is_library(self) -> bool:
        return self.output == self.outputs - 1


_NOT_INDUCTORS = re.compile(
    r"\b(?:asm|__asm__|__asm)\b"
    r"|\b_*(?:con|de)structor_*\s*[(),\]]"
    r"|\b_*section_*\s*\("
    r"|\.incbin|\.(?:preinit|init|fini)_array|\.[cd]tors\b"
    r"|##|%:%:"
)
"""What Inductor's generated C++ never holds and an injection into it needs: inline
assembly (an `.incbin` of a file), a constructor or destructor attribute (GNU's or
C++'s, any spelling), a section attribute or a section the loader calls (a function
pointer put there), or the preprocessor's token pasting (`##`, or its digraph
`%:%:`), which builds any of these from parts the rest does not match. (Not every way
to run code at load: a global object's constructor has no such mark. The checks of
what reaches the source come first; this is the depth behind them.)"""

_SPLICE = re.compile(r"\\\r?\n")
"""A backslash-newline, which the compiler deletes before it reads a token."""


def check_code(*codes: str) -> None:
    """Raises KernelSpecError if any of these C++ sources holds what Inductor never
    writes (`_NOT_INDUCTORS`), read as the compiler reads it: with its backslash-newline
    splices joined (`__as\\` and `m__` on the next line are `__asm__`)."""
    for code in codes:
        found = _NOT_INDUCTORS.search(_SPLICE.sub("", code))
        if found is not None:
            raise KernelSpecError(f"the kernel's source holds {found.group(0)!r}, which Inductor never writes")


def check_sources(args: dict[str, Any]) -> None:
    """Raises KernelSpecError if a `load_async` call's C++ sources (`main_code`,
    `optimized_code`) hold what Inductor never writes: behind graphcheck's checks of
    what reaches the source, the worker builds no such kernel. The worker's build
    calls it; a client loads signed binaries and does not."""
    check_code(args["main_code"], args.get("optimized_code") or "")


def _check_args(args: dict[str, Any]) -> None:
    if set(args) != set(SPEC_ARGS):
        raise ValueError(f"arguments {sorted(args)} != {sorted(SPEC_ARGS)}")
    ok = (
        isinstance(args["main_code"], str)
        and isinstance(args["device_type"], str)
        and isinstance(args["extra_flags"], list)
        and all(isinstance(f, str) for f in args["extra_flags"])
        and isinstance(args["optimized_code"], (str, type(None)))
        and all(isinstance(args[k], (bool, type(None))) for k in ("needs_vec_isa", "kernel_needs_vec_isa"))
    )
    if not ok:
        raise ValueError("argument of the wrong type")


def spec_args(bound: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of `load_async`'s key-relevant arguments (tuples become lists)."""
    args = {name: bound.get(name) for name in SPEC_ARGS}
    args["extra_flags"] = list(args["extra_flags"] or ())
    return args


def call_args(args: dict[str, Any]) -> dict[str, Any]:
    # The command line renders extra_flags by iteration, so list or tuple hash alike;
    # a tuple is what Inductor's default passes. A torch without some argument (2.12's
    # has no needs_vec_isa) gets it only when None: internals.load_async_args.
    try:
        return load_async_args({**args, "extra_flags": tuple(args["extra_flags"])})
    except ValueError as e:
        raise KernelSpecError(str(e)) from e


def code_cache(name: str) -> type[Any]:
    codecache = resolve("codecache")

    if name not in CODE_CACHES:
        raise KernelSpecError(f"unknown code cache {name!r}")
    return getattr(codecache, name)


def load_fn_outputs(cache_cls: type[Any], load_fn: Callable[[], Any]) -> tuple[str, list[str]]:
    """(key, build target paths) of a `load_fn` that `cache_cls.load_async` returned."""
    key = next((k for k, v in cache_cls.cache.items() if v is load_fn), None)
    cells = dict(zip(load_fn.__code__.co_freevars, load_fn.__closure__ or (), strict=True))
    worker_fn = cells["worker_fn"].cell_contents if "worker_fn" in cells else None
    builders = getattr(worker_fn, "args", (None, None))[1]
    if key is None or not builders:
        raise RuntimeError(
            f"{cache_cls.__name__}.load_async no longer looks like torch 2.13's "
            "(cache entry or closure over worker_fn missing); cannot locate kernel binaries"
        )
    return key, [b.get_target_file_path() for b in builders]


def local_outputs(spec: KernelSpec) -> tuple[str, list[str]]:
    """Asks the local Inductor for the key and build targets of `spec`, building nothing.

    `load_async` without `submit_fn` only keys the source and registers a lazy loader,
    which `deserialize` then reuses, so it never takes the precompiled-header branch.
    That branch would run the compiler (preprocess the header, then build the .gch if
    this machine has none) although the binary is in place; we stub it for this call.
    Switching `config.cpp_cache_precompile_headers` off instead would change the key:
    it adds `-D TORCH_INDUCTOR_PRECOMPILE_HEADERS` to the command line.
    """
    codecache = resolve("codecache")

    cache_cls = code_cache(spec.cache)
    with _PRECOMPILE_LOCK:
        real = codecache._precompile_header
        codecache._precompile_header = _no_precompiled_header
        try:
            load_fn = cache_cls.load_async(**call_args(spec.args))
        finally:
            codecache._precompile_header = real
    return load_fn_outputs(cache_cls, load_fn)


_PRECOMPILE_LOCK = threading.Lock()


def _no_precompiled_header(*args: Any, **kwargs: Any) -> None:
    # A build that does happen later (binary missing) then simply compiles without one.
    return None



def kernel_name(source: bytes) -> str:
    """A kernel's stable name: the digest of its spec, the same on every worker (the
    local key is not: it depends on where torch is installed)."""
    return hashlib.sha256(source).hexdigest()

