"""The Celery app a worker runs: `celery -A workers.app worker` (or `torchfarm worker`).

The queues it consumes follow from the targets it serves (TORCHFARM_TARGETS,
workers/serving.py): "cpu.avx512", "cuda.sm_90", "kernels.cuda.sm_90", ...

Settings come from TORCHFARM_* variables, read here, at the entry point. The main
worker process registers the worker in Redis and keeps a heartbeat, so the coordinator
can answer UNAVAILABLE at once when no live worker serves a target. Each pool process
builds its own Redis connection after the fork.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading

from celery import signals

from torchfarm.celeryconf import make_celery
from torchfarm.settings import from_env
from torchfarm.storage.store import Store
from workers import gpu_probe, sandbox, serving
from workers import metrics as worker_metrics
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

# This process forks the pool, and a CUDA driver started here breaks CUDA in every pool
# process. torch.cuda.is_available() starts it (cuInit) unless this is set, and then
# asks NVML instead; the serving plan itself asks a spawned probe (workers/gpu_probe.py).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

settings = from_env(WorkerSettings)
plan = serving.plan_for(settings)
"""What this worker serves: its targets, their job kinds, and the queues that follow."""
if settings.metrics_port:
    worker_metrics.install(settings.metrics_port, tuple(plan.queues))  # before prometheus_client loads
app = make_celery(
    settings.broker_url,
    name="torchfarm-worker",
    soft_time_limit_s=settings.soft_time_limit_s,
    hard_time_limit_s=settings.hard_time_limit_s,
    visibility_timeout_s=settings.visibility_timeout_s,
)
if not settings.signing_key_file:
    log.warning(
        "no TORCHFARM_SIGNING_KEY_FILE: this worker's artifacts are UNSIGNED, and clients "
        "that pin the farm's keys will refuse them"
    )
sandbox_mode = sandbox.resolve(settings.sandbox)
"""Where compiles run (workers/sandbox/process.py), decided once at start-up: an explicit
TORCHFARM_SANDBOX=bwrap that cannot run stops the worker here."""
compiles_in_pool = sandbox_mode == "off" or settings.lower_without_gpu
"""Whether Inductor runs in the pool processes (`WorkerContext.executor` decodes here):
then the main process's warm-up compile is theirs; else each forkserver warms up."""
app.conf.include = ["workers.tasks"]
app.conf.task_queues = None
app.conf.task_create_missing_queues = True

_stop_heartbeat = threading.Event()


def _build_label() -> str:
    import torch

    return f"torch {torch.__version__}"


def can_serve() -> bool:
    """Whether this worker can serve what it would register. A worker lowering for its
    own GPU proves it first: a spawned child, run as its sandbox runs a compile (bwrap
    with the device nodes, the GPU kind's limits), starts a CUDA context and runs one
    Triton kernel (workers/gpu_probe.py). Never in this process, which forks."""
    gpu = plan.own_gpu
    if gpu is None or not settings.gpu_check:
        return True
    argv = gpu_probe.probe_argv(check=True)
    with tempfile.TemporaryDirectory(prefix="tf-gpucheck-", dir=settings.sandbox_dir or None) as scratch:
        env, preexec = None, None
        if sandbox_mode != "off":
            box = sandbox.for_worker(settings, sandbox_mode, device=gpu.device)
            argv, env, preexec = sandbox.child_command(box, argv, scratch)
        found = gpu_probe.run_probe(argv, env, preexec)
    if found.ready and found.accelerator == str(gpu):
        log.info("the GPU path runs for %s (sandbox %s): %s", gpu, sandbox_mode,
                 ", ".join(f"{k} {v:.2f}s" for k, v in found.seconds.items()))
        return True
    log.error("this worker does not register: the GPU path for %s failed where its compiles run "
              "(sandbox %s; the check's child saw %r): %s", gpu, sandbox_mode,
              found.accelerator, found.error or "no answer")
    return False


