# A CPU compile worker: torch (CPU build), a C++ compiler for Inductor's CPU kernels.
#   docker build -f docker/worker-cpu.Dockerfile -t torchfarm/worker-cpu .
# The worker's torch, Python and compiler must match the clients' exactly (it refuses a
# request with another build), so pin TORCH_VERSION to what the clients run.
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY pyproject.toml constraints.txt ./
COPY torchfarm ./torchfarm
COPY services ./services
COPY sdk ./sdk
COPY workers ./workers
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
    && pip install -c /tmp/constraints.txt . \
    && useradd --system --uid 10001 --create-home torchfarm

USER 10001
# Per-process metrics files of Celery's pool; a tmpfs or emptyDir in deployments.
# The worker serves this machine's own CPU target; its queues follow from it
# ("cpu.avx512.b3f9c21": target and build; workers/serving.py).
ENV TORCHFARM_TARGETS=cpu \
    TORCHFARM_METRICS_PORT=9101 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/torchfarm-metrics \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
EXPOSE 9101
# SIGTERM is Celery's warm shutdown: finish the current compile, take no new one. Give
# the container at least the compile hard time limit (600 s) to stop.
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "workers.app", "worker", "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "cpu@%h"]
