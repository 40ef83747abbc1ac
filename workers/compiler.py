"""A worker's compile: FX graph → Inductor artifact plus the C++ kernel binaries it loads.

Plain functions, no Celery. `compile_graph` runs `torch._inductor.standalone_compile(...,
aot=True)`, serializes the `AOTCompiledArtifact`, then collects kernels by deserializing
that payload once more under `torchfarm.fx.hooks.record_kernel_loads`. Deserializing re-imports
the generated wrapper modules (`CompiledFxGraph.after_deserialization` loads them with
attrs, which bypasses `PyCodeCache`'s module memo), and those call
`CppCodeCache.load_async` for every kernel: so we record exactly the kernels a client's
`deserialize` will ask for, whether this worker just built them, found them in its disk
cache, or already had them loaded in this process. Recording "files newly built" would
miss every kernel of a warm cache, and recording during the compile would also pick up
kernels that only autotuning benchmarked.

`lower_graph` is the staged pipeline's half of the same compile (workers/jobs/):
every C++ kernel build is deferred (workers/deferral.py), and the specs come back from
the same deserialize-and-record step; `build_kernel` later builds one spec on whichever
worker takes it.

The torch 2.13 internals this relies on are listed in `torchfarm/fx/cpp_kernels.py` and
`workers/deferral.py`, and pinned by tests/unit/test_compiler_loader.py and
tests/unit/test_deferral.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from torchfarm.fx import autotune, internals
from torchfarm.fx.cpp_kernels import KernelSpec, kernel_name, load_fn_outputs, local_outputs
from torchfarm.fx.decode import STATIC_INPUT, resolve_function
from torchfarm.fx.encode import NUMPY_PREFIX
from torchfarm.fx.hooks import count_kernel_builds, record_kernel_loads
from torchfarm.fx.internals import resolve
from torchfarm.graph import graphcheck
from torchfarm.graph.allowlist import load_allowlist
from torchfarm.graph.graph_errors import GraphError
from torchfarm.wire import options as farm_options
from workers import inductor_fixes

if TYPE_CHECKING:
    from torch._inductor.standalone_compile import AOTCompiledArtifact, DynamicShapesType

log = logging.getLogger(__name__)

_COMPILE_LOCK = threading.Lock()
"""One compile per process at a time: Inductor's tracing context, config patches,
compile-time metrics and our class hooks are process-global."""

_AOT_METRIC = "create_aot_dispatcher_function"
"""`dynamo_timed` key around AOTAutograd, including the Inductor compiles it calls."""
_INDUCTOR_METRIC = "compile_fx_inner"
"""`dynamo_timed` key around one Inductor compile (forward or backward graph)."""


class CompileFailed(Exception):
    """Inductor could not compile the graph; the message is the compiler's."""


@dataclass(frozen=True)
class Kernel:
    name: str
    """Digest of `source`: stable across workers (the local key is path-dependent)."""
    kind: str
    """"cpp" for a kernel library, "cpp-object" for an object file of a split build."""
    source: bytes
    """`torchfarm.fx.cpp_kernels.KernelSpec` JSON: the source text and the options that enter the key."""
    binary: bytes


@dataclass
class CompileResult:
    payload: bytes
    """`AOTCompiledArtifact.serialize()`."""
    kernels: list[Kernel]
    timings: dict[str, float]
    """Seconds: "compile", "collect"; "decompose", "lower", "kernels" when measured."""
    stats: dict[str, int] = field(default_factory=dict)
    autotune: list[dict[str, Any]] = field(default_factory=list)
    """The Triton kernels' autotune records (torchfarm/fx/autotune.py), for the manifest."""


