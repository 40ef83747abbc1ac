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
# 5. starts a second stack whose worker sees no GPU (CUDA_VISIBLE_DEVICES empty): it builds
#    the same kernel for this GPU's target as a CPU-only worker does; the cubin is loaded
#    with the CUDA driver API, run here, and compared with the kernel compiled here;
# 6. prints a timing table and fails if a number is off or the whole run passed 8 minutes.
#
# The workers start as shipped: Celery's prefork pool, warm-up on, the default sandbox
# ("auto": bwrap where it runs, else "process", degraded). A GPU worker registers only
# after its GPU check ran where its compiles run (workers/gpu_probe.py); its log line is
# printed below.
#
# Nothing here runs on a GPU-less machine; `bash -n scripts/gpu_check.sh` is what CI checks.
# The timed comparison (eager, local cold and warm, PyTorch's remote cache, farm cold and hit,
# max-autotune, compiler counts on a hit) is `make bench-gpu` (bench/gpu_bench.py, docs/gpu.md).
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
import contextlib, json, shutil, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import torch

import sdk
from examples.harness import run_case, table
from torchfarm.fx.fingerprint import local_target
from torchfarm.kernels import elf
from localfarm.stack import LocalStack
from tests.targets.cubin_launch import launch_cubin, load_kernel_module

t_start = time.monotonic()
START_S = 180  # a GPU worker registers after its GPU check: a CUDA context, Triton's launcher, one compile


@contextlib.contextmanager
def stack_of(workdir, env):
    stack = LocalStack(workers=1, workdir=workdir, extra_env=env)
    stack.start(timeout_s=START_S)
    try:
        yield stack
    finally:
        stack.stop()

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
    shipped = {"TORCHFARM_SANDBOX": "auto"}
    with stack_of(work / "stack", {**shipped, "TORCHFARM_TARGETS": "local"}) as stack:
        worker_log = (stack.root / "worker0.log").read_text(errors="replace")
        for line in worker_log.splitlines():
            if "GPU path" in line or "registered:" in line or "DEGRADED" in line:
                print(f"gpu_check: worker: {line.strip()[-300:]}", flush=True)
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
        status = json.dumps({w: [r.get("targets"), r.get("sandbox")] for w, r in stack.store().live_workers().items()})
        print(f"gpu_check: live workers {status}", flush=True)
    # A kernel from a worker without a GPU, run here against the same kernel built here.
    cpu_only = {**shipped, "TORCHFARM_TARGETS": str(target), "CUDA_VISIBLE_DEVICES": ""}
    with stack_of(work / "cpu-only", cpu_only) as stack:
        t0 = time.monotonic()
        served = [r.get("targets") for r in stack.store().live_workers().values()]
        if served != [{str(target): ["kernel"]}]:
            failures.append(f"the GPU-less worker serves {served}, not kernels for {target} only")
        k = sdk.compile_kernel(src, "add_kernel", target=str(target), signature="*fp32,*fp32,*fp32,i32,constexpr",
                               constexprs={"BLOCK": 1024}, remote=stack.address)
        n = 5000
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        from_farm, built_here = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        launch_cubin(k.binary, k.metadata, (n + 1023) // 1024, [x, y, from_farm, n])
        load_kernel_module("add_kernel").add_kernel[((n + 1023) // 1024,)](x, y, built_here, n, BLOCK=1024)
        torch.cuda.synchronize()
        same = torch.equal(from_farm, built_here) and torch.equal(from_farm, x + y)
        rows.append((f"GPU-less worker's {target} cubin, run here", time.monotonic() - t0,
                     f"{elf.inspect_binary(k.binary).arch}, {'matches' if same else 'DIFFERS from'} the kernel built here"))
        if not same:
            failures.append("the GPU-less worker's kernel gives other numbers than the same kernel built here")
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
