"""The SDK's own Prometheus counters, in the default registry of the user's process.

A training job that already exports metrics (prometheus_client's start_http_server, or
a pushgateway) exports these with them; otherwise they cost nothing. The same events
are logged as warnings.
"""

from __future__ import annotations

from prometheus_client import Counter

ARTIFACTS_REJECTED = Counter(
    "torchfarm_sdk_artifacts_rejected_total",
    "Artifacts the SDK refused to load, by reason: unsigned, unknown_key, expired, "
    "not_yet_valid, invalid, mismatch, fingerprint, digest, malformed, untrusted_farm, "
    "corrupt (the farm found the blob corrupt), too_large.",
    ["reason"],
)
FALLBACKS = Counter(
    "torchfarm_sdk_fallbacks_total",
    "Graphs the farm could not serve, by error class: compiled locally, or left eager "
    "with wait=False.",
    ["error"],
)