def inductor_config_patch(
    mode: str, options: dict[str, Any] | None, dynamic: bool
) -> dict[str, Any]:
    """The Inductor config patch `torch.compile(mode=..., options=...)` would apply.

    Built by the same class `torch.compile` uses (torch/__init__.py,
    `_TorchCompileInductorWrapper.apply_mode`/`apply_options`: mode presets from
    `torch._inductor.list_mode_options`, then options, names and types validated).
    """
    inductor, _ = farm_options.split_functorch(options or {})  # AOTAutograd's: torchfarm/fx/global_state.py
    wrapper = resolve("TorchCompileInductorWrapper")(mode or None, inductor or None, dynamic)
    return dict(wrapper.config)


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fake_mode: Any = None,
    dynamic: bool = False,
    mode: str = "",
    inductor_options: dict[str, Any] | None = None,
) -> CompileResult:
    """Compiles `gm` as `torch.compile`'s Inductor backend would, for training or inference.

    `fake_mode` is the FakeTensorMode (with a ShapeEnv) that fake `example_inputs` belong
    to; their symbolic sizes make the artifact dynamic. Real tensors (a graph straight
    from a Dynamo backend) specialize to their sizes unless `dynamic`, in which case the
    symbolic sizes come from the graph's own fake values.
    """
    AOTCompiledArtifact = resolve("AOTCompiledArtifact")

    patch, shapes, fake_mode = _compile_setup(example_inputs, fake_mode, dynamic, mode, inductor_options)

    with _COMPILE_LOCK:
        before = _metric_totals()
        t0 = time.perf_counter()
        with count_kernel_builds() as builds, autotune.noting() as noted:
            try:
                payload = _serialized_compile(gm, example_inputs, shapes, patch, fake_mode)
            except Exception as e:
                raise CompileFailed(f"{type(e).__name__}: {e}") from e
        t1 = time.perf_counter()
        with record_kernel_loads() as loads:
            try:
                AOTCompiledArtifact.deserialize(payload)
            except Exception as e:
                raise CompileFailed(f"the artifact does not load back: {e!r}") from e
        kernels = _read_kernels(loads)
        t2 = time.perf_counter()
        after = _metric_totals()

    timings = {"compile": t1 - t0, "collect": t2 - t1, **_phases(before, after, builds.wall_seconds())}
    stats = {
        "kernels": sum(k.kind == "cpp" for k in kernels),
        "kernel_files": len(kernels),
        "kernel_bytes": sum(len(k.binary) for k in kernels),
        "payload_bytes": len(payload),
        "local_builds": builds.count,
    }
    log.info(
        "compiled: %d kernels (%d bytes), payload %d bytes, %d local C++ builds, "
        "compile %.2fs collect %.2fs",
        stats["kernels"], stats["kernel_bytes"], len(payload), builds.count,
        timings["compile"], timings["collect"],
    )
    return CompileResult(payload=payload, kernels=kernels, timings=timings, stats=stats, autotune=_records(noted))


def run_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fake_mode: Any = None,
    dynamic: bool = False,
    mode: str = "",
    inductor_options: dict[str, Any] | None = None,
    around: contextlib.AbstractContextManager[Any] | None = None,
) -> bytes:
    """The compile `compile_graph` runs, its serialized artifact, with `around` entered
    under the compile lock: for a caller that stops the compile partway by raising from
    a stage it patched in (workers/aot_seam.py stops it at AOTAutograd's partition).
    Raises CompileFailed for settings Inductor refuses; the compile's own exceptions
    come out as raised, for the caller to map."""
    patch, shapes, fake_mode = _compile_setup(example_inputs, fake_mode, dynamic, mode, inductor_options)
    with _COMPILE_LOCK, around or contextlib.nullcontext():
        return _serialized_compile(gm, example_inputs, shapes, patch, fake_mode)


class WrongPath(Exception):
    """The compile cannot go on this way; the subclass says which way it can."""


class NeedsWholeGraph(WrongPath):
    """The compile called a kernel while its build was deferred (autotuning benchmarks
    kernels, for one): only the whole-graph path, which builds as it goes, can run it."""


@dataclass
class LoweredGraph:
    """A graph lowered with every C++ kernel build deferred (workers/deferral.py)."""

    payload: bytes
    """`AOTCompiledArtifact.serialize()`, exactly as `compile_graph` would return it."""
    specs: list[bytes]
    """`torchfarm.fx.cpp_kernels.KernelSpec` JSON of every build output a client's `deserialize` loads,
    in load order: what the kernel-generation jobs build."""
    timings: dict[str, float]
    """Seconds: "compile", "collect"; "decompose" and "lower" when measured."""
    stats: dict[str, int] = field(default_factory=dict)
    autotune: list[dict[str, Any]] = field(default_factory=list)
    """As `CompileResult.autotune`."""


