# A ROCm compile worker (k8s/worker-rocm.yaml gives it one AMD GPU): Inductor and Triton
# build kernels for the GPU the container is given. torch's ROCm wheels carry the ROCm
# runtime and pin pytorch-triton-rocm (it installs the `triton` module); the host's amdgpu
# driver and /dev/kfd, /dev/dri come from AMD's device plugin.
#   docker build -f docker/worker-rocm.Dockerfile -t torchfarm/worker-rocm .
# The `worker` extra has no Triton of its own and constraints.txt's torch and Triton
# lines are dropped, so pip keeps the Triton this torch wheel was built with.
# `transformers` brings its mixture-of-experts op, which workers serve by default.
FROM python:3.11-slim-bookworm AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm6.4
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/torchfarm
RUN /opt/torchfarm/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# The extras' dependencies from pyproject.toml alone, before any source: this stage (the
# venv the image copies) changes only when they do, not with every commit.
WORKDIR /src
COPY pyproject.toml constraints.txt scripts/extra_requirements.py ./
RUN grep -v -E '^(torch|triton|pytorch-triton-rocm)==' constraints.txt > /tmp/constraints.txt \
    && python extra_requirements.py worker,transformers > /tmp/requirements.txt \
    && /opt/torchfarm/bin/pip install -c /tmp/constraints.txt -r /tmp/requirements.txt

# The project itself, as a wheel (a few hundred KB).
FROM python:3.11-slim-bookworm AS wheel
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY torchfarm ./torchfarm
COPY services ./services
COPY sdk ./sdk
COPY workers ./workers
COPY cli ./cli
COPY localfarm ./localfarm
RUN python -m venv /tmp/pip && /tmp/pip/bin/pip wheel --quiet --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/torchfarm/bin:$PATH
# gcc for Triton's launcher stubs, g++ for Inductor's host code.
# bubblewrap runs each C++ build in a child with no network, no secrets and a
# read-only system (workers/sandbox.py, TORCHFARM_SANDBOX; docs/security.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home torchfarm \
    && install -d -o 10001 -g 10001 /var/cache/torchfarm /var/cache/torchfarm/tmp
COPY --from=build /opt/torchfarm /opt/torchfarm
# No index: every dependency of the extras must already be in the venv, or this fails.
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/torchfarm/bin/pip install --no-index --find-links /tmp/wheels "torchfarm[worker,transformers]" \
    && rm -rf /tmp/wheels

USER 10001
# Kernels are loaded from the Inductor and Triton caches and the temp dir: the
# container's own file system, never a noexec tmpfs.
# The worker serves this machine's own GPU target; its queues follow from it
# ("rocm.gfx942"; workers/serving.py).
ENV TORCHFARM_TARGETS=rocm \
    TORCHFARM_METRICS_PORT=9101 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/torchfarm-metrics \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/torchfarm/inductor \
    TRITON_CACHE_DIR=/var/cache/torchfarm/triton \
    TMPDIR=/var/cache/torchfarm/tmp
EXPOSE 9101
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ['TORCHFARM_METRICS_PORT'], timeout=3)"]
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "workers.app", "worker", "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "rocm@%h"]
