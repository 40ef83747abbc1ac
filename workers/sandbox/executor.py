"""The compile steps in the sandbox's child (workers/executor.py's `Executor`): each
step is a run of a child op (workers/sandbox/child.py) through the file protocol
(protocol.py) in the worker's sandbox (process.py), and what comes back is checked
here before anything acts on it: the files the op declares and no others, kernel
binaries that are ELF files (a Triton kernel's, code for its target), specs that
parse, within the worker's output bound. The child decodes the request itself and
holds no key. A failure's `Failure` kind becomes the job's error code in one place
(`job_failure`); a staged compile's other ways (`NotDecomposable`, `NeedsWholeGraph`)
are raised as the in-process steps raise them.

A GPU step runs in a child of its own, never a fork of the forkserver: CUDA refuses to
start in a forked child whose parent may have touched it. That child is the only
process of a sandboxed worker where CUDA starts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchfarm.fx import autotune
from torchfarm.wire.codes import JobError
from workers.executor import Lowered
from workers.sandbox.process import Sandbox
from workers.sandbox.protocol import STREAM, Failure, Op, SandboxFailed, read_at

if TYPE_CHECKING:
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire.targets import Target
    from workers.aot_seam import Decomposition
    from workers.compiler import CompileResult
    from workers.job import JobFailed, Prepared
    from workers.triton_compile import KernelResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxExecutor:
    sandbox: Sandbox
    max_bytes: int
    """The most one run may return, files together (TORCHFARM_MAX_ARTIFACT_BYTES)."""
    installed_ops: tuple[str, ...] = ()
    """The worker's custom-op modules, imported in the child before it decodes."""
    timeout_errors: tuple[type[BaseException], ...] = ()
    """The task runner's time-limit exceptions: raised while a lowering streams its
    specs, they end the run."""

    @property
    def decodes_here(self) -> bool:
        return False

    def compile_whole(self, job: Prepared) -> tuple[CompileResult, tuple[list, ...]]:
        try:
            return compile_whole(self.sandbox, job.request.SerializeToString(), self.max_bytes,
                                 self.installed_ops, on_gpu=_on_gpu(job))
        except SandboxFailed as e:
            raise job_failure(e) from e

    def decompose(self, job: Prepared) -> Decomposition:
        from workers.aot_seam import NotDecomposable

        try:
            return decompose(self.sandbox, job.request.SerializeToString(), self.max_bytes,
                             self.installed_ops, on_gpu=_on_gpu(job))
        except SandboxFailed as e:
            if e.kind == Failure.UNDECOMPOSABLE:
                raise NotDecomposable(str(e)) from e
            raise job_failure(e) from e

    def lower(self, job: Prepared, on_kernel: Callable[[bytes], None], dec: Decomposition | None) -> Lowered:
        from workers.aot_seam import NotDecomposable
        from workers.compiler import NeedsWholeGraph

        try:
            return lower_graph(
                self.sandbox, job.request.SerializeToString(), None if dec is None else dec.to_fields(),
                self.max_bytes, self.installed_ops, on_kernel=on_kernel, on_gpu=_on_gpu(job),
                timeouts=self.timeout_errors,
            )
        except SandboxFailed as e:
            if e.kind == Failure.UNDECOMPOSABLE:
                raise NotDecomposable(str(e)) from e
            if e.kind == Failure.WHOLE:
                raise NeedsWholeGraph(str(e)) from e
            raise job_failure(e) from e

    def check_ranks(self, job: Prepared, others: list[int]) -> int | None:
        from workers.job import JobFailed

        try:
            differs = check_ranks(self.sandbox, job.request.SerializeToString(), self.installed_ops,
                                  on_gpu=_on_gpu(job))
        except SandboxFailed as e:
            raise job_failure(e) from e
        if differs is not None and differs not in others:
            raise JobFailed(JobError.COMPILE_ERROR, f"the sandboxed rank check named rank {differs}, not one it checks")
        return differs

    def export(self, request: farm_pb2.CompileRequest, inductor_options: dict[str, Any]) -> tuple[bytes, dict[str, float]]:
        # The child checks the request's options again, as `runtime.check_options` did here.
        try:
            return export_package(self.sandbox, request.SerializeToString(), self.max_bytes, self.installed_ops,
                                  on_gpu=request.target.device != "cpu")
        except SandboxFailed as e:
            raise job_failure(e) from e

    def build_kernels(self, specs: list[bytes], threads: int, on_built: Callable[[int, bytes, float], None]) -> None:
        try:
            built = build_kernels(self.sandbox, specs, threads, self.max_bytes)
        except SandboxFailed as e:
            raise job_failure(e) from e
        for i, (binary, seconds) in enumerate(built):
            on_built(i, binary, seconds)

    def compile_triton(self, request: farm_pb2.KernelRequest, target: Target) -> KernelResult:
        try:
            return compile_triton(self.sandbox, request.SerializeToString(), target, self.max_bytes)
        except SandboxFailed as e:
            raise job_failure(e, kernel=True) from e


