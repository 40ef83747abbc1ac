"""A worker's life around its jobs, as receivers of Celery's worker signals.

The main process, before the pool forks, imports the custom-op modules, warms Inductor
and consumes exactly its targets' queues; once ready it registers the worker in Redis
and keeps a heartbeat, so the coordinator can answer UNAVAILABLE at once when no live
worker serves a target; at shutdown it unregisters; it fails the job of a task killed at
the hard time limit (workers/hard_limits.py). Each pool process starts its sandbox's
forkserver, and one that compiles for this machine's GPU itself warms its GPU path.

Celery's signals belong to the process, not to an app: each receiver here answers only
for the app it was connected with (`connect`), so two apps in one process (tests) each
see their own worker.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from typing import Any

from celery import Celery, current_app, signals

from torchfarm.storage.store import Store
from workers import gpu_probe, hard_limits, sandbox
from workers.tasks import JobContexts
from workers.worker import Worker

log = logging.getLogger(__name__)


def connect(app: Celery, worker: Worker, jobs: JobContexts) -> None:
    """Connects `worker`'s receivers for the worker signals of `app`, whose tasks run
    with `jobs` (workers/tasks.py)."""
    life = Lifecycle(app, worker, jobs)
    signals.celeryd_after_setup.connect(life.after_setup, weak=False)
    signals.worker_process_init.connect(life.pool_process_started, weak=False)
    signals.worker_ready.connect(life.ready, weak=False)
    signals.worker_shutdown.connect(life.shutdown, weak=False)
    # A task killed at the hard time limit runs nothing more; the main process ends its job.
    signals.task_failure.connect(hard_limits.receiver(app, worker.settings), weak=False)


def runs(app: Celery) -> bool:
    """Whether this process runs `app`: Celery makes the app a pool process runs current
    before it sends `worker_process_init`, which names no app."""
    return bool(current_app == app)


class Lifecycle:
    """The receivers of one app's worker signals."""

    def __init__(self, app: Celery, worker: Worker, jobs: JobContexts) -> None:
        self.app = app
        self.worker = worker
        self.jobs = jobs
        self.stop_heartbeat = threading.Event()

    def after_setup(self, sender: object = None, instance: Any = None, **_: object) -> None:
        """`celeryd_after_setup`: in the main process, once logging is set up and before
        the pool forks, so every pool process inherits what it did."""
        if getattr(instance, "app", None) is not self.app:
            return
        self.install_custom_ops()
        self.warm()
        self.consume_target_queues(instance)

    def install_custom_ops(self) -> None:
        """Warm-up or not, the custom-op modules (TORCHFARM_INSTALLED_OP_MODULES and the
        reviewed defaults) are imported once and inherited. transformers' import takes a
        second or more; a pool process that paid it in its first job did so inside the
        job's time limit, before the delivery was counted."""
        from torchfarm.fx.torch_library import use_installed

        try:
            use_installed(self.worker.settings.installed_op_modules)
        except Exception as e:  # each job's context imports them again, and fails the job with the reason
            log.error("custom-op modules failed to import: %s: %s", type(e).__name__, e)

    def warm(self) -> None:
        worker = self.worker
        if not worker.settings.warmup:
            return
        from workers.priming import warm_inductor

        cpu = worker.plan.own_gpu is None  # a GPU worker warms its GPU path where it will run it
        try:
            warm_inductor(compile=bool(worker.plan.graph) and worker.compiles_in_pool and cpu, isa_probe=cpu)
        except Exception as e:  # the first job then pays the same setup, and may fail on it
            log.warning("Inductor warm-up failed: %s: %s", type(e).__name__, e)

    def consume_target_queues(self, instance: Any) -> None:
        """Consumes exactly the queues of this worker's targets (plus any named with -Q)."""
        queues = instance.app.amqp.queues
        default = instance.app.conf.task_default_queue  # consumed when -Q is absent; not a target's
        named = [q for q in queues.consume_from if q != default]
        queues.select(list(dict.fromkeys([*self.worker.plan.queues, *named])))

    def pool_process_started(self, **_: object) -> None:
        """`worker_process_init`: a pool process warms its GPU path, then starts its
        sandbox's forkserver without waiting for it."""
        if not runs(self.app):
            return
        self.warm_gpu_in_pool()
        self.jobs.start_forkserver()

    def warm_gpu_in_pool(self) -> None:
        """A pool process that compiles for this machine's GPU itself (no sandbox) warms
        its GPU path after the fork, in a thread: billiard gives a new pool process
        seconds to say it is up, and a job's own CUDA start waits on torch's init lock
        meanwhile."""
        worker = self.worker
        gpu = worker.plan.own_gpu
        if not (worker.settings.warmup and worker.compiles_in_pool and gpu is not None):
            return

        def warm() -> None:
            from workers.gpu_warm import warm_gpu

            try:
                warm_gpu(gpu)
            except Exception as e:  # the first job then pays the same, and fails on it if broken
                log.warning("GPU warm-up failed: %s: %s", type(e).__name__, e)

        threading.Thread(target=warm, name="gpu-warm-up", daemon=True).start()

    def ready(self, sender: Any = None, **_: object) -> None:
        """`worker_ready` (the sender is the consumer): registers and beats, in a thread."""
        if getattr(sender, "app", None) is not self.app:
            return
        name = self.worker.settings.name or sender.hostname
        threading.Thread(
            target=self.heartbeat, args=(self.store(), name, _build_label()), name="heartbeat", daemon=True
        ).start()

    def shutdown(self, sender: Any = None, **_: object) -> None:
        """`worker_shutdown` (the sender is the worker): stops beating and unregisters."""
        if getattr(sender, "app", None) is not self.app:
            return
        self.stop_heartbeat.set()
        try:
            self.store().forget_worker(self.worker.settings.name or sender.hostname)
        except Exception as e:
            log.warning("could not unregister: %s", e)

    def store(self) -> Store:
        s = self.worker.settings
        return Store.from_url(s.cache_url, s.redis_prefix, s.blob_url, s.state_url)

    def can_serve(self) -> bool:
        """Whether this worker can serve what it would register. A worker lowering for its
        own GPU proves it first: a spawned child, run as its sandbox runs a compile (bwrap
        with the device nodes, the GPU kind's limits), starts a CUDA context and runs one
        Triton kernel (workers/gpu_probe.py). Never in this process, which forks."""
        settings, mode = self.worker.settings, self.worker.sandbox_mode
        gpu = self.worker.plan.own_gpu
        if gpu is None or not settings.gpu_check:
            return True
        argv = gpu_probe.probe_argv(check=True)
        with tempfile.TemporaryDirectory(prefix="tf-gpucheck-", dir=settings.sandbox_dir or None) as scratch:
            env = None
            if mode != "off":
                box = sandbox.for_worker(settings, mode, device=gpu.device)
                argv, env = sandbox.child_command(box, argv, scratch)
            found = gpu_probe.run_probe(argv, env)
        if found.ready and found.accelerator == str(gpu):
            log.info("the GPU path runs for %s (sandbox %s): %s", gpu, mode,
                     ", ".join(f"{k} {v:.2f}s" for k, v in found.seconds.items()))
            return True
        log.error("this worker does not register: the GPU path for %s failed where its compiles run "
                  "(sandbox %s; the check's child saw %r): %s", gpu, mode,
                  found.accelerator, found.error or "no answer")
        return False

    def heartbeat(self, store: Store, name: str, build: str) -> None:
        from workers import identity

        if not self.can_serve():
            return
        settings, plan, mode = self.worker.settings, self.worker.plan, self.worker.sandbox_mode
        # The build its graph queues are named by (workers/serving.py).
        registered = identity.registration(plan.graph, plan.kernel, settings.reported_build)
        log.info(
            "worker %s registered: %s (queues %s; sandbox %s%s)", name,
            ", ".join(f"{t} [{'+'.join(k)}]" for t, k in plan.registration().items()),
            ",".join(plan.queues), mode, "" if mode == "bwrap" else ", DEGRADED",
        )
        while not self.stop_heartbeat.is_set():
            try:
                store.heartbeat(
                    name, plan.queues, build, settings.worker_ttl_s,
                    targets=plan.registration(), sandbox=mode, **registered,
                )
            except Exception as e:  # keep beating through a Redis restart
                log.warning("heartbeat failed: %s", e)
            self.stop_heartbeat.wait(settings.heartbeat_s)


def _build_label() -> str:
    import torch

    return f"torch {torch.__version__}"
