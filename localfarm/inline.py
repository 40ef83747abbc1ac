"""An inline dispatcher: jobs queued in memory and run in this process by the workers'
plain job functions, in the order they were sent, as a burst worker drains its queues.

The coordinator sends graph, export and kernel jobs through it (`Dispatcher`); a worker
context built by `worker_context` sends a staged compile's stage jobs through it too
(`WorkerContext.send`). `run` then calls, for each task name, the function the Celery
task of that name calls (workers/tasks.py), with no Celery, broker or pool in between.

The job functions are imported by name when first run, so this module loads without
torch (the coordinator's side of a test needs none).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.coordinator.farm import Dispatcher
from torchfarm.storage.store import Store
from torchfarm.wire import routing

log = logging.getLogger(__name__)

JOBS: dict[str, str] = {
    routing.COMPILE_TASK: "workers.jobs.graph:run_job",
    routing.EXPORT_TASK: "workers.jobs.export:run_export_job",
    routing.LOWER_TASK: "workers.jobs.lower:run_lowering",
    routing.BUILD_KERNELS_TASK: "workers.jobs.build:run_kernel_batch",
    routing.ASSEMBLE_TASK: "workers.jobs.assemble:run_assembly",
    routing.KERNEL_TASK: "workers.jobs.triton:run_kernel_job",
}
"""Each Celery task name (torchfarm/wire/routing.py) → "module:function", the plain job
function its task calls. Each takes (key, context, *the task's other arguments)."""


class UnknownTask(LookupError):
    """A task name with no job function in `JOBS`."""


def job_function(task: str) -> Callable[..., None]:
    """The plain job function of the task named `task`, imported now."""
    try:
        module, _, name = JOBS[task].partition(":")
    except KeyError:
        raise UnknownTask(f"no job function for task {task!r}; known: {sorted(JOBS)}") from None
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Task:
    """One sent job: what Celery's send_task would have put on `queue`."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    queue: str

    @property
    def key(self) -> str:
        """The job's key: the first argument of every task."""
        return str(self.args[0])

    @property
    def namespace(self) -> str:
        """The tenant's namespace a coordinator-sent job names ("" on an open farm)."""
        return str(self.kwargs.get("namespace", ""))


@dataclass
class InlineDispatcher(Dispatcher):
    """Keeps sent jobs in memory until `run` runs them. Safe to send from any thread."""

    pending: deque[Task] = field(default_factory=deque)
    ran: list[Task] = field(default_factory=list)
    """Every task `run` has run, in order."""
    sent: list[Task] = field(default_factory=list)
    """Every task sent (the coordinator's jobs and their stage jobs), in order, run or not."""
    down: BaseException | None = None
    """If set, every send raises it and queues nothing, as Celery's `send_task` does
    when its broker is down."""
    kernel_context: Any = None
    """If set (workers/jobs/triton.py `KernelContext`), a kernel job runs as it is sent,
    on a thread of its own, as a kernel worker takes it while `CompileKernel` waits for
    its record; unset, it waits for `run` as every other job does."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def send(self, key: str, queue: str, namespace: str = "") -> None:
        self._put(routing.COMPILE_TASK, [key], {"namespace": namespace}, queue)

    def send_kernel(self, key: str, queue: str, namespace: str = "") -> None:
        if self.kernel_context is None:
            self._put(routing.KERNEL_TASK, [key], {"namespace": namespace}, queue)
            return
        task = self._record(routing.KERNEL_TASK, [key], {"namespace": namespace}, queue)
        threading.Thread(target=self._run_one, args=(task, self.kernel_context), daemon=True).start()

    def send_export(self, key: str, queue: str, namespace: str = "") -> None:
        self._put(routing.EXPORT_TASK, [key], {"namespace": namespace}, queue)

    def send_stage(self, task: str, args: list[Any], queue: str) -> None:
        """`WorkerContext.send`: a staged compile's lowering, kernel builds, assembly."""
        self._put(task, args, {}, queue)

    def _record(self, name: str, args: list[Any], kwargs: dict[str, Any], queue: str) -> Task:
        if name not in JOBS:
            raise UnknownTask(f"no job function for task {name!r}; known: {sorted(JOBS)}")
        if self.down is not None:
            raise self.down
        task = Task(name, tuple(args), dict(kwargs), queue)
        with self._lock:
            self.sent.append(task)
        return task

    def _put(self, name: str, args: list[Any], kwargs: dict[str, Any], queue: str) -> None:
        task = self._record(name, args, kwargs, queue)
        with self._lock:
            self.pending.append(task)

    def _run_one(self, task: Task, context: Any) -> None:
        log.debug("inline %s %s on %s", task.name, task.args, task.queue)
        job_function(task.name)(task.args[0], context, *task.args[1:], **task.kwargs)
        with self._lock:
            self.ran.append(task)

    def depth(self, queue: str) -> int:
        with self._lock:
            return sum(1 for t in self.pending if t.queue == queue)

    def take(self) -> Task | None:
        """The oldest pending task, removed; None when none is left."""
        with self._lock:
            return self.pending.popleft() if self.pending else None

    def run(self, context: Any = None, kernel_context: Any = None) -> int:
        """Runs pending tasks, and those they send, until none is left; returns how many
        ran. Kernel jobs get `kernel_context` (workers/jobs/triton.py `KernelContext`),
        every other job `context` (workers/jobs/graph.py `WorkerContext`). A job function's
        exception propagates, as it would fail the Celery task, and the tasks after it
        stay pending."""
        count = 0
        while (task := self.take()) is not None:
            ctx = kernel_context if task.name == routing.KERNEL_TASK else context
            if ctx is None:
                with self._lock:
                    self.pending.appendleft(task)
                kind = "kernel_context" if task.name == routing.KERNEL_TASK else "context"
                raise ValueError(f"task {task.name} needs a {kind} to run")
            self._run_one(task, ctx)
            count += 1
        return count


def worker_context(
    store: Store, dispatcher: InlineDispatcher, name: str = "inline", sandbox: Any = None, **settings: Any
) -> Any:
    """A `WorkerContext` on `store` whose stage jobs go to `dispatcher`: this machine's
    fingerprint, a fresh signing key (`context.signer`) and the record seal derived from
    it, `WorkerSettings(**settings)`, and `sandbox` (workers/sandbox/process.py) if given."""
    from torchfarm.fx.fingerprint import local_fingerprint
    from torchfarm.trust.seal import Seal
    from torchfarm.trust.signing import Signer
    from workers.runtime import WorkerContext
    from workers.settings import WorkerSettings

    signer = Signer.generate()
    return WorkerContext(
        settings=WorkerSettings(**settings),
        store=store,
        fingerprint=local_fingerprint(),
        name=name,
        signer=signer,
        seal=Seal.from_signer(signer),
        send=dispatcher.send_stage,
        sandbox=sandbox,
    )
