"""The SDK's own Prometheus counters, in the default registry of the user's process.

A training job that already exports metrics (prometheus_client's start_http_server, or
a pushgateway) exports these with them; otherwise they cost nothing. The same events
are logged as warnings. `prometheus_client` comes with `torchfarm[sdk]`; a client
installed without it (torch from its image, `pip install torchfarm`) counts nothing
and compiles as well.
"""

from __future__ import annotations

from typing import Any

from sdk.errors import ArtifactRejected
from torchfarm.wire.codes import Rejection


class _Uncounted:
    """A counter where prometheus_client is not installed: counts nothing."""

    def labels(self, **_: str) -> _Uncounted:
        return self

    def inc(self, amount: float = 1) -> None:
        pass


def _counter(name: str, documentation: str, labels: list[str]) -> Any:
    try:
        from prometheus_client import Counter
    except ModuleNotFoundError:  # the counters are optional; the log lines are not
        return _Uncounted()
    return Counter(name, documentation, labels)


ARTIFACTS_REJECTED = _counter(
    "torchfarm_sdk_artifacts_rejected_total",
    "Artifacts the SDK refused to load, by reason: unsigned, unknown_key, expired, "
    "not_yet_valid, invalid, mismatch, fingerprint, digest, malformed, untrusted_farm, "
    "corrupt (the farm found the blob corrupt), too_large.",
    ["reason"],
)
FALLBACKS = _counter(
    "torchfarm_sdk_fallbacks_total",
    "Graphs the farm could not serve, by error class: compiled locally, or left eager "
    "with wait=False.",
    ["error"],
)
SPLITS = _counter(
    "torchfarm_sdk_graphs_split_total",
    "Graphs split at calls the farm refuses (the calls run eagerly, the pieces between "
    "them compile on the farm), by where the refusal came from: the format or the farm.",
    ["refused_by"],
)


def rejected(reason: Rejection, message: str) -> ArtifactRejected:
    """The refusal of something the farm sent, counted in ARTIFACTS_REJECTED."""
    ARTIFACTS_REJECTED.labels(reason=reason).inc()
    return ArtifactRejected(message, reason)
