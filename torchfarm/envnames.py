"""Every `TORCHFARM_*` variable some torchfarm process, tool or test reads.

The settings objects (torchfarm/settings.py) read only their own fields, so a misspelt
variable (`TORCHFARM_FALLBAK=error`) would change nothing, silently. `from_env` warns of
each `TORCHFARM_*` name in the environment that is not here, naming the closest known
one. One process's environment may carry another's names (`torchfarm up`, a compose
file, the tests), so the list holds them all: every settings object's fields, and the
variables read directly (provisioning, the sandbox, deployment scripts, tests).
`tests/unit/test_envnames.py` checks it against the settings objects and every name in
the repository; a new setting or variable is added here.

A string setting's `<NAME>_FILE` (a secret read from a file) is known with its name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

PREFIX = "TORCHFARM_"
"""Every torchfarm environment variable starts with this."""

KNOWN = frozenset(PREFIX + n for n in (
    "AUTH_FAILURE_BURST", "AUTH_FAILURE_PER_S", "BENCH_COUNTS", "BLOB_CACHE_BYTES", "BLOB_CACHE_DIR",
    "BLOB_MAX_AGE", "BLOB_MAX_BYTES", "BLOB_URL", "BROKER_URL", "CACHE_FILL_LIMIT", "CACHE_MEMORY",
    "CACHE_URL",
    "CHUNK_BYTES", "COMPILE_CPU_LIMIT_S", "COMPILE_TIMEOUT_S", "CONNECT_TIMEOUT_S", "CUDA_PYTHON",
    "DEPLOY_CACHE", "DEPLOY_KEEP", "DEPLOY_MODEL", "DEPLOY_PROJECT", "DIRECT_DOWNLOADS",
    "DIRECT_URL_TTL_S", "DONE_TTL_S", "EXPLAIN_MISSES_PER_MINUTE", "FAILED_TTL_S", "FALLBACK", "FETCH_TIMEOUT_S",
    "GPU_CHECK", "GPU_PROPERTIES_FILE", "GRACE_S", "HARD_TIME_LIMIT_S", "HEALTH_CHECK_S", "HEALTH_PORT",
    "HEARTBEAT_S", "HOSTS",
    "INSTALLED_OP_MODULES", "JOB_TTL_S", "KERNEL_BATCH", "KERNEL_CACHE_SCOPE", "KERNEL_JOB_DELAY_S",
    "KERNEL_SOFT_TIME_LIMIT_S", "KERNEL_TIMEOUT_S", "KNOWN_TARGETS", "KNOWN_TARGET_WINDOW_S",
    "LISTEN", "LOWER_WITHOUT_GPU", "MAX_ARTIFACT_BYTES", "MAX_ATTEMPTS", "MAX_CONCURRENT_RPCS",
    "MAX_FETCHES_PER_TENANT", "MAX_JOBS_PER_TENANT", "MAX_LISTINGS_PER_TENANT",
    "MAX_MESSAGE_BYTES", "MAX_NODES", "MAX_RANK", "MAX_REQUEST_BYTES", "MAX_RESUBMITS",
    "MAX_STORED_BYTES_PER_TENANT",
    "MAX_WATCHES_PER_TENANT", "METRICS_PORT", "NAME", "PIPELINE", "PLANTED_URL", "POLL_INTERVAL_S",
    "PRECOMPILED_TTL_S", "PRECOMPILE_KEY_FILE", "PRECOMPILE_TRUSTED_KEYS", "PROGRESS_AFTER_S", "PROGRESS_EVERY_S",
    "PROVISION_BROKER", "PROVISION_CACHE", "PROVISION_HOSTS", "PROVISION_STATE", "PROVISION_TENANT",
    "QUEUES", "RECONNECT_TIMEOUT_S", "RECORD_KEY_FILE", "REDIS_PREFIX", "REMOTE", "REPORTED_BUILD",
    "RPC_TIMEOUT_S", "SANDBOX", "SANDBOX_CPU_S", "SANDBOX_DIR", "SANDBOX_FORKSERVER",
    "SANDBOX_HEADERS", "SANDBOX_HIDDEN", "SANDBOX_MEMORY_MB", "SECOND_BUILD_INDEX",
    "SECOND_BUILD_TORCH", "SECOND_BUILD_VENV", "SIGNATURE_TTL_S", "SIGNING_KEY_FILE",
    "SIGNING_KEY_ID", "SOFT_TIME_LIMIT_S", "SPLIT_REFUSED", "STACK_INDUCTOR_SEED", "STALE_JOB_S", "STATE_URL",
    "TARGETS", "TENANT", "TEST_DELAY_S", "TEST_FAKE_CUDA", "TEST_INDUCTOR_BASE", "TEST_NO_REFERENCE", "TEST_VENVS",
    "TLS_CA_FILE", "TLS_CERT_FILE", "TLS_CLIENT_CA_FILE", "TLS_KEY_FILE", "TOKEN", "TOKENS_CHECK_S",
    "TOKENS_FILE", "TOOLCHAIN_CACHE_DIR", "TRUSTED_KEYS", "TRUSTED_PROXIES", "TRUST_UNSIGNED", "UPLOAD_BYTES_PER_MINUTE", "VISIBILITY_TIMEOUT_S",
    "WAKE_TIMEOUT_S", "WARMUP", "WARM_REPORT", "WARM_STEPS", "WATCH_POLL_S", "WORKER_TTL_S",
))
"""The known names, prefix included."""


def is_known(name: str) -> bool:
    """Whether `name` (a `TORCHFARM_*` variable) is one torchfarm reads."""
    return name in KNOWN or (name.endswith("_FILE") and name.removesuffix("_FILE") in KNOWN)


def unknown(env: Iterable[str]) -> list[str]:
    """The `TORCHFARM_*` names among `env`'s that torchfarm does not read, sorted."""
    return sorted(n for n in env if n.startswith(PREFIX) and not is_known(n))


def closest(name: str) -> str | None:
    """The known name `name` most likely misspells, or None when none is close."""
    found = difflib.get_close_matches(name, sorted(KNOWN), n=1, cutoff=0.8)
    return found[0] if found else None