def lower_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fake_mode: Any = None,
    dynamic: bool = False,
    mode: str = "",
    inductor_options: dict[str, Any] | None = None,
    on_kernel: Callable[[bytes], None] | None = None,
    aot_seam: contextlib.AbstractContextManager[Any] | None = None,
) -> LoweredGraph:
    """`compile_graph` up to the kernel sources: AOTAutograd and Inductor run in full,
    the C++ compiler never does. Raises NeedsWholeGraph when that cannot work.

    `on_kernel` gets each kernel spec the compile asks for, as it asks (the forward
    graph's kernels while the backward graph is still to lower). These are what the
    compile asked for; `LoweredGraph.specs`, collected afterwards, are what a client
    loads, and only they count. An `on_kernel` that raises is logged and not called
    again: the specs still come back in `LoweredGraph.specs`.

    `aot_seam` is entered around the compile, under the compile lock: the
    decomposition stage's stand-in for AOTAutograd's tracing
    (`workers.aot_seam.using_decomposition`). A `WrongPath` it raises comes out as
    itself."""
    AOTCompiledArtifact = resolve("AOTCompiledArtifact")

    from workers.deferral import defer_kernel_builds, forgetting_new_loaders

    patch, shapes, fake_mode = _compile_setup(example_inputs, fake_mode, dynamic, mode, inductor_options)

    with _COMPILE_LOCK:
        before = _metric_totals()
        t0 = time.perf_counter()
        with (
            count_kernel_builds() as builds,
            defer_kernel_builds(_streaming(on_kernel)) as deferred,
            aot_seam or contextlib.nullcontext(),
            autotune.noting() as noted,
        ):
            try:
                payload = _serialized_compile(gm, example_inputs, shapes, patch, fake_mode)
            except Exception as e:
                wrong = wrong_path(e)
                if wrong is not None:
                    raise wrong from None
                if deferred.stub_calls:
                    raise NeedsWholeGraph(f"{type(e).__name__}: {e}") from e
                raise CompileFailed(f"{type(e).__name__}: {e}") from e
        if deferred.stub_calls:
            raise NeedsWholeGraph(f"the compile called {len(deferred.stub_calls)} kernels")
        t1 = time.perf_counter()
        with defer_kernel_builds() as loads:
            try:
                AOTCompiledArtifact.deserialize(payload)
            except Exception as e:
                raise CompileFailed(f"the artifact does not load back: {e!r}") from e
        with forgetting_new_loaders():
            specs = [source for source, _ in _kernel_specs(loads.records)]
        t2 = time.perf_counter()
        after = _metric_totals()

    phases = {k: v for k, v in _phases(before, after, 0.0).items() if k != "kernels"}
    timings = {"compile": t1 - t0, "collect": t2 - t1, **phases}
    stats = {"kernel_files": len(specs), "payload_bytes": len(payload), "local_builds": builds.count}
    log.info(
        "lowered: %d kernel build outputs deferred, payload %d bytes, %d local C++ builds, "
        "compile %.2fs collect %.2fs",
        len(specs), len(payload), builds.count, timings["compile"], timings["collect"],
    )
    return LoweredGraph(payload=payload, specs=specs, timings=timings, stats=stats, autotune=_records(noted))


def _records(noted: autotune.Noted) -> list[dict[str, Any]]:
    """The compile's autotune records; none, logged, where torch keeps them otherwise than
    assumed (a hit then benchmarks on the client, as it did before records travelled)."""
    try:
        return noted.results()
    except Exception:  # noqa: BLE001 - torch internals; the artifact stands without them
        log.warning("the compile's autotune records are not carried", exc_info=True)
        return []


