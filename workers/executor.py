"""The compiler seam: where each compile step on a tenant's input runs.

Every step a job runs on a tenant's input goes through an `Executor`: the whole-graph
compile, the staged decomposition and lowering, the DTensor rank check, the export, the
C++ kernel builds and the Triton kernel compile. Two implement it:

- `InProcessExecutor` (workers/inprocess.py): in the job's own process, over
  workers/compiler.py, aot_seam.py, ranks.py, aoti.py and triton_compile.py
  (TORCHFARM_SANDBOX=off, a worker that lowers a GPU's graphs without the GPU, the fakes);
- `SandboxExecutor` (workers/sandbox/executor.py): in the sandbox's secret-free child,
  whose every answer is checked before it is used.

The jobs (workers/jobs/) call the seam and never ask where it runs. Each operation
raises `JobFailed` with the job's error code, or `NotDecomposable` / `NeedsWholeGraph`
where a staged compile takes another way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire.targets import Target
    from workers.aot_seam import Decomposition
    from workers.compiler import CompileResult, LoweredGraph
    from workers.job import Prepared
    from workers.triton_compile import KernelResult


@dataclass(frozen=True)
class Lowered:
    """A lowering's result: the lowered graph, the shape guards it added, and whether it
    used the decomposition it was given (AOTAutograd's cache may have had the graph)."""

    graph: LoweredGraph
    guards: tuple[list, ...]
    used_decomposition: bool


class Executor(Protocol):
    """The compile steps, wherever they run."""

    @property
    def decodes_here(self) -> bool:
        """Whether the graph is decoded in the job's process (`Prepared.decoded`): only
        then does `runtime.prepare` decode it, so a bad graph fails before the compile."""
        ...

    def compile_whole(self, job: Prepared) -> tuple[CompileResult, tuple[list, ...]]:
        """The whole-graph compile: its result and the shape guards it added."""
        ...

    def decompose(self, job: Prepared) -> Decomposition:
        """AOTAutograd up to its partition. Raises NotDecomposable."""
        ...

    def lower(self, job: Prepared, on_kernel: Callable[[bytes], None], dec: Decomposition | None) -> Lowered:
        """Inductor on the graph, from `dec`'s graphs when given; `on_kernel` gets each
        kernel spec as the compile asks for it. Raises NotDecomposable (only with
        `dec`) or NeedsWholeGraph."""
        ...

    def check_ranks(self, job: Prepared, others: list[int]) -> int | None:
        """The first of `others` whose AOTAutograd graphs differ from the client rank's,
        or None (workers/ranks.py)."""
        ...

    def export(self, request: farm_pb2.CompileRequest, inductor_options: dict[str, Any]) -> tuple[bytes, dict[str, float]]:
        """The AOTInductor package of an export request, and its timings."""
        ...

    def build_kernels(self, specs: list[bytes], threads: int, on_built: Callable[[int, bytes, float], None]) -> None:
        """Builds each C++ kernel spec, `threads` at once; `on_built(index, binary,
        seconds)` for each."""
        ...

    def compile_triton(self, request: farm_pb2.KernelRequest, target: Target) -> KernelResult:
        """A Triton kernel compiled for `target`."""
        ...
