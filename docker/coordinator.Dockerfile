# The coordinator: gRPC, Redis and Celery clients, no torch (it never imports torch, so
# the image installs torchfarm without its dependencies and adds only what it needs).
#   docker build -f docker/coordinator.Dockerfile -t torchfarm/coordinator .
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml constraints.txt ./
RUN pip install -c constraints.txt \
        grpcio grpcio-health-checking protobuf redis "celery[redis]" prometheus-client
COPY torchfarm ./torchfarm
COPY services ./services
COPY sdk ./sdk
COPY workers ./workers
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --no-create-home torchfarm

USER 10001
ENV TORCHFARM_LISTEN=0.0.0.0:50051 \
    TORCHFARM_METRICS_PORT=9100
EXPOSE 50051 9100
# SIGTERM: health turns NOT_SERVING, then in-flight calls get TORCHFARM_GRACE_S.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "services.coordinator.server"]