def cause_of(e: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `kinds` in `e`'s chain of causes (`e` included), however
    torch wrapped it, or None."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and kinds:
        if isinstance(cur, kinds):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def wrong_path(e: BaseException) -> WrongPath | None:
    """The `WrongPath` that caused `e`, or None."""
    cause = cause_of(e, (WrongPath,))
    return cause if isinstance(cause, WrongPath) else None


def build_kernel(source: bytes) -> Kernel:
    """Builds one kernel spec with the local Inductor (nothing is built if the binary is
    already in this worker's cache dir) and returns it with its binary."""
    return start_kernel_build(source)()


def start_kernel_build(source: bytes) -> Callable[[], Kernel]:
    """Readies one kernel spec's build; the returned function builds it and returns it
    with its binary. Ready builds one at a time (this registers the kernel's loader in
    Inductor's code cache, as Inductor itself does from one thread); the returned
    functions may run in threads at once, as Inductor's own compile pool runs them."""
    from torchfarm.fx.cpp_kernels import call_args, check_sources, code_cache

    spec = KernelSpec.from_bytes(source)
    check_sources(spec.args)
    cache_cls = code_cache(spec.cache)
    load_fn = cache_cls.load_async(**call_args(spec.args))
    # load_fn() would also dlopen the library into this process; its worker_fn only
    # builds (pinned with the rest of load_async in tests/unit/test_compiler_loader.py).
    cells = dict(zip(load_fn.__code__.co_freevars, load_fn.__closure__ or (), strict=True))
    _, targets = load_fn_outputs(cache_cls, load_fn)

    def build() -> Kernel:
        try:
            cells["worker_fn"].cell_contents()
        except Exception as e:
            raise CompileFailed(f"{type(e).__name__}: {e}") from e
        try:
            with open(targets[spec.output], "rb") as f:
                return _kernel(source, f.read())
        except OSError as e:
            raise CompileFailed(f"kernel binary missing after its build: {e}") from e

    return build


def _streaming(on_kernel: Callable[[bytes], None] | None) -> Callable[[Any], None] | None:
    """`defer_kernel_builds`'s `on_load` that hands each load's specs to `on_kernel`."""
    if on_kernel is None:
        return None
    failed: list[Exception] = []

    def on_load(load: Any) -> None:
        if failed:
            return
        try:
            for i in range(len(load.targets)):
                on_kernel(_spec_bytes(load, i))
        except Exception as e:  # the compile goes on; the specs are collected after it
            failed.append(e)
            log.warning("kernel streaming stopped: %s: %s", type(e).__name__, e)

    return on_load


def _compile_setup(
    example_inputs: Sequence[Any], fake_mode: Any, dynamic: bool, mode: str,
    inductor_options: dict[str, Any] | None,
) -> tuple[dict[str, Any], DynamicShapesType, Any]:
    """The config patch, `dynamic_shapes` and fake mode both compile paths pass on; the
    Inductor fixes (workers/inductor_fixes.py) are in place before either compiles."""
    inductor_fixes.apply()
    try:
        patch = inductor_config_patch(mode, inductor_options, dynamic)
    except RuntimeError as e:  # unknown option or mode, wrong type
        raise CompileFailed(str(e)) from e
    shapes, fake_mode = _shape_source(example_inputs, fake_mode, dynamic)
    return patch, shapes, fake_mode


UNMARKED_CACHEABLE_HOPS = (
    "torch.ops.higher_order.cond", "torch.ops.higher_order.while_loop", "torch.ops.higher_order.wrap",
)
"""Higher-order ops the farm allows that torch 2.13 does not mark cacheable; nor is
`autograd_function_apply` by default. AOTAutograd bypasses its cache for a graph that
calls one, and a bypassed compile serializes no artifact (`serialize` fails on a None).
Marking them is sound here: their bodies are subgraphs of the request's graph, so they
are in the farm's key, and AOTAutograd's key pickles the GraphModule with its
submodules' code (`FxGraphCachePickler._reduce_graph_module`)."""

UNMARKED_CACHEABLE_CALLS = (
    "torch.amp.autocast_mode._enter_autocast", "torch.amp.autocast_mode._exit_autocast",
    graphcheck.SDPA_BACKEND, graphcheck.SET_SDPA_KERNEL,
    "torch._check", "torch._check_index", "torch._check_value", "torch.nn.functional._threshold",
    *(f"torch._sym_{f}" for f in "acos asin atan cos cosh log2 sin sinh tan tanh".split()),
    "torch.nested._internal.nested_tensor.nested_from_padded",
    *graphcheck.FUNCTORCH_GRAD, *graphcheck.FUNCTORCH_JVP,
)
"""Allow-listed functions AOTAutograd bypasses its cache for, by their private names:
`torch.autocast` and `sdpa_kernel` inside the compiled code (a float32 island under
autocast, `torch.autocast(..., enabled=False)`), checks, symbolic math on sizes, a
jagged nested tensor made from a padded one, and `torch.func.grad`'s and `jvp`'s
helpers (a level entered and left, inputs wrapped and unwrapped, dual tensors made and
taken apart: AOTAutograd traces through them to plain ops).
Sound for the same reason: each is a function of its arguments, which are in the
graph; the two switches set what their constant arguments say, and what runs outside
them is under the state the request's options key (`global_state.applied`).
tests/unit/test_cacheable.py holds the whole allow-list to this."""


@functools.cache
def _numpy_wrappers() -> tuple[str, ...]:
    """The allowed numpy calls as AOTAutograd names Dynamo's wrappers of them
    ("torch._dynamo.utils.wrapped_absolute"): torch 2.13 takes them for cacheable itself
    (`is_safe_numpy_wrapper`), 2.12 only where marked. The farm's key holds the call's
    name, so marking them is safe."""
    names = []
    for name in load_allowlist().functions:
        if name.startswith(NUMPY_PREFIX):
            try:
                target = resolve_function(name)
            except GraphError:  # not on this torch
                continue
            names.append(f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', '')}")
    return tuple(names)


@contextlib.contextmanager
def cacheable_calls() -> Iterator[None]:
    """AOTAutograd's cache, and so its serialization, takes every higher-order op and
    function the farm allows (`UNMARKED_CACHEABLE_HOPS`, `UNMARKED_CACHEABLE_CALLS`)
    and `autograd.Function`s."""
    inductor_config, functorch_config = internals.resolve("inductor_config"), internals.resolve("functorch_config")
    marked = dict(inductor_config.unsafe_marked_cacheable_functions)
    marked.update(
        (name, torch.__version__)
        for name in (*UNMARKED_CACHEABLE_HOPS, *UNMARKED_CACHEABLE_CALLS, *_numpy_wrappers())
    )
    with inductor_config.patch(unsafe_marked_cacheable_functions=marked), \
            functorch_config.patch(autograd_cache_allow_custom_autograd_functions=True):
        yield


def _serialized_compile(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], shapes: DynamicShapesType,
    patch: dict[str, Any], fake_mode: Any,
) -> bytes:
    """`standalone_compile(aot=True)`, serialized; callers map its exceptions."""
    with cacheable_calls(), static_inputs():
        artifact = internals.standalone_compile(
            gm,
            list(example_inputs),
            dynamic_shapes=shapes,
            options={"config_patches": patch},
            aot=True,
            fake_mode=fake_mode,
        )
    return cast("AOTCompiledArtifact", artifact).serialize()  # what aot=True returns


def _shape_source(
    example_inputs: Sequence[Any], fake_mode: Any, dynamic: bool
) -> tuple[DynamicShapesType, Any]:
    """standalone_compile's `dynamic_shapes` and `fake_mode` for these inputs.

    "from_example_inputs" fakeifies real tensors with static sizes, so a dynamic graph
    given real tensors (Dynamo passes real ones; their symbolic fakes sit in each
    placeholder's `example_value`) must use "from_graph", which takes no `fake_mode`.
    """
    detect_fake_mode, FakeTensor = resolve("detect_fake_mode"), resolve("FakeTensor")

    real = any(isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) for x in example_inputs)
    if dynamic and real:
        return "from_graph", None
    if fake_mode is None:
        fake_mode = detect_fake_mode(list(example_inputs))
    return "from_example_inputs", fake_mode


