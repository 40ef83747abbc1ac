"""`make bench-ranks`: N gloo ranks (4 by default) on a cold farm against every rank
compiling locally, side by side in one run.

- farm: a fresh local stack (empty cache, one worker); every rank calls
  `sdk.compile(model, fallback="error")`; the ranks' identical graphs share a key, so the
  farm compiles each distinct graph once while the other ranks join that compile. The
  worker has served one unrelated compile first, as a running farm's worker has: a
  worker just started brings its sandbox's forkserver up during its first job (imports,
  headers; 40 s on two cores shared with four starting ranks). `--fresh-worker` skips it;
- local: every rank runs `torch.compile` with an empty Inductor cache dir of its own.

The ranks are tests/integration/distributed_train.py under torchrun. Reported: the wall
time from launching torchrun until every rank has finished its first training step, the
farm's compiles (outcome "compiled") against the distinct graphs, and the ratio of the
two wall times. The stack runs on this machine, so its worker competes with the ranks
for the CPU; a real farm compiles elsewhere. Writes bench/results/ranks.json.
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
SCRIPT = ROOT / "tests" / "integration" / "distributed_train.py"


def run_ranks(mode: str, args: argparse.Namespace, env: dict[str, str], work: Path) -> dict:
    out = work / mode
    out.mkdir()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
        str(SCRIPT), args.model, mode, "1", str(out), str(args.width),
    ]
    full_env = {
        **os.environ, **env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
        "TORCHFARM_TEST_NO_REFERENCE": "1",
        "TORCHFARM_TEST_INDUCTOR_BASE": str(work / f"{mode}-inductor"),
        "TORCHFARM_BLOB_CACHE_DIR": str(work / f"{mode}-blobs"),
    }
    t0 = time.time()
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode} ranks failed:\n{done.stderr[-4000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    outcomes = [o for r in ranks for o in r["outcomes"]]
    return {
        "wall_to_first_steps_s": max(r["first_step_at"] for r in ranks) - t0,
        "first_step_s": [round(r["first_step_s"], 2) for r in ranks],
        "compiled": outcomes.count("compiled"),
        "joined": outcomes.count("joined"),
        "hit": outcomes.count("hit"),
        "distinct_graphs": len({k for r in ranks for k in r["keys"]}),
    }


WARM_UP = """
import sys, torch, sdk
sdk.compile(torch.nn.Linear(3, 5), remote=sys.argv[1], fallback="error")(torch.randn(2, 3)).sum().backward()
"""
"""One compile of a graph that shares no kernel with the ranks' models."""


def warm_worker(env: dict[str, str], work: Path, address: str) -> None:
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(work / "warm-up")}
    done = subprocess.run([sys.executable, "-c", WARM_UP, address], env=full_env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the warm-up compile failed:\n{done.stderr[-4000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", default="tp_mlp", choices=("tp_mlp", "fsdp2", "dtensor_block", "fsdp2_tp"))
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--fresh-worker", action="store_true", help="no warm-up compile before the ranks")
    args = parser.parse_args()
    from localfarm.stack import LocalStack

    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        work = Path(tmp)
        local = run_ranks("local", args, {}, work)
        with LocalStack(workers=1, workdir=work / "stack", warmup=False) as stack:
            env = {**stack.client_env(), "TORCHFARM_TRUSTED_KEYS_FILE": str(stack.trusted_keys_file)}
            if not args.fresh_worker:
                warm_worker(env, work, stack.address)
            farm = run_ranks("farm", args, env, work)
    ratio = farm["wall_to_first_steps_s"] / local["wall_to_first_steps_s"]
    print(f"{args.ranks} gloo ranks, model {args.model} width {args.width}")
    print(f"{'case':8} {'wall to every first step':>26} {'per-rank first step (s)':>40} {'farm compiles'}")
    for name, r in (("local", local), ("farm", farm)):
        compiles = f"{r['compiled']} for {r['distinct_graphs']} graph(s); joined {r['joined']}, hit {r['hit']}" \
            if name == "farm" else "-"
        print(f"{name:8} {r['wall_to_first_steps_s']:>25.1f}s {str(r['first_step_s']):>40} {compiles}")
    print(f"farm / local wall time: {ratio:.2f}x (target <= 0.5x)")
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "local": local, "farm": farm, "ratio": ratio}
    (OUT / "ranks.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
