#!/usr/bin/env bash
# Regenerates the committed Python code for proto/ into torchfarm/v1/.
# `make proto-check` runs this and fails if the result differs from what is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
"$python" -m grpc_tools.protoc -Iproto \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  proto/torchfarm/v1/graph.proto proto/torchfarm/v1/farm.proto
touch torchfarm/v1/__init__.py