def _read_kernels(loads: Sequence[Any]) -> list[Kernel]:
    kernels = []
    for source, path in _kernel_specs(loads):
        try:
            with open(path, "rb") as f:
                binary = f.read()
        except OSError as e:
            raise CompileFailed(f"kernel {path}: binary missing after compile: {e}") from e
        kernels.append(_kernel(source, binary))
    return kernels


def _kernel(source: bytes, binary: bytes) -> Kernel:
    kind = "cpp" if KernelSpec.from_bytes(source).is_library() else "cpp-object"
    return Kernel(name=kernel_name(source), kind=kind, source=source, binary=binary)


def _spec_bytes(load: Any, output: int) -> bytes:
    """The `KernelSpec` JSON of a recorded load's build output number `output`."""
    return KernelSpec(load.cache, load.args, output, len(load.targets)).to_bytes()


def _kernel_specs(loads: Sequence[Any]) -> list[tuple[bytes, str]]:
    """(spec JSON, local build target) of every build output the loads name, once each."""
    specs: dict[bytes, str] = {}
    for load in loads:
        for i, path in enumerate(load.targets):
            source = _spec_bytes(load, i)
            if source in specs:
                continue
            # The client recomputes the key from the JSON spec; a spec that does not
            # round-trip to this very path would ship a kernel no client can find.
            key, targets = local_outputs(KernelSpec.from_bytes(source))
            if key != load.key or tuple(targets) != load.targets:
                raise CompileFailed(
                    f"kernel {load.key}: its spec maps to {key} here; torch's kernel key "
                    "no longer matches what sdk.loader assumes (torch 2.13)"
                )
            specs[source] = path
    return list(specs.items())


