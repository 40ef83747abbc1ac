# A ROCm compile worker (k8s/worker-rocm.yaml gives it one AMD GPU): Inductor and Triton
# build kernels for the GPU the container is given. torch's ROCm wheels carry the ROCm
# runtime; the host's amdgpu driver and /dev/kfd, /dev/dri come from AMD's device plugin.
#   docker build -f docker/worker-rocm.Dockerfile -t torchfarm/worker-rocm .
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm6.4

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

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
# ("rocm.gfx942"; workers/serving.py).
ENV TORCHFARM_TARGETS=rocm \
    TORCHFARM_METRICS_PORT=9101 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/torchfarm-metrics \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor \
    TRITON_CACHE_DIR=/tmp/triton
EXPOSE 9101
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "workers.app", "worker", "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "rocm@%h"]
