"""What one worker serves: its targets, the job kinds it takes for each, and its queues.

`torchfarm worker --targets local,cuda:sm_90,rocm:gfx942` (TORCHFARM_TARGETS) lists
targets; this module decides what the machine can actually do for each:

- a target this machine *is* (its CPU ISA, its GPU's arch) gets graph compiles, and
  Triton kernel compiles too when it is a CUDA or ROCm GPU;
- a CUDA or ROCm target it is not gets Triton kernel compiles only: Triton compiles
  for an explicit GPUTarget with no GPU present, while Inductor's lowering needs the
  device (docs/targets.md). With `lower_without_gpu` (experimental, CUDA build of
  torch only) one such CUDA target also gets graph compiles, see workers/gpuless.py;
- anything else (a CPU ISA other than its own, mps or xpu elsewhere) is refused at
  start-up, naming the target: a worker never registers what it cannot build.

"local" means this machine's accelerator if it has one, else its CPU; an inexact
"cpu" or "cuda" means this machine's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from torchfarm.wire import routing, targets
from torchfarm.wire.targets import Target, TargetError
from workers import sandbox_limits
from workers.settings import WorkerSettings


class ServingError(ValueError):
    """The worker was asked to serve a target it cannot build for."""


@dataclass(frozen=True)
class ServingPlan:
    graph: tuple[Target, ...]
    """Targets this worker lowers FX graphs for (Inductor)."""
    kernel: tuple[Target, ...]
    """Targets this worker compiles Triton kernels for."""
    fake_gpu: Target | None = None
    """The CUDA target lowered without a GPU (workers/gpuless.py), if any."""
    extra_queues: tuple[str, ...] = field(default=())
    """Queues named explicitly (TORCHFARM_QUEUES); normally none."""
    build: str = ""
    """The digest of the build this worker registers (workers/identity.py): its graph and
    stage queues end in it, so only clients of the same build reach it."""

    @property
    def queues(self) -> list[str]:
        names = [routing.queue_name(t, routing.GRAPH, self.build) for t in self.graph]
        # Staged compiles' kernel builds and assembly go to every graph worker of the
        # target and build.
        names += [routing.stage_queue(t, self.build) for t in self.graph]
        names += [routing.queue_name(t, routing.KERNEL) for t in self.kernel]
        return list(dict.fromkeys([*names, *self.extra_queues]))

    @property
    def own_gpu(self) -> Target | None:
        """The graph target that is this machine's own GPU (not one lowered without it):
        its compiles start the device's runtime, so its sandbox and warm-up differ."""
        return next(
            (t for t in self.graph if t.device in sandbox_limits.GPU_KINDS and t != self.fake_gpu), None
        )

    def registration(self) -> dict[str, list[str]]:
        """Target text → job kinds, as the heartbeat stores it."""
        served: dict[str, list[str]] = {}
        for t in self.graph:
            served.setdefault(str(t), []).append(routing.GRAPH)
        for t in self.kernel:
            served.setdefault(str(t), []).append(routing.KERNEL)
        return served


def make_plan(
    requested: Iterable[str],
    local: list[Target],
    *,
    cuda_build: bool = False,
    lower_without_gpu: bool = False,
    extra_queues: Iterable[str] = (),
    build: str = "",
) -> ServingPlan:
    """Decides what to serve. `local` is this machine's targets, CPU first
    (`workers.gpu_probe.local_targets()`)."""
    graph: list[Target] = []
    kernel: list[Target] = []
    fake_gpu = None
    for item in requested:
        item = item.strip()
        if not item:
            continue
        try:
            target = _resolve(item, local)
        except TargetError as e:
            raise ServingError(str(e)) from e
        is_local = target in local
        if is_local:
            graph.append(target)
            if target.device in targets.KERNEL_DEVICES:
                kernel.append(target)
            continue
        if target.device not in targets.KERNEL_DEVICES:
            mine = ", ".join(str(t) for t in local)
            hint = " (set ATEN_CPU_CAPABILITY to serve a lower ISA)" if target.device == "cpu" else ""
            raise ServingError(f"this machine ({mine}) cannot build for {target}{hint}")
        kernel.append(target)
        if lower_without_gpu and target.device == "cuda":
            if not cuda_build:
                raise ServingError(
                    f"lowering for {target} without a GPU needs a CUDA build of torch"
                )
            if fake_gpu is not None and fake_gpu != target:
                raise ServingError(
                    f"one worker lowers for one GPU it lacks; got {fake_gpu} and {target}"
                )
            fake_gpu = target
            graph.append(target)
    graph, kernel = list(dict.fromkeys(graph)), list(dict.fromkeys(kernel))
    if not graph and not kernel:
        raise ServingError("the worker was given no target to serve")
    if len(graph) > 1:
        # A job's build check and its artifact's fingerprint are the worker's one graph
        # target (workers/tasks.py); run one worker per target instead.
        raise ServingError(
            f"one worker lowers graphs for one target, not {', '.join(map(str, graph))}: "
            "start one worker per target"
        )
    return ServingPlan(tuple(graph), tuple(kernel), fake_gpu, tuple(extra_queues), build)


def _resolve(item: str, local: list[Target]) -> Target:
    if item == "local":
        return local[-1]
    target = targets.parse(item)
    if target.exact:
        return target
    for t in local:
        if t.device == target.device:
            return t
    raise TargetError(f"this machine has no {target.device} device to serve {item!r}")


def plan_for(settings: WorkerSettings) -> ServingPlan:
    """The plan for a worker's settings, on this machine (imports torch). Starts no
    CUDA here: the accelerator is learned in a spawned probe (workers/gpu_probe.py),
    since the process that plans is the one Celery forks its pool from."""
    import torch

    from workers import gpu_probe, identity

    plan = make_plan(
        settings.targets,
        gpu_probe.local_targets(),
        cuda_build=bool(torch.version.cuda),
        lower_without_gpu=settings.lower_without_gpu,
        extra_queues=settings.queues,
    )
    if not plan.graph:
        return plan  # kernel queues carry no build (torchfarm/wire/routing.py)
    fp = identity.worker_fingerprint(plan.graph[0], settings.reported_build)
    return dataclasses.replace(plan, build=identity.build_digest(fp))
