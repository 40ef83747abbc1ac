"""A worker's settings, read once from TORCHFARM_* variables when the worker starts."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from torchfarm import celeryconf
from torchfarm.graph.customops import DEFAULT_INSTALLED_OP_MODULES


@dataclass(frozen=True)
class WorkerSettings:
    broker_url: str = "redis://127.0.0.1:6379/0"
    """Celery's broker; the same one the coordinator sends to."""
    cache_url: str = "redis://127.0.0.1:6379/1"
    """The artifact cache's Redis: blobs, manifests, kernel records; it may evict
    (`allkeys-lru`). Also the state's, when state_url is empty."""
    state_url: str = ""
    """The Redis of what is in flight: requests, job records, quotas, claims, worker
    registrations (torchfarm/storage/store.py). It must not evict (`noeviction`, with AOF
    persistence); the coordinator refuses one that may. Empty: cache_url's Redis plays
    both roles, as `torchfarm up`'s does (no maxmemory, so nothing is evicted)."""
    blob_url: str = ""
    """Where artifact blobs live (torchfarm/storage/blobs.py): "" keeps them in the cache Redis;
    `s3://bucket/prefix?endpoint=...` in S3-compatible object storage."""
    redis_prefix: str = "tf"
    """Prefix of every key the farm writes in the cache and state Redis."""
    targets: tuple[str, ...] = ("local",)
    """Targets to serve (workers/serving.py): "local" (this machine's accelerator, else
    its CPU), "cpu", "cuda", or exact ones such as "cuda:sm_90,rocm:gfx942". A GPU target
    this machine lacks gets Triton kernel jobs only. The queues follow from the targets."""
    queues: tuple[str, ...] = ()
    """Extra Celery queues to consume besides the targets' own; normally none."""
    installed_op_modules: tuple[str, ...] = DEFAULT_INSTALLED_OP_MODULES
    """Custom-op namespaces whose packages are installed on this worker, as
    `namespace=module` (say `transformers=transformers.integrations.moe`): the module is
    imported at start, and graphs calling that namespace's ops use the real ops, autograd
    included, in place of stand-ins built from the client's schema (torchfarm/fx/torch_library.py).
    The default is the reviewed list (torchfarm/graph/customops.py), each entry loaded only where
    its package is installed; a value replaces it, and an empty one loads none."""
    lower_without_gpu: bool = False
    """Experimental: also lower graphs for one CUDA target this machine lacks, with its
    device properties faked (workers/gpuless.py). Needs a CUDA build of torch."""
    gpu_properties_file: str = ""
    """JSON device properties for lower_without_gpu (name, multi_processor_count, ...);
    empty uses the built-in table for the arch."""
    kernel_soft_time_limit_s: int = 60
    """Wall seconds before a Triton kernel compile fails with KERNEL_TIMEOUT."""
    pipeline: str = "staged"
    """"staged": a graph compile is split into stage jobs (lowering, then C++ kernel builds
    spread over every worker of the target, then assembly; workers/jobs/). "whole":
    one job compiles the whole graph on one worker. Staged falls back to whole by itself
    for a compile that must run kernels while it compiles (max-autotune benchmarks)."""
    kernel_batch: int = 0
    """C++ kernels per kernel-build job; 0: as many as the sending worker's process may
    run at once (`pipeline.build_threads`), since a job builds its batch at once on
    those cores. More kernels a job would queue inside it what an idle worker could
    take (one kernel builds in seconds); fewer would leave cores idle and send more
    jobs, each a round trip through the broker."""
    kernel_cache_scope: str = "fleet"
    """"fleet": a C++ kernel built for any tenant's graph is reused by every tenant's
    (workers/board.py). "tenant": each tenant's kernels are cached apart, so no
    tenant's kernel-hit counts reveal what another compiled."""
    warmup: bool = True
    """Run Inductor's once-per-process setup (the vector ISA probe, the build hashes;
    workers/priming.py) when the worker starts, before its pool forks, instead of in
    its first job; and its warm-up compile there, or with a sandbox in each pool
    process's forkserver, where the compiles run."""
    gpu_check: bool = True
    """A worker that lowers graphs for its own GPU registers only after a spawned child
    started a CUDA context there and ran one Triton kernel under the sandbox's limits
    (workers/gpu_probe.py). False registers without that proof (a test hook for machines
    with a stand-in GPU)."""
    kernel_job_delay_s: float = 0.0
    """Test hook: seconds each kernel-build job sleeps before it builds, so a fault test
    can kill a worker in the middle of one. Leave 0 in production."""
    name: str = ""
    """The name it registers under; defaults to host and process id."""
    heartbeat_s: float = 5.0
    """How often the worker renews its registration."""
    worker_ttl_s: int = 15
    """A registration not renewed for this long expires: the worker counts as gone."""
    max_attempts: int = 3
    """Deliveries of one job (a worker lost mid-compile redelivers it) before it fails."""
    failed_ttl_s: int = 60
    """A failed job's record is kept this long; submits meanwhile get the failure at once."""
    done_ttl_s: int = 3600
    """A finished job's record is kept this long; the artifact itself stays in the cache."""
    metrics_port: int = 0
    """Port where the worker's main process serves Prometheus /metrics; 0 turns it off."""
    signing_key_file: str = ""
    """Ed25519 private key (PEM) that signs every manifest (torchfarm/trust/signing.py). Empty:
    artifacts go unsigned, and clients that pin keys refuse them."""
    signing_key_id: str = ""
    """The id clients pin the key under; empty derives it from the public key."""
    record_key_file: str = ""
    """32+ secret bytes that seal the records workers hand each other through Redis
    (torchfarm/trust/seal.py). Empty derives the key from the signing key; with neither, the
    records go unsealed (a development farm only)."""
    signature_ttl_s: int = 30 * 24 * 3600
    """How long a signature stays valid; the coordinator recompiles an expired artifact."""
    max_artifact_bytes: int = 1024 * 1024 * 1024
    """A compile whose artifact (payload and kernels) is larger fails ARTIFACT_TOO_LARGE."""
    compile_cpu_limit_s: int = 0
    """CPU seconds one compile may use in the pool process (RLIMIT_CPU) before the kernel
    kills it; the job is redelivered up to max_attempts. 0: no limit."""
    sandbox: str = "auto"
    """Where tenant-driven compiler runs (C++ kernel builds, whole-graph compiles) happen
    (workers/sandbox/process.py):
    "bwrap" (a bubblewrap child: no network, a read-only system, no secrets; the worker
    will not start without it), "process" (a child with a scrubbed environment and
    rlimits only: degraded), "off" (in the process that holds the keys; development
    only), "auto": bwrap where it runs, else process, with a warning."""
    sandbox_memory_mb: int = 4096
    """Memory limit of each sandboxed process (the child and each compiler it starts);
    past it the build fails COMPILE_ERROR. RLIMIT_AS for the CPU; RLIMIT_DATA for GPU
    kinds, whose runtime reserves address space far beyond what it uses
    (workers/sandbox_limits.py). 0: no limit."""
    sandbox_cpu_s: int = 900
    """RLIMIT_CPU of each sandboxed process. 0: no limit."""
    sandbox_hidden: tuple[str, ...] = ()
    """More files or directories the bwrap child must not see, besides the key files and
    /run/secrets, /var/run/secrets, /etc/torchfarm."""
    sandbox_dir: str = ""
    """Where per-job scratch directories are made; empty: the system's temp dir."""
    sandbox_forkserver: bool = True
    """Sandboxed runs fork from one child per pool process that has imported torch and
    Inductor once (workers/sandbox/process.py's `Forkserver`); False: each run starts Python."""
    sandbox_headers: bool = True
    """The forkserver prebuilds Inductor's precompiled C++ prefix headers for CPU kernels
    once; False: each run that needs one builds it (a GPU target's
    C++ kernels use none)."""
    soft_time_limit_s: int = celeryconf.SOFT_TIME_LIMIT_S
    """Wall seconds before a compile fails with COMPILE_TIMEOUT."""
    hard_time_limit_s: int = celeryconf.HARD_TIME_LIMIT_S
    """Wall seconds before Celery kills a compile that ignored the soft limit."""
    visibility_timeout_s: int = celeryconf.VISIBILITY_TIMEOUT_S
    """Seconds before the broker hands a job taken by a worker that died whole to another."""
    reported_build: str = ""
    """Test hook, never set in production: a JSON object of build fields
    (torchfarm/wire/builds.py) this worker registers, routes on and checks jobs against in
    place of its own, so one machine can play workers of several builds (workers/identity.py)."""
    test_delay_s: float = 0.0
    """Test hook, never set in production: seconds each graph compile sleeps in its
    "compile" stage, so tests can watch a compile in flight (tests/integration/test_nonblocking.py)."""

    def __post_init__(self) -> None:
        if self.pipeline not in ("staged", "whole"):
            raise ValueError(f"TORCHFARM_PIPELINE={self.pipeline!r}: want 'staged' or 'whole'")
        if self.kernel_cache_scope not in ("fleet", "tenant"):
            raise ValueError(
                f"TORCHFARM_KERNEL_CACHE_SCOPE={self.kernel_cache_scope!r}: want 'fleet' or 'tenant'"
            )
        if self.sandbox not in ("auto", "bwrap", "process", "off"):
            raise ValueError(f"TORCHFARM_SANDBOX={self.sandbox!r}: want auto, bwrap, process or off")
        if self.kernel_batch < 0:
            raise ValueError(f"TORCHFARM_KERNEL_BATCH={self.kernel_batch}: want 0 (auto) or more")

    def worker_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"
