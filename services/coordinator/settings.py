"""The coordinator's settings, read once from TORCHFARM_* variables at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from torchfarm import celeryconf


@dataclass(frozen=True)
class CoordinatorSettings:
    listen: str = "127.0.0.1:50051"
    """host:port the gRPC server binds."""
    broker_url: str = "redis://127.0.0.1:6379/0"
    """Celery's broker. A broker must never evict; keep it apart from the cache."""
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
    max_message_bytes: int = 64 * 1024 * 1024
    """gRPC send limit (artifact chunks, kernel replies), and a cap on the receive limit,
    which is max_request_bytes plus a margin (services/coordinator/server.py)."""
    max_request_bytes: int = 16 * 1024 * 1024
    """Largest request accepted (a Submit, a precompiled upload, a kernel), in serialized
    bytes; grpc refuses a message well over it while reading it, before it is parsed."""
    max_concurrent_rpcs: int = 4096
    """Calls, streams included, the server handles at once, all tenants together; past it
    grpc answers RESOURCE_EXHAUSTED. 0: no limit."""
    chunk_bytes: int = 1024 * 1024
    """Size of each artifact chunk streamed to clients."""
    direct_url_ttl_s: int = 300
    """How long the pre-signed blob URLs of a direct fetch stay valid."""
    job_ttl_s: int = 2 * celeryconf.VISIBILITY_TIMEOUT_S
    """How long a queued or running job record lives without finishing; its request
    (what the workers read) expires with it."""
    stale_job_s: float = celeryconf.VISIBILITY_TIMEOUT_S + 60
    """A queued or running job not updated for this long is requeued on the next submit."""
    poll_interval_s: float = 0.1
    """How often Watch reads a job's record when no job events are wired (unit tests'
    fakes); the server wires them (services/coordinator/jobevents.py)."""
    watch_poll_s: float = 2.0
    """With job events, Watch and CompileKernel's wait also read the record this often:
    the safety net for changes no one announced (kernel counts) or a lost message."""
    max_watches_per_tenant: int = 128
    """Watch streams and waiting CompileKernel calls one tenant may hold open at once on
    one coordinator process (RESOURCE_EXHAUSTED, reason WATCH_LIMIT, past it); 0 turns the
    cap off."""
    max_fetches_per_tenant: int = 32
    """FetchArtifact streams one tenant may hold open at once on one coordinator process
    (RESOURCE_EXHAUSTED, reason FETCH_LIMIT, past it; the SDK waits and fetches again); each
    stalled stream holds a few chunks in memory. 0 turns the cap off."""
    max_listings_per_tenant: int = 2
    """ListArtifacts and EvictArtifacts calls one tenant may run at once on one coordinator
    process (RESOURCE_EXHAUSTED, reason LISTING_LIMIT, past it): each reads and parses
    every manifest of the namespace. 0 turns the cap off."""
    grace_s: float = 10.0
    """On SIGTERM, in-flight calls get this long to finish."""
    metrics_port: int = 0
    """Port for Prometheus /metrics; 0 turns the endpoint off."""
    health_port: int = 0
    """Port of a plaintext gRPC server with only the health service, for probes that
    cannot speak TLS (Kubernetes' native gRPC probes); 0: none."""
    health_check_s: float = 5.0
    """How often readiness pings the state, cache and broker Redis: the health status is
    NOT_SERVING while one is unreachable (services/coordinator/readiness.py)."""
    max_nodes: int = 50_000
    """Largest graph, in nodes, the coordinator accepts."""
    max_rank: int = 16
    """Most dimensions of any input or constant tensor the coordinator accepts."""
    max_jobs_per_tenant: int = 64
    """Compiles one tenant may have queued or running at once (RESOURCE_EXHAUSTED past
    it); 0 turns the quota off. Cache hits and joins of running jobs never count."""
    max_stored_bytes_per_tenant: int = 1024 * 1024 * 1024
    """Bytes of artifacts and precompiled packages one namespace may keep in the cache
    (manifests and the blobs they name, counted in the state Redis: torchfarm/storage/usage.py).
    Past it, the namespace's own oldest entries are evicted: at an upload, before it is
    stored, and at a compile's submit for what its finished compiles stored. An upload
    larger than this is refused (RESOURCE_EXHAUSTED, STORAGE_QUOTA). 0 turns it off."""
    upload_bytes_per_minute: int = 256 * 1024 * 1024
    """Bytes of precompiled packages one namespace may upload per minute (RESOURCE_EXHAUSTED,
    UPLOAD_RATE, past it); 0 turns the limit off."""
    explain_misses_per_minute: int = 120
    """ExplainPrecompiledMiss calls one tenant may make at once, and then per minute, on
    one coordinator process (RESOURCE_EXHAUSTED, EXPLAIN_RATE, past it); 0 turns the
    limit off."""
    precompiled_ttl_s: int = 7 * 24 * 3600
    """How long a precompiled package stays in the cache after its upload; the client
    uploads it again after a miss. 0: until it is evicted."""
    cache_fill_limit: float = 0.9
    """An upload is stored only if the cache Redis's used memory stays under this share
    of its `maxmemory` (after the uploader's own oldest packages are evicted to make
    room, where they can), so an upload never makes Redis evict another tenant's
    entries. Ignored where the cache Redis has no maxmemory."""
    tokens_file: str = ""
    """JSON table of token SHA-256 → tenant (torchfarm/trust/tokens.py). Empty: the farm is
    open, every caller shares the unnamed namespace, and the log says so at start.
    Reloaded when it changes, so revoking a token needs no restart."""
    tokens_check_s: float = 1.0
    """How often the tokens file is checked for a change (the longest a revoked token
    still works)."""
    auth_failure_burst: int = 30
    """Failed authentications one client address, and calls naming one tenant, may make
    at once before calls that fail to authenticate from it (or in its name) are answered
    RESOURCE_EXHAUSTED (AUTH_THROTTLED) until its bucket refills. A call whose token
    verifies is never throttled."""
    auth_failure_per_s: float = 0.5
    """How fast a bucket of failed attempts refills."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses or CIDRs ("10.0.0.0/8") of the proxies in front of the coordinator whose
    `x-forwarded-for` names the client (services/coordinator/proxies.py). Empty: the
    header is ignored and the peer's address is the client's."""
    tls_cert_file: str = ""
    """PEM certificate chain for TLS; with tls_key_file, the port serves TLS only."""
    tls_key_file: str = ""
    """PEM private key of tls_cert_file."""
    tls_client_ca_file: str = ""
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    known_targets: tuple[str, ...] = ()
    """Targets ("cuda:sm_90", "cpu:avx512") whose graph jobs are queued even while no
    live worker serves them, so that the queued job itself wakes a pool scaled to zero
    (KEDA, k8s/keda.yaml): of the builds the pool runs, or the one an entry names
    ("cuda:sm_90@b3f9c21"; services/coordinator/farm.py `known_queues`). Any other
    target and build counts as known for known_target_window_s after a worker last
    served it; one neither names is UNAVAILABLE (NO_WORKER, BUILD_NOT_SERVED)."""
    known_target_window_s: int = 1800
    """How long after its last worker went away a target's jobs are still queued (the
    pool scaled down, or restarts); 0: only known_targets."""
    trusted_keys_file: str = ""
    """Worker public keys (torchfarm/trust/signing.py). When set, a cached artifact whose
    signature fails against them is treated as a miss and compiled again, so retiring a
    signing key recompiles what it signed on demand. Expired signatures are misses always."""
