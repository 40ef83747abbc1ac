# A CPU compile worker: torch (CPU build), a C++ compiler for Inductor's CPU kernels.
#   docker build -f docker/worker-cpu.Dockerfile -t torchfarm/worker-cpu .
# The worker's torch, Triton, Python and compiler must match the clients' exactly (it
# refuses a request with another build: BUILD_MISMATCH, docs/operations.md), so pin
# TORCH_VERSION to what the clients run, and give clients the same extras
# (`pip install 'torchfarm[sdk,kernels]'` next to a CPU build of torch).
# Builds behind a wheel mirror: --build-arg TORCH_INDEX_URL=... PIP_FIND_LINKS=...
# `kernels` adds Triton from PyPI: the CPU wheel of torch has none, and the worker's
# fingerprint names the Triton version, so it and the clients must agree on having it.
# `transformers`: its mixture-of-experts op, which workers serve by default (Qwen3-MoE,
# gpt-oss, Jamba, Mixtral; docs/operations.md).
ARG EXTRAS=worker,kernels,transformers
FROM python:3.11-slim-bookworm AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
ARG EXTRAS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/torchfarm
RUN /opt/torchfarm/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# The extras' dependencies from pyproject.toml alone, before any source: this stage (the
# venv the image copies) changes only when they do, not with every commit.
WORKDIR /src
COPY pyproject.toml constraints.txt scripts/extra_requirements.py ./
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
    && python extra_requirements.py "${EXTRAS}" > /tmp/requirements.txt \
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
# g++ compiles Inductor's C++ kernels at run time (it is part of the fingerprint).
# bubblewrap runs each C++ build in a child with no network, no secrets and a
# read-only system (workers/sandbox.py, TORCHFARM_SANDBOX; docs/security.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home torchfarm \
    && install -d -o 10001 -g 10001 /var/cache/torchfarm /var/cache/torchfarm/tmp
COPY --from=build /opt/torchfarm /opt/torchfarm
# No index: every dependency of the extras must already be in the venv, or this fails.
ARG EXTRAS
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/torchfarm/bin/pip install --no-index --find-links /tmp/wheels "torchfarm[${EXTRAS}]" \
    && rm -rf /tmp/wheels

USER 10001
# Compiled kernels are loaded (dlopen) from the Inductor cache and temp dirs, so they
# live on the container's own file system, never a noexec tmpfs such as compose's /tmp.
# The worker serves this machine's own CPU target; its queues follow from it
# ("cpu.avx512.b3f9c21": target and build; workers/serving.py).
ENV TORCHFARM_TARGETS=cpu \
    TORCHFARM_METRICS_PORT=9101 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/torchfarm-metrics \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/torchfarm/inductor \
    TRITON_CACHE_DIR=/var/cache/torchfarm/triton \
    TMPDIR=/var/cache/torchfarm/tmp
EXPOSE 9101
# The main process serves /metrics once the worker has started.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ['TORCHFARM_METRICS_PORT'], timeout=3)"]
# SIGTERM is Celery's warm shutdown: finish the current compile, take no new one. Give
# the container at least the compile hard time limit (600 s) to stop.
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "workers.app", "worker", "--concurrency", "1", "--pool", "prefork", "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "cpu@%h"]
