"""What one worker is, decided once at start-up and handed to its tasks and its signal
receivers (workers/tasks.py, workers/lifecycle.py): its settings, what it serves, and
where its compiles run. Nothing here reads the environment; the entry point does
(workers/app.py)."""

from __future__ import annotations

from dataclasses import dataclass

from workers import sandbox, serving
from workers.serving import ServingPlan
from workers.settings import WorkerSettings


@dataclass(frozen=True)
class Worker:
    settings: WorkerSettings
    plan: ServingPlan
    """What this worker serves: its targets, their job kinds, and the queues that follow."""
    sandbox_mode: str
    """Where compiles run (workers/sandbox/process.py): "bwrap", "process" or "off"."""

    @classmethod
    def of(cls, settings: WorkerSettings, plan: ServingPlan | None = None) -> Worker:
        """The worker `settings` describe, on this machine. Without a `plan`, plans one
        (`serving.plan_for`: imports torch, asks a spawned probe for the GPU). An explicit
        TORCHFARM_SANDBOX=bwrap that cannot run stops the worker here."""
        return cls(
            settings,
            serving.plan_for(settings) if plan is None else plan,
            sandbox.resolve(settings.sandbox),
        )

    @property
    def compiles_in_pool(self) -> bool:
        """Whether Inductor runs in the pool processes (`WorkerContext.executor` decodes
        there): then the main process's warm-up compile is theirs; else each forkserver
        warms up."""
        return self.sandbox_mode == "off" or self.settings.lower_without_gpu