def _metric_totals() -> dict[str, float]:
    compilation_time_metrics = resolve("compilation_time_metrics")

    return {k: sum(compilation_time_metrics.get(k, ())) for k in (_AOT_METRIC, _INDUCTOR_METRIC)}


def _phases(before: dict[str, float], after: dict[str, float], kernels_s: float) -> dict[str, float]:
    """AOTAutograd's own time, Inductor's time outside C++ compiler runs, and the wall
    time of those runs. Empty when the compile was a cache hit that skipped them."""
    aot = after[_AOT_METRIC] - before[_AOT_METRIC]
    inductor = after[_INDUCTOR_METRIC] - before[_INDUCTOR_METRIC]
    if aot <= 0.0 or inductor <= 0.0:
        return {}
    return {
        "decompose": max(aot - inductor, 0.0),
        "lower": max(inductor - kernels_s, 0.0),
        "kernels": kernels_s,
    }


@contextlib.contextmanager
def static_inputs() -> Iterator[None]:
    """AOTAutograd takes a decoded graph's parameters and buffers as static inputs, as it
    takes a Dynamo graph's in a local `torch.compile` (its `_try_get_metadata_from_dynamo`
    reads them from Dynamo's metadata, which a decoded graph has none of). The partitioner
    then saves such an input for the backward as it is (`treat_parameters_as_free_to_save`),
    with its version check. Without it, the forward saved a view of a buffer made by
    Inductor's `reinterpret_tensor`, which autograd does not version: a buffer changed in
    place before the backward (a MoCo queue) gave wrong gradients where a local compile
    raises. CUDA graphs likewise leave static inputs where they are instead of copying them."""
    module = resolve("aot_autograd")
    real = module._try_get_metadata_from_dynamo

    def metadata(mod: Any, param_keys: Any, full_args_num: int, full_args_descs: Any) -> Any:
        sources, static = real(mod, param_keys, full_args_num, full_args_descs)
        if static or not isinstance(mod, torch.fx.GraphModule):
            return sources, static
        marked = [i for i, n in enumerate(mod.graph.find_nodes(op="placeholder")) if n.meta.get(STATIC_INPUT)]
        if not marked:
            return sources, static
        lifted = len(param_keys)  # AOTAutograd's inputs: the module's own tensors, then the graph's
        return sources, [*range(lifted), *(lifted + i for i in marked)]

    module._try_get_metadata_from_dynamo = metadata
    try:
        yield
    finally:
        module._try_get_metadata_from_dynamo = real