def _heartbeat(store: Store, name: str, build: str) -> None:
    from workers import identity

    if not can_serve():
        return

    # The build its graph queues are named by (workers/serving.py).
    registered = identity.registration(plan.graph, plan.kernel, settings.reported_build)
    log.info(
        "worker %s registered: %s (queues %s; sandbox %s%s)", name,
        ", ".join(f"{t} [{'+'.join(k)}]" for t, k in plan.registration().items()),
        ",".join(plan.queues), sandbox_mode, "" if sandbox_mode == "bwrap" else ", DEGRADED",
    )
    while not _stop_heartbeat.is_set():
        try:
            store.heartbeat(
                name, plan.queues, build, settings.worker_ttl_s,
                targets=plan.registration(), sandbox=sandbox_mode, **registered,
            )
        except Exception as e:  # keep beating through a Redis restart
            log.warning("heartbeat failed: %s", e)
        _stop_heartbeat.wait(settings.heartbeat_s)


@signals.celeryd_after_setup.connect
def _install_custom_ops(sender, instance, **_: object) -> None:
    """In the main process, before the pool forks, warm-up or not: the custom-op modules
    (TORCHFARM_INSTALLED_OP_MODULES and the reviewed defaults) are imported once and
    inherited. transformers' import takes a second or more; a pool process that paid it
    in its first job did so inside the job's time limit, before the delivery was counted."""
    from torchfarm.fx.torch_library import use_installed

    try:
        use_installed(settings.installed_op_modules)
    except Exception as e:  # each job's context imports them again, and fails the job with the reason
        log.error("custom-op modules failed to import: %s: %s", type(e).__name__, e)


@signals.celeryd_after_setup.connect
def _warm(sender, instance, **_: object) -> None:
    """In the main process, once logging is set up and before the pool forks: every
    pool process inherits it."""
    if not settings.warmup:
        return
    from workers.priming import warm_inductor

    cpu = plan.own_gpu is None  # a GPU worker warms its GPU path where it will run it
    try:
        warm_inductor(compile=bool(plan.graph) and compiles_in_pool and cpu, isa_probe=cpu)
    except Exception as e:  # the first job then pays the same setup, and may fail on it
        log.warning("Inductor warm-up failed: %s: %s", type(e).__name__, e)


@signals.worker_process_init.connect
def _warm_gpu_in_pool(**_: object) -> None:
    """A pool process that compiles for this machine's GPU itself (no sandbox) warms its
    GPU path after the fork, in a thread: billiard gives a new pool process seconds to
    say it is up, and a job's own CUDA start waits on torch's init lock meanwhile."""
    gpu = plan.own_gpu
    if not (settings.warmup and compiles_in_pool and gpu is not None):
        return

    def warm() -> None:
        from workers.gpu_warm import warm_gpu

        try:
            warm_gpu(gpu)
        except Exception as e:  # the first job then pays the same, and fails on it if broken
            log.warning("GPU warm-up failed: %s: %s", type(e).__name__, e)

    threading.Thread(target=warm, name="gpu-warm-up", daemon=True).start()


@signals.worker_ready.connect
def _register(sender, **_: object) -> None:
    store = Store.from_url(settings.cache_url, settings.redis_prefix, settings.blob_url, settings.state_url)
    name = settings.name or sender.hostname
    threading.Thread(
        target=_heartbeat, args=(store, name, _build_label()), name="heartbeat", daemon=True
    ).start()


@signals.celeryd_after_setup.connect
def _consume_target_queues(sender, instance, **_: object) -> None:
    """Consumes exactly the queues of this worker's targets (plus any named with -Q)."""
    queues = instance.app.amqp.queues
    default = instance.app.conf.task_default_queue  # consumed when -Q is absent; not a target's
    named = [q for q in queues.consume_from if q != default]
    queues.select(list(dict.fromkeys([*plan.queues, *named])))


@signals.worker_shutdown.connect
def _unregister(sender, **_: object) -> None:
    _stop_heartbeat.set()
    store = Store.from_url(settings.cache_url, settings.redis_prefix, settings.blob_url, settings.state_url)
    try:
        store.forget_worker(settings.name or sender.hostname)
    except Exception as e:
        log.warning("could not unregister: %s", e)
