"""The compile steps in the job's own process (workers/executor.py's `Executor`): the
graph decoded here, Inductor, AOTAutograd and the compilers run here, under the
worker's CPU-time limit. Used where no sandbox runs (TORCHFARM_SANDBOX=off, the fakes),
and for the Inductor steps of a worker that lowers a GPU's graphs without the GPU
(its fake GPU lives in this process), whose kernel compiles go to `kernels`."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchfarm.fx import guards as shape_guards
from torchfarm.graph.graph_errors import GraphError
from torchfarm.wire.codes import JobError
from workers import ranks
from workers.aot_seam import Decomposition, decompose_graph, using_decomposition
from workers.compiler import (
    CompileFailed,
    CompileResult,
    Kernel,
    WrongPath,
    cause_of,
    compile_graph,
    lower_graph,
    start_kernel_build,
)
from workers.executor import Executor, Lowered
from workers.fakepg import fake_groups
from workers.job import JobFailed, Prepared, added_guards
from workers.limits import cpu_time_limit

if TYPE_CHECKING:
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire.targets import Target
    from workers.triton_compile import KernelResult

_TIMED_OUT = "the compile ran past the farm's time limit"


@dataclass(frozen=True)
class InProcessExecutor:
    cpu_limit_s: int = 0
    """The CPU seconds a step may take (TORCHFARM_COMPILE_CPU_LIMIT_S); 0: no limit."""
    timeout_errors: tuple[type[BaseException], ...] = ()
    """The task runner's time-limit exceptions: a step they caused fails COMPILE_TIMEOUT."""
    timed_out: Callable[[], bool] = lambda: False
    """Whether the task runner's time limit fired during this task."""
    kernels: Executor | None = None
    """Where the kernel compiles (C++ builds, Triton) run when not here: the sandbox's
    executor of a worker that lowers a GPU's graphs without the GPU."""

    @property
    def decodes_here(self) -> bool:
        return True

    def ran_out(self, e: BaseException) -> bool:
        """Whether the task's time limit caused `e`: it fired during the task, or it is in
        `e`'s chain however torch wrapped it."""
        return self.timed_out() or cause_of(e, self.timeout_errors) is not None

    def failure(self, e: CompileFailed) -> JobFailed:
        """A compile's failure as the job's: COMPILE_TIMEOUT when a time limit caused it."""
        if self.ran_out(e):
            return JobFailed(JobError.COMPILE_TIMEOUT, _TIMED_OUT)
        return JobFailed(JobError.COMPILE_ERROR, str(e))

    def compile_whole(self, job: Prepared) -> tuple[CompileResult, tuple[list, ...]]:
        decoded, options = job.decoded, job.request.options
        mark = shape_guards.snapshot(decoded.shape_env)
        try:
            with cpu_time_limit(self.cpu_limit_s), fake_groups(job.request.graph):
                result = compile_graph(
                    decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
                    dynamic=options.dynamic, mode=options.mode, inductor_options=job.inductor_options,
                )
        except CompileFailed as e:
            raise self.failure(e) from e
        return result, added_guards(decoded, mark)

    def decompose(self, job: Prepared) -> Decomposition:
        options = job.request.options
        try:
            with cpu_time_limit(self.cpu_limit_s), fake_groups(job.request.graph):
                return decompose_graph(
                    job.decoded, dynamic=options.dynamic, mode=options.mode, inductor_options=job.inductor_options,
                )
        except CompileFailed as e:
            raise self.failure(e) from e
        except WrongPath as e:
            # A time limit that fired inside, in a type-check say, looks like a graph
            # that does not fit this path: the job must not go on past its limit.
            if self.ran_out(e):
                raise JobFailed(JobError.COMPILE_TIMEOUT, _TIMED_OUT) from e
            raise

    def lower(self, job: Prepared, on_kernel: Callable[[bytes], None], dec: Decomposition | None) -> Lowered:
        decoded, options = job.decoded, job.request.options
        mark = shape_guards.snapshot(decoded.shape_env)
        used: list[str] = []
        seam = using_decomposition(dec, decoded, used) if dec is not None else None
        try:
            with cpu_time_limit(self.cpu_limit_s), fake_groups(job.request.graph):
                lowered = lower_graph(
                    decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
                    dynamic=options.dynamic, mode=options.mode, inductor_options=job.inductor_options,
                    on_kernel=on_kernel, aot_seam=seam,
                )
        except CompileFailed as e:
            raise self.failure(e) from e
        except WrongPath as e:  # as in `decompose`
            if self.ran_out(e):
                raise JobFailed(JobError.COMPILE_TIMEOUT, _TIMED_OUT) from e
            raise
        return Lowered(lowered, added_guards(decoded, mark), bool(used))

    def check_ranks(self, job: Prepared, others: list[int]) -> int | None:
        try:
            return ranks.first_differing(job.request.graph, others, job.request.options, job.inductor_options)
        except GraphError as e:
            raise JobFailed(JobError.INVALID_GRAPH, str(e)) from e
        except CompileFailed as e:
            raise JobFailed(JobError.COMPILE_ERROR, str(e)) from e

    def export(self, request: farm_pb2.CompileRequest, inductor_options: dict[str, Any]) -> tuple[bytes, dict[str, float]]:
        from workers.aoti import ExportFailed, build_package

        try:
            with cpu_time_limit(self.cpu_limit_s):
                result = build_package(request.graph, request.export, inductor_options)
        except GraphError as e:
            raise JobFailed(JobError.INVALID_GRAPH, str(e)) from e
        except ExportFailed as e:
            if self.ran_out(e):
                raise JobFailed(JobError.COMPILE_TIMEOUT, "the export ran past the farm's time limit") from e
            raise JobFailed(JobError.COMPILE_ERROR, str(e)) from e
        return result.package, result.timings

    def build_kernels(self, specs: list[bytes], threads: int, on_built: Callable[[int, bytes, float], None]) -> None:
        if self.kernels is not None:
            self.kernels.build_kernels(specs, threads, on_built)
            return
        try:
            with cpu_time_limit(self.cpu_limit_s):
                builds = [start_kernel_build(spec) for spec in specs]
                with ThreadPoolExecutor(min(len(builds), threads)) as pool:
                    running = [pool.submit(_timed, b) for b in builds]
                    for i, future in enumerate(running):
                        kernel, seconds = future.result()
                        on_built(i, kernel.binary, seconds)
        except CompileFailed as e:
            raise self.failure(e) from e

    def compile_triton(self, request: farm_pb2.KernelRequest, target: Target) -> KernelResult:
        from torchfarm.kernels.triton_check import KernelRejected
        from workers.triton_compile import KernelCompileError, compile_kernel

        if self.kernels is not None:
            return self.kernels.compile_triton(request, target)
        try:
            return compile_kernel(request, target)
        except KernelRejected as e:
            raise JobFailed(JobError.INVALID_KERNEL, str(e)) from e
        except KernelCompileError as e:
            raise JobFailed(JobError.KERNEL_COMPILE_ERROR, str(e)) from e


def _timed(build: Callable[[], Kernel]) -> tuple[Kernel, float]:
    t0 = time.perf_counter()
    return build(), time.perf_counter() - t0
