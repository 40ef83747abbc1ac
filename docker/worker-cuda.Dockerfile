# A CUDA compile worker: Inductor and Triton build kernels for the GPU the container is
# given (docker-compose.yml reserves one; on Kubernetes, nvidia.com/gpu: 1). torch's CUDA
# wheels carry the CUDA runtime and Triton carries ptxas; the host's NVIDIA container
# toolkit mounts the driver.
#   docker build -f docker/worker-cuda.Dockerfile -t torchfarm/worker-cuda .
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# gcc for Triton's launcher stubs, g++ for Inductor's host code.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY pyproject.toml constraints.txt ./
COPY torchfarm ./torchfarm
COPY services ./services
COPY sdk ./sdk
COPY workers ./workers
RUN grep -v -E '^(torch|triton)==' constraints.txt > /tmp/constraints.txt \
    && pip install -c /tmp/constraints.txt . \
    && useradd --system --uid 10001 --create-home torchfarm

USER 10001
# The worker serves this machine's own GPU target; its queues follow from it
# ("cuda.sm_90"; workers/serving.py).
ENV TORCHFARM_TARGETS=cuda \
    TORCHFARM_METRICS_PORT=9101 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/torchfarm-metrics \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor \
    TRITON_CACHE_DIR=/tmp/triton
EXPOSE 9101
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "workers.app", "worker", "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "cuda@%h"]
