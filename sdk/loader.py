"""Client side of a farm artifact: put the shipped C++ kernels where the local Inductor
will look for them, then deserialize the artifact without compiling anything.

Why this is needed (torch-facts.md): Inductor finds each kernel's .so by a hash of its
source plus the full compiler command line, and that line holds absolute include paths
of the torch installation. A worker and a client whose torch live at different paths
compute different keys, so shipping the worker's cache directory is not enough. A
kernel therefore travels as a *spec* (the arguments Inductor's `CppCodeCache.load_async`
was called with, source text included) plus its binary; here we ask the local Inductor
which path it would build that spec to, and write the binary there.

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
  builds and is not in the key, so we stub that function while asking for keys: a
  client that has every binary runs no compiler at all.
- `cpu_vec_isa.valid_vec_isa_list()` is `functools.cache`d and honours
  `config.cpp.vec_isa_ok`; see `_skip_isa_probe`.
- `CppBuilder.build` is the one place a C++ compiler is started; counting its calls is
  the signal for `count_kernel_builds`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sdk.errors import ArtifactRejected

log = logging.getLogger(__name__)

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
            raise ArtifactRejected(f"malformed kernel spec: {e}", code="BAD_KERNEL") from e
        return spec

    def is_library(self) -> bool:
        return self.output == self.outputs - 1


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


def _call_args(args: dict[str, Any]) -> dict[str, Any]:
    # The command line renders extra_flags by iteration, so list or tuple hash alike;
    # a tuple is what Inductor's default passes.
    return {**args, "extra_flags": tuple(args["extra_flags"])}


def _code_cache(name: str) -> type:
    from torch._inductor import codecache

    if name not in CODE_CACHES:
        raise ArtifactRejected(f"unknown code cache {name!r}", code="BAD_KERNEL")
    return getattr(codecache, name)


def load_fn_outputs(cache_cls: type, load_fn: Callable[[], Any]) -> tuple[str, list[str]]:
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
    from torch._inductor import codecache

    cache_cls = _code_cache(spec.cache)
    with _PRECOMPILE_LOCK:
        real = codecache._precompile_header
        codecache._precompile_header = _no_precompiled_header
        try:
            load_fn = cache_cls.load_async(**_call_args(spec.args))
        finally:
            codecache._precompile_header = real
    return load_fn_outputs(cache_cls, load_fn)


_PRECOMPILE_LOCK = threading.Lock()


def _no_precompiled_header(*args: Any, **kwargs: Any) -> None:
    # A build that does happen later (binary missing) then simply compiles without one.
    return None


def install_kernels(
    kernels: Iterable[tuple[bytes, bytes]], toolchain: dict[str, Any] | None = None
) -> int:
    """Writes each (spec, binary) at the path the local Inductor will load it from, for the
    current TORCHINDUCTOR_CACHE_DIR. Returns how many files were written (identical files
    already in place are skipped). `toolchain` is the manifest's record of the worker's
    probes: with it, keying the kernels starts no compiler (sdk/vecisa.py, sdk/toolchain.py)."""
    _seed_probes(toolchain or {})
    installed = 0
    for source, binary in kernels:
        spec = KernelSpec.from_bytes(source)
        try:
            key, targets = local_outputs(spec)
        except RuntimeError as e:
            raise ArtifactRejected(str(e), code="KERNEL_INSTALL") from e
        if len(targets) != spec.outputs:
            raise ArtifactRejected(
                f"kernel {key}: local Inductor builds {len(targets)} outputs, artifact has "
                f"{spec.outputs}; it was built with different options",
                code="KERNEL_INSTALL",
            )
        if _write_if_different(targets[spec.output], binary):
            installed += 1
    return installed


def _seed_probes(toolchain: dict[str, Any]) -> None:
    from sdk import toolchain as local_toolchain
    from sdk import vecisa

    local_toolchain.seed_inductor()
    if "vec_isa" in toolchain:
        vecisa.seed(toolchain["vec_isa"])
    else:  # a manifest from a worker that recorded no probe
        _skip_isa_probe()


def _skip_isa_probe() -> None:
    """Picks the vector ISA without Inductor's probe build.

    Every kernel key holds the ISA's flags, so `load_async` calls `pick_vec_isa()`, whose
    `valid_vec_isa_list()` (cached for the process) proves each ISA the CPU reports by
    compiling a test program and dlopen'ing it in a child process: seconds of compiler
    time on a machine whose cache dir is empty. The artifact's fingerprint already
    matched this machine's ISA, compiler and CPU model, whose worker passed that very
    probe, so we answer it with `config.cpp.vec_isa_ok=True` ("use the ISAs the CPU
    reports, untested"). Once per process, and only when the user set nothing.
    """
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    if config.cpp.vec_isa_ok is None:
        with config.patch({"cpp.vec_isa_ok": True}):
            valid_vec_isa_list()


def _write_if_different(path: str, data: bytes) -> bool:
    try:
        if os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return False
    except OSError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # Same directory, then rename: a concurrent reader sees the old file or the whole
    # new one, never a torn .so; a library already dlopen'ed keeps its old inode.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".torchfarm-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def load_compiled(payload: bytes) -> Callable[..., Any]:
    """Deserializes an `AOTCompiledArtifact`; the result can be returned from a Dynamo
    backend and runs forward and backward. Install the kernels first, or every C++
    kernel is rebuilt here (logged as a warning)."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    t0 = time.perf_counter()
    with count_kernel_builds() as builds:
        try:
            artifact = AOTCompiledArtifact.deserialize(payload)
        except Exception as e:
            raise ArtifactRejected(f"cannot deserialize artifact: {e!r}", code="DESERIALIZE") from e
    if builds.kernels:
        log.warning(
            "loading the artifact rebuilt %d C++ kernels locally: their shipped binaries "
            "did not match this installation's kernel keys",
            len(builds.kernels),
        )
    log.debug("artifact deserialized in %.3fs", time.perf_counter() - t0)
    return artifact


# ---- process-wide hooks ---------------------------------------------------------
#
# Both hooks patch a class attribute, so they see every thread of the process (C++
# kernels build in AsyncCompile's thread pool). Listeners register under one lock and
# the patch is removed when the last one leaves, so hooks nest and may overlap.


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
    from torch._inductor.cpp_builder import CppBuilder

    return CppBuilder


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


def _wrap_load_async(original: classmethod, hook: _ClassHook) -> classmethod:
    import inspect

    func = original.__func__
    signature = inspect.signature(func)

    @functools.wraps(func)
    def load_async(cls: type, *args: Any, **kwargs: Any) -> Any:
        load_fn = func(cls, *args, **kwargs)
        bound = signature.bind(cls, *args, **kwargs)
        bound.apply_defaults()
        key, targets = load_fn_outputs(cls, load_fn)
        record = KernelLoad(cls.__name__, spec_args(bound.arguments), key, tuple(targets))
        for records in hook.listeners():
            records.append(record)
        return load_fn

    return classmethod(load_async)


def _cpp_code_cache() -> type:
    from torch._inductor.codecache import CppCodeCache

    return CppCodeCache


_LOAD_HOOK = _ClassHook(_cpp_code_cache, "load_async", _wrap_load_async)


@contextmanager
def record_kernel_loads() -> Iterator[list[KernelLoad]]:
    """Records every C++ kernel Inductor keys or loads in this process during the block
    (all `CppCodeCache` subclasses inherit `load_async`)."""
    with _LOAD_HOOK.listen([]) as records:
        yield records


def kernel_name(source: bytes) -> str:
    """A kernel's stable name: the digest of its spec, the same on every worker (the
    local key is not: it depends on where torch is installed)."""
    return hashlib.sha256(source).hexdigest()
