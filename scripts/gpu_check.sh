#!/usr/bin/env bash
# The CUDA path end to end, on a machine with an NVIDIA GPU and a CUDA build of PyTorch.
#
#   scripts/gpu_check.sh            (PYTHON=... to use another interpreter; default .venv)
#
# 1. checks the GPU, torch's CUDA build, Triton and redis-server;
# 2. starts a local stack (redis-server, coordinator, one worker serving this GPU's
#    exact target, "local" → e.g. cuda:sm_90: graphs and Triton kernels);
# 3. trains the GPT example (examples/train_gpt.py --device cuda) in fresh processes:
#    local torch.compile cold, through the farm cold (a miss: the worker lowers with
#    Inductor's Triton backend), and through the farm again from an empty client cache
#    dir (a hit: the cubins travel inside the artifact); each compared with eager;
# 4. compiles one Triton kernel for this GPU through CompileKernel and checks its ELF arch;
# 5. prints a timing table and fails if a number is off or the whole run passed 8 minutes.
#
# Nothing here runs on a GPU-less machine; `bash -n scripts/gpu_check.sh` is what CI checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"   # under 8 minutes, with room to stop the stack

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader \
  || echo "gpu_check: nvidia-smi not found; relying on torch.cuda" >&2
command -v redis-server >/dev/null || { echo "gpu_check: redis-server is missing (apt-get install redis-server)" >&2; exit 2; }
"$PY" - <<'EOF' || exit 2
import sys, torch
if not (torch.version.cuda and torch.cuda.is_available()):
    sys.exit(f"gpu_check: needs a CUDA build of torch and a GPU; torch {torch.__version__}, "
             f"cuda={torch.version.cuda}, available={torch.cuda.is_available()}")
import triton  # noqa: F401  (Inductor's GPU backend)
print(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{torch.cuda.get_device_name(0)}, capability {torch.cuda.get_device_capability(0)}")
EOF

export PYTHONUNBUFFERED=1
exec timeout --kill-after=20 "$BUDGET_S" "$PY" - <<'EOF'
import json, shutil, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import torch

import sdk
from examples.harness import run_case, table
from torchfarm.fx.fingerprint import local_target
from torchfarm import elf
from torchfarm.testing.stack import LocalStack

t_start = time.monotonic()
target = local_target("cuda")
print(f"gpu_check: this GPU is {target}", flush=True)
work = Path(tempfile.mkdtemp(prefix="torchfarm-gpu-check-"))
rows, failures = [], []


def case(name, backend, cache, remote="", env=None):
    t0 = time.monotonic()
    r = run_case("gpt", backend, cache, remote=remote, steps=3, check=True, env=env, device="cuda")
    farm = next((l for l in r["log"] if "torchfarm: graph" in l), "")
    outcome = next((w for w in ("hit", "miss", "joined") if f": {w} key=" in farm), "")
    note = f"loss err {r['loss_abs_err']:.1e}, grad err {r['grad_max_abs_err']:.1e}"
    note += f", later step {r['later_step_s'] * 1000:.1f} ms" + (f", farm {outcome}" if outcome else "")
    rows.append((name, r["first_step_s"], note))
    print(f"gpu_check: {name}: {r['first_step_s']:.2f}s ({note}) [{time.monotonic() - t_start:.0f}s]", flush=True)
    # float32 on the GPU; Inductor reorders reductions, so not bit-equal to eager.
    if r["loss_abs_err"] > 1e-3 or r["grad_max_abs_err"] > 1e-2:
        failures.append(f"{name}: differs from eager ({note})")
    return r, outcome


try:
    case("local torch.compile, cold", "local", work / "local")
    with LocalStack(workers=1, workdir=work / "stack", extra_env={"TORCHFARM_TARGETS": "local"}) as stack:
        trusted = {"TORCHFARM_TRUSTED_KEYS_FILE": str(getattr(stack, "trusted_keys_file", ""))}
        _, cold = case("farm, cold (worker compiles)", "farm", work / "client-cold", stack.address, trusted)
        _, hit = case("farm, hit, empty client cache", "farm", work / "client-hit", stack.address, trusted)
        if cold != "miss" or hit != "hit":
            failures.append(f"expected a miss then a hit, got {cold!r} then {hit!r}")
        t0 = time.monotonic()
        src = Path("tests/targets/kernels/add_kernel.py").read_text()
        k = sdk.compile_kernel(src, "add_kernel", target=str(target), signature="*fp32,*fp32,*fp32,i32,constexpr",
                               constexprs={"BLOCK": 1024}, remote=stack.address)
        info = elf.inspect_binary(k.binary)
        rows.append((f"CompileKernel {target}", time.monotonic() - t0, f"{k.kind} {info.arch}, {len(k.binary)} bytes"))
        status = json.dumps({w: r.get("targets") for w, r in stack.store().live_workers().items()})
        print(f"gpu_check: live workers {status}", flush=True)
finally:
    shutil.rmtree(work, ignore_errors=True)

total = time.monotonic() - t_start
print()
print(f"torchfarm GPU check on {torch.cuda.get_device_name(0)} ({target}), torch {torch.__version__}")
print(table(rows))
print(f"total {total:.0f}s")
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("gpu_check: OK")
EOF
