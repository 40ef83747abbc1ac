# The coordinator: gRPC, Redis and Celery clients, no torch. It installs the project's
# `coordinator` extra (pyproject.toml), the one list of what it imports, so the image
# cannot drift from the code. Also the image of compose's one-shot `init` service
# (python -m torchfarm.trust.provision: signing key, token, TLS certificates, Redis ACLs).
#   docker build -f docker/coordinator.Dockerfile -t torchfarm/coordinator .
# Builds behind a wheel mirror or a TLS-inspecting proxy: --build-arg PIP_INDEX_URL=... (and
# PIP_FIND_LINKS, PIP_CERT,
# PIP_EXTRA_INDEX_URL); build arguments stay in the build stage.
FROM python:3.11-slim-bookworm AS build

ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/torchfarm
# The extras' dependencies from pyproject.toml alone, before any source: this stage (the
# venv the image copies) changes only when they do, not with every commit.
WORKDIR /src
COPY pyproject.toml constraints.txt scripts/extra_requirements.py ./
# constraints.txt pins every version the tests ran with.
RUN python extra_requirements.py coordinator > /tmp/requirements.txt \
    && /opt/torchfarm/bin/pip install -c constraints.txt -r /tmp/requirements.txt

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
RUN useradd --system --uid 10001 --no-create-home torchfarm
COPY --from=build /opt/torchfarm /opt/torchfarm
# No index: every dependency of the extras must already be in the venv, or this fails.
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/torchfarm/bin/pip install --no-index --find-links /tmp/wheels "torchfarm[coordinator]" \
    && rm -rf /tmp/wheels

USER 10001
ENV TORCHFARM_LISTEN=0.0.0.0:50051 \
    TORCHFARM_METRICS_PORT=9100
EXPOSE 50051 9100
# /metrics answers once the server is up; with TLS on the gRPC port this needs no certificate.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ['TORCHFARM_METRICS_PORT'], timeout=3)"]
# SIGTERM: health turns NOT_SERVING, then in-flight calls get TORCHFARM_GRACE_S.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "services.coordinator.server"]
