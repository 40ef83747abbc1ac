"""`make bench-sandbox`: what the compile sandbox (workers/sandbox/process.py) costs a cold compile.

One small model (the MLP example, forward and backward), compiled through a local stack
of one worker whose caches are empty, with TORCHFARM_SANDBOX=off (C++ builds in the pool
process) and with the sandbox on ("bwrap" where it runs here, else "process"), the
cases alternating over `--rounds` rounds in one run, each with a stack of its own and a
client in a fresh process with an empty Inductor cache. The worker warms up as a
deployed one does (`--no-warmup`: it does not). Timed: the client's first
compiled step (submit, the farm's compile, fetch, load, run) of the MLP, on a worker
that has just started, then of the CNN example, on the same worker, now running (a
long-lived worker's cold compile). Prints both side by side and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLIENT = textwrap.dedent("""
    import json, sys, time
    import torch
    import sdk
    from examples.models import make_cnn, make_mlp
    seconds = {}
    for name, make in (("first_step_s", make_mlp), ("running_worker_s", make_cnn)):
        model, inputs = make()
        t0 = time.perf_counter()
        compiled = sdk.compile(model, remote=sys.argv[1], fallback="error")
        compiled(*inputs).pow(2).mean().backward()
        seconds[name] = time.perf_counter() - t0
    print(json.dumps(seconds))
""")
CASES = {"first_step_s": "MLP, the worker just started", "running_worker_s": "CNN, the same worker, running"}


def one(mode: str, warmup: bool) -> dict:
    from localfarm.stack import LocalStack

    with tempfile.TemporaryDirectory(prefix="tf-sandbox-bench-") as tmp, LocalStack(
        workers=1, workdir=Path(tmp), warmup=warmup, extra_env={"TORCHFARM_SANDBOX": mode}
    ) as stack:
        env = {
            "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/client-inductor",
            "TORCHFARM_TRUSTED_KEYS_FILE": str(stack.trusted_keys_file),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
        }
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, stack.address], env=env, capture_output=True,
            text=True, timeout=1800, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", default="auto", help="the sandboxed case's TORCHFARM_SANDBOX")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="the worker's warm-up (TORCHFARM_WARMUP), as a deployed worker runs it")
    args = parser.parse_args()
    from workers.sandbox import resolve

    on = resolve(args.mode)
    times: dict[str, dict[str, list[float]]] = {case: {"off": [], on: []} for case in CASES}
    for r in range(args.rounds):
        for mode in ("off", on) if r % 2 == 0 else (on, "off"):
            result = one(mode, args.warmup)
            for case in CASES:
                times[case][mode].append(result[case])
            print(f"round {r + 1}: sandbox={mode:8s} " + "  ".join(
                f"{case} {result[case]:6.2f} s" for case in CASES), flush=True)
    for case, what in CASES.items():
        off, box = statistics.median(times[case]["off"]), statistics.median(times[case][on])
        print(f"\nmedian first step (cold compile) of the {what}, {args.rounds} rounds:")
        print(f"  sandbox=off     {off:6.2f} s   {times[case]['off']}")
        print(f"  sandbox={on:8s}{box:6.2f} s   {times[case][on]}")
        print(f"  ratio {box / off:.2f}x, +{box - off:.2f} s")


if __name__ == "__main__":
    main()
