"""Prometheus metrics of the coordinator. Label values stay few: never a key or job id."""

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "torchfarm_requests_total",
    "Compile submissions by outcome: hit, miss, deduplicated, failed, invalid.",
    ["outcome"],
)
ARTIFACT_BYTES = Histogram(
    "torchfarm_artifact_bytes",
    "Size of artifacts streamed to clients.",
    buckets=[2**i for i in range(12, 31, 2)],
)
RPC_ERRORS = Counter(
    "torchfarm_rpc_errors_total", "gRPC calls that ended in an error, by status code.", ["code"]
)
