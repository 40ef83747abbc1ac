#!/usr/bin/env bash
# The GPU checks on a lent GPU machine, in one run that fits one device command (under
# 10 minutes): copied to .gpu-carry/run.sh by scripts/gpu_carry.sh, which also carries
# what it needs. From the repository root:
#
#   .gpu-carry/run.sh [bench] [tests] [check]   # default: all three, in this order
#   .gpu-carry/run.sh --rehearse                # a CPU machine: the set-up and one farm compile
#
# bench: `bench/gpu_bench.py --models gpt --profile` (the issue's GPT: every case, the
#        targets, where a hit's time goes, compiler and benchmark counts);
# tests: the GPU tests (tests/targets/test_gpu.py, test_gpu_features.py);
# check: scripts/gpu_check.sh (training, CompileKernel, a GPU-less worker's cubin).
# Each step has its own time limit; what each printed, and the bench's JSON, go to $OUT
# (the device tool's output folder) or ./gpu-results.
set -uo pipefail
carried="$(cd "$(dirname "$0")" && pwd)/carry.tgz"
here="${TMPDIR:-/tmp}/torchfarm-carry"
[ -x "$here/bin/redis-server" ] || { mkdir -p "$here" && tar xzf "$carried" -C "$here"; } || exit 2
export PYTHONPATH="$PWD:$here/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$here/bin:$PATH" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
RESULTS="${OUT:-$PWD/gpu-results}"
mkdir -p "$RESULTS"

step() {  # step NAME SECONDS COMMAND...: runs it under a limit, its output kept and shown
  local name="$1" limit="$2"
  shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=15 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$RESULTS/$name.log"
  echo "== $name: exit $rc in $((SECONDS - t0))s"
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
"$PY" -c 'import sys, torch, triton, grpc, google.protobuf, celery, redis, cryptography
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "cuda", torch.cuda.is_available(), "grpc", grpc.__version__, "protobuf", google.protobuf.__version__)' || exit 2
redis-server --version || exit 2

if [ "${1:-}" = "--rehearse" ]; then
  step rehearse 600 "$PY" bench/gpu_bench.py --device cpu --models mlp --gpt "" --batch 0 \
    --redis-server "$here/bin/redis-server" --out "$RESULTS/gpu_bench.json"
  exit 0
fi

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(bench tests check)
for one in "${steps[@]}"; do
  case "$one" in
    bench) step bench 300 "$PY" bench/gpu_bench.py --models gpt --profile \
             --redis-server "$here/bin/redis-server" --out "$RESULTS/gpu_bench.json" ;;
    tests) step tests 180 "$PY" -m pytest -q -p no:cacheprovider -rs \
             tests/targets/test_gpu.py tests/targets/test_gpu_features.py ;;
    check) step check 170 env GPU_CHECK_BUDGET_S=150 PYTHON="$PY" scripts/gpu_check.sh ;;
    *) echo "unknown step $one (bench, tests, check)" >&2; exit 2 ;;
  esac
done
