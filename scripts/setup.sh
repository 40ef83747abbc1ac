#!/usr/bin/env bash
# Sets up everything the demo, the tests and the benchmarks need, idempotently:
# Debian packages (redis-server, a C++ compiler for Inductor) and .venv with pinned
# dependencies. Run as root on Debian, or where those packages are already present.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v g++ >/dev/null || need+=(g++)
# The workers' compile sandbox (workers/sandbox/process.py); without it the tests run its
# "process" mode only.
command -v bwrap >/dev/null || need+=(bubblewrap)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# WITH_PROMETHEUS=1 (CI sets it): Prometheus' server and promtool, for tests/ops; without
# them those tests skip.
if [ "${WITH_PROMETHEUS:-0}" = 1 ] && ! command -v promtool >/dev/null; then need+=(prometheus); fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing ${need[*]}; install them (apt-get install ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi
