#!/usr/bin/env bash
# Podman, buildah, podman-compose, runc and debootstrap, set up as this kind of machine
# needs (no Docker engine; crun fails on hybrid cgroups; a container may not raise a
# ulimit). Idempotent; needs root.
set -euo pipefail
need=()
for cmd in podman buildah podman-compose runc debootstrap; do
  command -v "$cmd" >/dev/null || need+=("$cmd")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah podman-compose runc debootstrap >/dev/null
fi
conf=/etc/containers/containers.conf
want='[containers]
default_ulimits = ["nofile=10000:10000", "nproc=10000:10000"]
[engine]
runtime = "runc"'
if [ ! -f "$conf" ] || ! grep -q 'runtime = "runc"' "$conf"; then
  if [ -f "$conf" ] && [ -s "$conf" ]; then
    echo "setup: $conf exists without runtime = \"runc\"; leaving it, pass --runtime runc yourself" >&2
  else
    mkdir -p /etc/containers
    printf '%s\n' "$want" > "$conf"
  fi
fi