_JOB_ERRORS = {
    Failure.GRAPH: JobError.INVALID_GRAPH,
    Failure.GUARD: JobError.UNSHIPPABLE_GUARD,
    Failure.REJECTED: JobError.INVALID_KERNEL,
    Failure.CPU: JobError.COMPILE_TIMEOUT,
}
_KERNEL_ERRORS = {**_JOB_ERRORS, Failure.CPU: JobError.KERNEL_TIMEOUT}


def job_failure(e: SandboxFailed, kernel: bool = False) -> JobFailed:
    """A sandboxed step's failure as its job's: the graph's, a guard's, a refused
    kernel's, the time limit's, or else the compiler's (a Triton `kernel` job's codes)."""
    from workers.job import JobFailed

    if kernel:
        return JobFailed(_KERNEL_ERRORS.get(e.kind, JobError.KERNEL_COMPILE_ERROR), str(e))
    return JobFailed(_JOB_ERRORS.get(e.kind, JobError.COMPILE_ERROR), str(e))


def _on_gpu(job: Prepared) -> bool:
    return job.request.target.device != "cpu"


_ELF_MAGIC = b"\x7fELF"


def build_kernels(sandbox: Sandbox, specs: list[bytes], threads: int, max_bytes: int) -> list[tuple[bytes, float]]:
    """(binary, build seconds) of each C++ kernel spec, built in the sandbox with this
    process's vector-ISA answers. Every spec must come back as an ELF file, within
    `max_bytes` in all; anything else fails the build."""
    from torchfarm.fx.vecisa import probe_record

    names = [f"k{i}" for i in range(len(specs))]
    request = {"specs": names, "threads": threads, "vec_isa": probe_record()}
    result, files = sandbox.run(Op.BUILD, request, dict(zip(names, specs, strict=True)), max_bytes)
    seconds = result.get("seconds")
    wanted = [f"{n}.bin" for n in names]
    if result.get("files") != wanted or not isinstance(seconds, list) or len(seconds) != len(specs):
        raise SandboxFailed(Failure.CRASH, "the sandboxed build did not return one binary per kernel")
    out = []
    for name, s in zip(wanted, seconds, strict=True):
        if not files[name].startswith(_ELF_MAGIC) or not isinstance(s, (int, float)):
            raise SandboxFailed(Failure.CRASH, f"the sandboxed build's {name} is not an ELF binary")
        out.append((files[name], float(s)))
    return out


