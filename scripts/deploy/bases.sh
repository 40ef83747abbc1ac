#!/usr/bin/env bash
# Stand-ins for the base images the Dockerfiles and docker-compose.yml name, built from
# Debian packages where no image registry is reachable (docs/operations.md, "Testing the
# deployment"). Each is tagged with the exact name its FROM or image: line uses, so
# `podman build --pull=never` finds it and users keep the real names. Idempotent: an
# image that exists is kept; the debootstrap'd root file system is cached in CACHE.
set -euo pipefail
CACHE=${TORCHFARM_DEPLOY_CACHE:-/var/cache/torchfarm-deploy}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

have() { podman image exists "$1"; }
log() { echo "bases: $*" >&2; }

tag_all() {  # tag IMAGE with the short name's docker.io and localhost spellings
  local image=$1 name=$2
  podman tag "$image" "docker.io/library/$name" "localhost/$name"
}

if ! have localhost/debian-base:$SUITE; then
  mkdir -p "$CACHE"
  if [ ! -f "$CACHE/rootfs-$SUITE.tar" ]; then
    log "debootstrap $SUITE (about a minute)"
    rm -rf "$CACHE/rootfs"
    debootstrap --variant=minbase "$SUITE" "$CACHE/rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    tar -C "$CACHE/rootfs" -cf "$CACHE/rootfs-$SUITE.tar.tmp" .
    mv "$CACHE/rootfs-$SUITE.tar.tmp" "$CACHE/rootfs-$SUITE.tar"
    rm -rf "$CACHE/rootfs"
  fi
  podman import "$CACHE/rootfs-$SUITE.tar" localhost/debian-base:$SUITE >/dev/null
fi

build_base() {  # NAME, then the Containerfile on stdin
  local name=$1
  if have "docker.io/library/$name" && have "localhost/$name"; then return; fi
  log "building stand-in $name"
  podman build --pull=never --network host -q -t "localhost/$name" -f - "$CACHE" >/dev/null
  tag_all "localhost/$name" "$name"
}

# python:3.11-slim-bookworm: Debian's Python 3.11 where the official image has its own
# (both 3.11; the farm's fingerprint names major.minor), with venv and headers.
build_base python:3.11-slim-bookworm <<'CF'
FROM localhost/debian-base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/bin/python3.11 /usr/local/bin/python \
    && ln -s /usr/bin/python3.11 /usr/local/bin/python3
ENV LANG=C.UTF-8
CMD ["python3"]
CF

# redis:7.4-alpine: Debian's redis-server 7.0 (ACL files as 7.4 reads them).
build_base redis:7.4-alpine <<'CF'
FROM localhost/debian-base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
CMD ["redis-server"]
CF
log "ready: $(podman images --format '{{.Repository}}:{{.Tag}}' | grep -E 'python:3.11-slim|redis:7.4|debian-base' | sort -u | tr '\n' ' ')"
