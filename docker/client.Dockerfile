# A training client, as a machine other than the farm's would have it: its own user,
# home and virtualenv, the project installed with the `sdk` and `kernels` extras (as a
# CPU training host installs it; the CPU workers' fingerprint names the same Triton),
# and the examples to train with. `make test-deploy` trains the GPT example with it
# through the compose farm (tests/deploy/client_check.py).
#   docker build -f docker/client.Dockerfile -t torchfarm/client .
#   docker run --rm -v ./client-secrets:/home/trainer/.torchfarm:ro \
#     -e TORCHFARM_REMOTE=grpc://farm.example.com:50051 torchfarm/client \
#     python examples/train_gpt.py
FROM python:3.11-slim-bookworm AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG PIP_CERT=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /home/trainer/venv
RUN /home/trainer/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# The extras' dependencies from pyproject.toml alone, before any source: this stage (the
# venv the image copies) changes only when they do, not with every commit.
WORKDIR /src
COPY pyproject.toml constraints.txt scripts/extra_requirements.py ./
RUN grep -v '^torch==' constraints.txt > /tmp/constraints.txt \
    && python extra_requirements.py sdk,kernels > /tmp/requirements.txt \
    && /home/trainer/venv/bin/pip install -c /tmp/constraints.txt -r /tmp/requirements.txt

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

# g++: the fingerprint names the compiler, and a local fallback compile needs one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 20001 --create-home trainer
COPY --from=build --chown=20001:20001 /home/trainer/venv /home/trainer/venv
# No index: every dependency of the extras must already be in the venv, or this fails.
COPY --from=wheel /wheels /tmp/wheels
RUN /home/trainer/venv/bin/pip install --no-index --find-links /tmp/wheels "torchfarm[sdk,kernels]" \
    && rm -rf /tmp/wheels
COPY --chown=20001:20001 examples /home/trainer/work/examples
COPY --chown=20001:20001 tests/deploy/client_check.py /home/trainer/work/client_check.py

USER 20001
WORKDIR /home/trainer/work
# Where docs/operations.md tells a client to put the files from the farm's init.
ENV PATH=/home/trainer/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TORCHFARM_TLS_CA_FILE=/home/trainer/.torchfarm/ca.crt \
    TORCHFARM_TRUSTED_KEYS_FILE=/home/trainer/.torchfarm/trusted-keys.json \
    TORCHFARM_TOKEN_FILE=/home/trainer/.torchfarm/token
HEALTHCHECK NONE
CMD ["python", "examples/train_gpt.py"]
