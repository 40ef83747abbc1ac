"""The farm in process, for fast tests: the pieces, and one farm made of them.

    memory_store()        the store on fakeredis            localfarm/memory_store.py
    InlineDispatcher      jobs run by plain job functions   localfarm/inline.py
    InProcessClient       a CompileClient with no channel   localfarm/inprocess.py

`InProcessFarm` wires them as the real farm is wired: the coordinator's `Farm` on the
store, sending to the dispatcher; a worker registered on the store for this machine's
target, whose jobs run inline when a client submits; clients that call the servicer,
which `FarmBackend(settings, client=farm.client())` takes as it would a gRPC one.
Unit tests of coordinator and worker logic use these; what is about processes (Celery
delivery, gRPC, restarts) stays with the real stack (localfarm/stack.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localfarm.inline import InlineDispatcher, Task, UnknownTask, job_function, worker_context
from localfarm.inprocess import InProcessClient, InProcessRpcError
from localfarm.memory_store import MemoryStore, memory_store
from sdk.settings import SDKSettings
from services.coordinator.farm import Farm
from services.coordinator.settings import CoordinatorSettings

__all__ = [
    "InProcessClient", "InProcessFarm", "InProcessRpcError", "InlineDispatcher", "MemoryStore",
    "Task", "UnknownTask", "job_function", "memory_store", "worker_context",
]


@dataclass
class InProcessFarm:
    """A coordinator, a store and an inline worker, all in this process."""

    settings: CoordinatorSettings = field(default_factory=lambda: CoordinatorSettings(poll_interval_s=0.01))
    worker_settings: dict[str, Any] = field(default_factory=dict)
    """Fields of the inline worker's `WorkerSettings`."""
    store: MemoryStore = field(default_factory=memory_store)
    dispatcher: InlineDispatcher = field(default_factory=InlineDispatcher)
    sandbox: Any = None
    """The inline worker's `workers.sandbox.Sandbox`; None: it compiles in this process."""

    def __post_init__(self) -> None:
        self.farm = Farm(self.settings, self.store, self.dispatcher)
        self._context: Any = None

    @property
    def context(self) -> Any:
        """The inline worker's `WorkerContext` (built on first use: it needs torch)."""
        if self._context is None:
            self._context = worker_context(
                self.store, self.dispatcher, sandbox=self.sandbox, **self.worker_settings
            )
        return self._context

    def register_worker(self, name: str = "inline", ttl_s: int = 3600) -> None:
        """Registers the inline worker as a real one does (workers/lifecycle.py): this
        machine's targets and queues, so the coordinator routes this machine's graphs to it."""
        from workers import identity
        from workers.serving import plan_for
        from workers.settings import WorkerSettings

        plan = plan_for(WorkerSettings(**self.worker_settings))
        self.store.heartbeat(
            name, plan.queues, "inline", ttl_s, targets=plan.registration(),
            **identity.registration(plan.graph, plan.kernel),
        )

    def run_jobs(self) -> int:
        """Runs every pending job, and the stage jobs they send; returns how many ran."""
        return self.dispatcher.run(self.context)

    REMOTE = "grpc://127.0.0.1:0"
    """The address `sdk_settings` names: loopback, so the SDK loads what the inline
    worker signed; nothing listens there (clients of this farm open no channel)."""

    def trusted_keys(self) -> str:
        """The inline worker's signing key, as `SDKSettings.trusted_keys` pins one."""
        signer = self.context.signer
        return ",".join(f"{k}={v}" for k, v in signer.trusted_entry().items())

    def sdk_settings(self, **fields: Any) -> SDKSettings:
        """SDK settings for this farm: its address, the worker's key pinned, `fields`."""
        return SDKSettings(**{"remote": self.REMOTE, "trusted_keys": self.trusted_keys(), **fields})

    def client(self, settings: SDKSettings | None = None, run_jobs: bool = True) -> InProcessClient:
        """A client of this farm; with `run_jobs`, each submit runs the jobs it queued
        before it returns, so a watch that follows sees them end."""
        return InProcessClient(
            self.farm, settings or self.sdk_settings(), self.run_jobs if run_jobs else None
        )
