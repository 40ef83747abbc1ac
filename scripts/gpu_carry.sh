#!/usr/bin/env bash
# Prepares, on a machine with network, what a lent GPU machine without one needs to run
# the farm's GPU checks, and the one script to run there (docs/gpu.md, "On a lent GPU
# machine"). That machine has torch 2.11 with Triton 3.6 on Python 3.12, grpcio,
# protobuf and prometheus-client; no redis-server, no network.
#
#   scripts/gpu_carry.sh                 # makes .gpu-carry/ (git-ignored, about 25 MB)
#   .gpu-carry/run.sh                    # there, from the repository root
#   .gpu-carry/run.sh --rehearse         # here: the same set-up, a CPU farm compile
#
# .gpu-carry/carry.tgz (unpacked by run.sh) holds site/, the farm's Python dependencies for
# CPython 3.12 on x86-64 Linux (wheels from PyPI at constraints.txt's versions, installed
# with pip's --target), and bin/redis-server, this machine's redis-server with the shared
# libraries `ldd` lists for it (glibc's own left out: the host's loader must load its
# own), behind a wrapper that sets LD_LIBRARY_PATH for that binary only. Packed, it stays
# well under what the device tool carries (64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.gpu-carry}"
PY="${PYTHON:-.venv/bin/python}"

rm -rf "$OUT"
mkdir -p "$OUT"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"

# What the GPU machine lacks, and what it has at versions the farm may not take
# (grpcio, protobuf: the generated code needs protobuf 6.31 or newer).
"$PY" -m pip install -q --no-compile --target "$STAGE/site" -c constraints.txt \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --only-binary=:all: \
  "redis" "celery[redis]" "cryptography" "rich" "grpcio" "grpcio-health-checking" "protobuf" \
  "prometheus-client" "pytest" "pytest-timeout"

real="$(command -v redis-server)" || { echo "gpu_carry: no redis-server here (apt-get install redis-server)" >&2; exit 2; }
cp "$real" "$STAGE/bin/redis-server.real"
ldd "$real" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;  # glibc: the host's
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
cat > "$STAGE/bin/redis-server" <<'EOF'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"  # through the links that name it
LD_LIBRARY_PATH="$here/../lib" exec "$here/redis-server.real" "$@"
EOF
chmod +x "$STAGE/bin/redis-server"
tar czf "$OUT/carry.tgz" -C "$STAGE" site bin lib
cp scripts/gpu_run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh"
echo "gpu_carry: $(du -sh "$OUT" | cut -f1) in $OUT; run $OUT/run.sh from the repository root there" >&2