def compile_whole(
    sandbox: Sandbox, request: bytes, max_bytes: int, installed_ops: tuple[str, ...] = (),
    on_gpu: bool = False,
) -> tuple[CompileResult, tuple[list, ...]]:
    """The whole-graph compile of a `CompileRequest` in the sandbox: its result and the
    guards it added. `installed_ops` (TORCHFARM_INSTALLED_OP_MODULES) are imported in the
    child before it decodes. Each kernel's spec must parse and its binary be an ELF file; names
    and kinds are computed here, from the specs, not taken from the child.

    A GPU compile (`on_gpu`) runs in a child of its own: a fork may not use a GPU
    runtime its parent may have touched (CUDA refuses to start in a forked child)."""
    from torchfarm.fx.cpp_kernels import KernelSpec, KernelSpecError, kernel_name
    from workers.compiler import CompileResult, Kernel

    result, files = sandbox.run(
        Op.WHOLE, _compiler_inputs(installed_ops), {"request.pb": request}, max_bytes, forked=not on_gpu,
    )
    count, guards, timings = result.get("kernels"), result.get("guards"), result.get("timings")
    if not isinstance(count, int) or not isinstance(guards, list) or not isinstance(timings, dict):
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's result is malformed")
    if set(files) != {"payload.bin", *(f"k{i}.{e}" for i in range(count) for e in ("src", "bin"))}:
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's files are not the ones it declared")
    kernels = []
    for i in range(count):
        source, binary = files[f"k{i}.src"], files[f"k{i}.bin"]
        try:
            spec = KernelSpec.from_bytes(source)
        except KernelSpecError as e:
            raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's kernel {i}: {e}") from e
        if not binary.startswith(_ELF_MAGIC):
            raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's kernel {i} is not an ELF binary")
        kind = "cpp" if spec.is_library() else "cpp-object"
        kernels.append(Kernel(name=kernel_name(source), kind=kind, source=source, binary=binary))
    if not all(isinstance(g, list) for g in guards):
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's guards are malformed")
    return CompileResult(
        payload=files["payload.bin"], kernels=kernels, timings=_seconds(timings),
        autotune=_autotune_records(result, "compile"),
    ), tuple(guards)


def _autotune_records(result: dict, what: str) -> list[dict[str, Any]]:
    """The child's autotune records, each checked as a client checks them."""
    try:
        return autotune.check_records(result.get("autotune", []))
    except autotune.BadRecord as e:
        raise SandboxFailed(Failure.CRASH, f"the sandboxed {what}'s autotune records: {e}") from e


def _seconds(timings: dict) -> dict[str, float]:
    """A child's timings, the numbers only."""
    return {str(k): float(v) for k, v in timings.items() if isinstance(v, (int, float))}


def _compiler_inputs(installed_ops: tuple[str, ...]) -> dict[str, object]:
    """What every compiling op's child is set up with, as the parent's compiler is: the
    vector-ISA record and the installed custom-op packages."""
    from torchfarm.fx.vecisa import probe_record

    return {"vec_isa": probe_record(), "installed_ops": list(installed_ops)}


@dataclass
class SpecStream:
    """A run's `watch` for the lowering: hands each kernel spec the child streamed out
    (workers/sandboxed.py's `stream/<n>`) to `on_kernel`, in order, each read through no
    link and bounded by `max_bytes` in all. The specs are only a head start (the
    authoritative list is the result's): a stream that breaks its rules, or an
    `on_kernel` that raises, is logged and read no further, except for the errors in
    `passing` (a time limit's), which end the run."""

    on_kernel: Callable[[bytes], None]
    max_bytes: int
    passing: tuple[type[BaseException], ...] = ()
    count: int = 0
    total: int = 0
    stopped: bool = False

    def __call__(self, scratch: str) -> None:
        if self.stopped:
            return
        try:
            fd = os.open(os.path.join(scratch, STREAM), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return  # the child has not started lowering
        except OSError as e:
            self._stop(f"the stream is not a plain directory: {e}")
            return
        try:
            while not self.stopped:
                spec = self._next(fd)
                if spec is None:
                    return
                self.count += 1
                self.on_kernel(spec)
        except self.passing:
            raise
        except Exception as e:  # the lowering goes on; its result lists every spec
            self._stop(f"{type(e).__name__}: {e}")
        finally:
            os.close(fd)

    def _next(self, directory: int) -> bytes | None:
        data = read_at(directory, str(self.count), self.max_bytes - self.total + 1)
        if data is None:
            return None
        self.total += len(data)
        if self.total > self.max_bytes:
            raise SandboxFailed(Failure.CRASH, f"the streamed specs exceed {self.max_bytes} bytes")
        return data

    def _stop(self, why: str) -> None:
        self.stopped = True
        log.warning("kernel streaming from the sandbox stopped: %s", why)


def decompose(
    sandbox: Sandbox, request: bytes, max_bytes: int, installed_ops: tuple[str, ...] = (), on_gpu: bool = False,
) -> Decomposition:
    """The staged compile's decomposition of a `CompileRequest`, in the sandbox
    (`workers.aot_seam.decompose_graph` there). Its fields must parse as a decomposition;
    its graphs are decoded through the allow-list where they are used (the lowering).
    Raises SandboxFailed of kind "undecomposable" when the graph decomposes in its lowering."""
    from workers.aot_seam import Decomposition, NotDecomposable

    result, files = sandbox.run(
        Op.DECOMPOSE, _compiler_inputs(installed_ops), {"request.pb": request}, max_bytes, forked=not on_gpu,
    )
    seconds = result.get("seconds")
    if not isinstance(seconds, (int, float)) or not set(files) <= {"dec.head", "dec.forward", "dec.backward"}:
        raise SandboxFailed(Failure.CRASH, "the sandboxed decomposition's result is malformed")
    try:
        dec = Decomposition.from_fields({name[len("dec."):].encode(): data for name, data in files.items()})
    except NotDecomposable as e:
        raise SandboxFailed(Failure.CRASH, f"the sandboxed decomposition does not parse: {e}") from e
    return dataclasses.replace(dec, seconds=float(seconds))


def check_ranks(
    sandbox: Sandbox, request: bytes, installed_ops: tuple[str, ...] = (), on_gpu: bool = False,
) -> int | None:
    """The DTensor rank check of a `CompileRequest` in the sandbox (workers/ranks.py,
    `first_differing` there): the first rank whose graphs differ, or None."""
    result, _ = sandbox.run(Op.RANKS, _compiler_inputs(installed_ops), {"request.pb": request}, 0, forked=not on_gpu)
    differs = result.get("differs")
    if differs is not None and (not isinstance(differs, int) or isinstance(differs, bool)):
        raise SandboxFailed(Failure.CRASH, "the sandboxed rank check's result is malformed")
    return differs


def lower_graph(
    sandbox: Sandbox, request: bytes, decomposition: Mapping[str, bytes] | None, max_bytes: int,
    installed_ops: tuple[str, ...] = (), on_kernel: Callable[[bytes], None] | None = None,
    on_gpu: bool = False, timeouts: tuple[type[BaseException], ...] = (),
) -> Lowered:
    """The staged lowering of a `CompileRequest` in the sandbox (`workers.compiler.lower_graph`
    there), from the stored decomposition's fields (`Decomposition.to_fields`) when
    given. `on_kernel` gets each
    kernel spec as the compile asks for it (`SpecStream`; `timeouts`, raised by it, end
    the run). Each spec must parse. A GPU target's lowering runs in a child of its own,
    as `compile_whole`'s does.

    Raises SandboxFailed: kind "undecomposable" when the decomposition does not fit,
    "whole" when only the whole-graph path can compile the graph."""
    from torchfarm.fx.cpp_kernels import KernelSpec, KernelSpecError
    from workers.compiler import LoweredGraph

    fields = dict(decomposition or {})
    files = {"request.pb": request, **{f"dec.{name}": data for name, data in fields.items()}}
    stream = SpecStream(on_kernel, max_bytes, timeouts) if on_kernel is not None else None
    result, out = sandbox.run(
        Op.LOWER, {**_compiler_inputs(installed_ops), "decomposition": list(fields)},
        files, max_bytes, forked=not on_gpu, watch=stream,
    )
    count, guards, timings, stats = (result.get(k) for k in ("specs", "guards", "timings", "stats"))
    if (not isinstance(count, int) or not isinstance(guards, list) or not isinstance(timings, dict)
            or not isinstance(stats, dict) or not all(isinstance(g, list) for g in guards)):
        raise SandboxFailed(Failure.CRASH, "the sandboxed lowering's result is malformed")
    if set(out) != {"payload.bin", *(f"s{i}.spec" for i in range(count))}:
        raise SandboxFailed(Failure.CRASH, "the sandboxed lowering's files are not the ones it declared")
    specs = [out[f"s{i}.spec"] for i in range(count)]
    for i, spec in enumerate(specs):
        try:
            KernelSpec.from_bytes(spec)
        except KernelSpecError as e:
            raise SandboxFailed(Failure.CRASH, f"the sandboxed lowering's kernel {i}: {e}") from e
    clean = _seconds(timings)
    if not {"compile", "collect"} <= set(clean):
        raise SandboxFailed(Failure.CRASH, "the sandboxed lowering's timings are malformed")
    graph = LoweredGraph(
        payload=out["payload.bin"], specs=specs, timings=clean,
        stats={str(k): int(v) for k, v in stats.items() if isinstance(v, int)},
        autotune=_autotune_records(result, "lowering"),
    )
    return Lowered(graph, tuple(guards), result.get("used") is True)


_ZIP_MAGIC = b"PK\x03\x04"


def export_package(
    sandbox: Sandbox, request: bytes, max_bytes: int, installed_ops: tuple[str, ...] = (), on_gpu: bool = False,
) -> tuple[bytes, dict[str, float]]:
    """The AOTInductor package of an export `CompileRequest`, built in the sandbox, and
    its timings. The package must be a zip file (a .pt2) within `max_bytes`."""
    result, files = sandbox.run(
        Op.EXPORT, _compiler_inputs(installed_ops), {"request.pb": request}, max_bytes, forked=not on_gpu,
    )
    timings = result.get("timings")
    if set(files) != {"package.pt2"} or not isinstance(timings, dict):
        raise SandboxFailed(Failure.CRASH, "the sandboxed export's result is malformed")
    if not files["package.pt2"].startswith(_ZIP_MAGIC):
        raise SandboxFailed(Failure.CRASH, "the sandboxed export's package is not a .pt2 (zip) file")
    return files["package.pt2"], _seconds(timings)


def compile_triton(sandbox: Sandbox, request: bytes, target: Target, max_bytes: int) -> KernelResult:
    """A Triton `KernelRequest` compiled for `target` in the sandbox. Its binary must be
    code for `target` (checked here again, on what came back), its kind the target's."""
    from torchfarm.kernels import elf
    from workers.triton_compile import KernelResult

    result, files = sandbox.run(Op.TRITON, {"target": str(target)}, {"request.pb": request}, max_bytes)
    kind, metadata, seconds = result.get("kind"), result.get("metadata"), result.get("seconds")
    expected = "cubin" if target.device == "cuda" else "hsaco"
    if (set(files) != {"kernel.bin", "kernel.asm"} or kind != expected or not isinstance(metadata, dict)
            or not isinstance(seconds, (int, float))):
        raise SandboxFailed(Failure.CRASH, "the sandboxed kernel compile's result is malformed")
    try:
        elf.check_binary(files["kernel.bin"], target.device, target.arch)
    except elf.NotAKernel as e:
        raise SandboxFailed(Failure.CRASH, f"the sandboxed kernel compile's binary is not code for {target}: {e}") from e
    try:
        assembly = files["kernel.asm"].decode()
    except UnicodeDecodeError as e:
        raise SandboxFailed(Failure.CRASH, "the sandboxed kernel compile's assembly is not text") from e
    return KernelResult(kind=kind, binary=files["kernel.bin"], assembly=assembly, metadata=metadata,
                        seconds=float(seconds))
