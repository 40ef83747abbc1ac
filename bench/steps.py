"""`make bench-steps`: per-step time over the first training steps of the GPT example.

Three cases, each in a fresh process, side by side in one run:

- farm wait=False: `sdk.compile(model, wait=False)`: steps run eagerly until the farm's
  artifact is ready, then switch at a step boundary (sdk/nonblocking.py);
- farm blocking: `sdk.compile(model)`: the first step waits for the farm compile;
- local: `torch.compile(model)` with an empty Inductor cache dir.

Each farm case gets a local stack of its own (one worker), so the farm's cache and the
worker's Inductor cache are empty; every client starts from an empty Inductor cache
dir. Step 1 is timed from the compile call. The stack runs on this machine, so the
farm's compile competes with the eager steps for the same CPU: on a shared laptop that
counts against wait=False; a real farm compiles elsewhere.

Prints a table (per-step times, total, time to first step, ratios) and writes
bench/results/steps.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "results"
CASES = ("farm wait=False", "farm blocking", "local")


def child(case: str, model_name: str, steps: int, remote: str) -> dict:
    """One case, in this (fresh) process; returns its report."""
    import logging

    import torch

    import sdk
    from examples.models import TINY_GPT, GPTConfig, make_gpt

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    cfg = TINY_GPT if model_name == "tiny-gpt" else GPTConfig()
    model, inputs = make_gpt(cfg, batch=4 if model_name == "tiny-gpt" else 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    if case == "local":
        compiled = torch.compile(model)
    else:
        compiled = sdk.compile(model, remote=remote, fallback="error", wait=case == "farm blocking")
    times, losses = [], []
    for step in range(steps):
        s = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = compiled(*inputs)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - (t0 if step == 0 else s))
        losses.append(loss.item())
    report: dict = {"case": case, "model": model_name, "step_s": times, "loss": losses}
    if case == "farm wait=False":
        from sdk.nonblocking import swapper_of

        swapper = swapper_of(compiled)
        report["compiled_from_step"] = min(
            (g.swapped_at_call for g in swapper.graphs if g.swapped_at_call), default=None
        )
        # Not timed: lets the worker finish, so the next case starts on an idle machine.
        swapper.wait_ready(timeout=1800)
        report["graphs"] = [
            {"state": g.state, "compile_s": g.compile_s, "eager_calls": g.eager_calls,
             "compiled_calls": g.compiled_calls}
            for g in swapper.graphs
        ]
    return report


def run_child(case: str, model: str, steps: int, cache_dir: Path, remote: str = "", env=None) -> dict:
    cmd = [sys.executable, __file__, "--child", case, "--model", model, "--steps", str(steps)]
    if remote:
        cmd += ["--remote", remote]
    full_env = {
        **os.environ,
        **(env or {}),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["log"] = [l for l in proc.stderr.splitlines() if "torchfarm" in l and " so far: " not in l]
    return report


def table(results: dict[str, dict], steps: int) -> str:
    lines = ["step  " + "".join(f"{c:>18}" for c in results)]
    for i in range(steps):
        lines.append(f"{i + 1:4}  " + "".join(f"{r['step_s'][i]:17.3f}s" for r in results.values()))
    lines.append("total " + "".join(f"{sum(r['step_s']):17.2f}s" for r in results.values()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt", "tiny-gpt"], default="gpt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--remote", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.steps, args.remote)), flush=True)
        return

    from localfarm.stack import LocalStack

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="torchfarm-steps-") as tmp:
        tmp = Path(tmp)
        for case in CASES:
            print(f"running {case} ...", flush=True)
            client_dir = tmp / case.replace(" ", "-").replace("=", "-") / "client"
            if case == "local":
                results[case] = run_child(case, args.model, args.steps, client_dir)
                continue
            with LocalStack(workers=1, workdir=tmp / f"stack-{len(results)}") as stack:
                results[case] = run_child(
                    case, args.model, args.steps, client_dir, stack.address, stack.client_env()
                )

    totals = {c: sum(r["step_s"]) for c, r in results.items()}
    first = {c: r["step_s"][0] for c, r in results.items()}
    nb, blocking, local = (results[c] for c in CASES)
    summary = {
        "model": args.model,
        "steps": args.steps,
        "total_s": totals,
        "first_step_s": first,
        "wait=False compiled from step": nb.get("compiled_from_step"),
        "wait=False graphs": nb.get("graphs"),
        "ratios": {
            "total: wait=False / blocking": totals[CASES[0]] / totals[CASES[1]],
            "total: wait=False / local": totals[CASES[0]] / totals[CASES[2]],
            "total: blocking / local": totals[CASES[1]] / totals[CASES[2]],
            "first step: wait=False / blocking": first[CASES[0]] / first[CASES[1]],
            "first step: wait=False / local": first[CASES[0]] / first[CASES[2]],
        },
        "cases": results,
    }
    print()
    print(table(results, args.steps))
    print("first " + "".join(f"{first[c]:17.2f}s" for c in results))
    print(f"\nwait=False switched to the compiled graphs at step "
          f"{nb.get('compiled_from_step') or 'never (not ready within the steps run)'}; "
          f"farm compile took " + ", ".join(f"{g['compile_s']:.1f}s" for g in nb.get("graphs", [])))
    for k, v in summary["ratios"].items():
        print(f"{k}: {v:.2f}")
    for case in CASES[:2]:
        print(f"\n{case}, the SDK's log:")
        print("\n".join("  " + l for l in results[case]["log"] if "| encode" in l or "switched" in l))
    print(f"\nloss at step {args.steps}: " + ", ".join(f"{c} {r['loss'][-1]:.5f}" for c, r in results.items()))
    OUT.mkdir(exist_ok=True)
    (OUT / "steps.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {OUT / 'steps.json'}")


if __name__ == "__main__":
    main()
