"""`make bench-split`: what splitting a graph at a call the farm refuses (sdk/split.py) buys
and costs, side by side in one run.

The GPT example (4 blocks) with Reformer's pattern in its third block: `torch.seed()`
before the block, a call the farm refuses. Each case is a client in a fresh process with
an Inductor cache of its own, against one local stack (one worker), after a small GPT of
its own has gone through that worker (so no case meets a worker just started):

- split, farm cold: the graph split at the call, its pieces compiled by the farm;
- split, farm hit: the same, from the farm's cache;
- whole, local cold: `TORCHFARM_SPLIT_REFUSED=0`, the whole graph compiled here;
- whole, local warm: the same, again, on the local Inductor cache the cold case filled;
- no refusal, farm hit: the GPT without the call, from the farm's cache (what the split
  hit would be if the farm took the call).

Timed: the first training step (compile, or fetch and load, then the step), and the
median of the next `--steps` steps (what the split costs at run time: no fusion across
the call, one more graph call). Prints the times and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLIENT = textwrap.dedent("""
    import json, statistics, sys, time
    import torch
    from torch import nn
    import sdk
    from examples.models import GPTConfig, make_gpt

    class Reseeds(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
        def forward(self, x):
            torch.seed()
            return self.inner(x)

    remote, reseed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if reseed == "warm-up":  # a small GPT of its own, so that no case meets a worker just started
        model, inputs = make_gpt(GPTConfig(layers=1, width=64, heads=2), batch=2)
        sdk.compile(model, remote=remote, fallback="error")(*inputs).backward()
        print(json.dumps({}))
        raise SystemExit(0)
    model, inputs = make_gpt(GPTConfig(), batch=8)
    if reseed == "1":
        model.blocks[2] = Reseeds(model.blocks[2])
    compiled = sdk.compile(model, remote=remote, fallback="local")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        compiled(*inputs).backward()
        opt.step()
        return time.perf_counter() - t0

    first = step()
    print(json.dumps({"first_step_s": first, "step_s": statistics.median(step() for _ in range(steps))}))
""")

CASES = (
    # name, reseed, TORCHFARM_SPLIT_REFUSED, client cache (a name shared by warm cases)
    ("split, farm cold", True, "1", "split-cold"),
    ("split, farm hit", True, "1", "split-hit"),
    ("whole, local cold", True, "0", "local"),
    ("whole, local warm", True, "0", "local"),
    ("no refusal, farm cold", False, "1", "plain-cold"),
    ("no refusal, farm hit", False, "1", "plain-hit"),
)


def run_case(remote: str, trusted: Path, tmp: Path, reseed: str, split: str, cache: str, steps: int) -> dict:
    env = {
        "PYTHONPATH": str(ROOT), "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / cache), "TORCHFARM_TRUSTED_KEYS_FILE": str(trusted),
        "TORCHFARM_SPLIT_REFUSED": split,
    }
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, remote, reseed, str(steps)], env=env,
        capture_output=True, text=True, timeout=1800, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    from localfarm.stack import LocalStack

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tf-split-bench-") as work, LocalStack(
        workers=1, workdir=Path(work)
    ) as stack:
        run_case(stack.address, stack.trusted_keys_file, Path(work), "warm-up", "1", "warm-up", 0)
        for name, reseed, split, cache in CASES:
            results[name] = run_case(stack.address, stack.trusted_keys_file, Path(work), "1" if reseed else "0",
                                     split, cache, args.steps)
            print(f"{name:24} first step {results[name]['first_step_s']:7.2f}s   "
                  f"step {results[name]['step_s'] * 1000:7.1f} ms", flush=True)

    def ratio(a: str, b: str, key: str) -> str:
        return f"{results[a][key] / results[b][key]:.2f}"

    print()
    print("first step, split hit / whole local warm:", ratio("split, farm hit", "whole, local warm", "first_step_s"))
    print("first step, split hit / whole local cold:", ratio("split, farm hit", "whole, local cold", "first_step_s"))
    print("first step, split hit / no-refusal hit:  ", ratio("split, farm hit", "no refusal, farm hit", "first_step_s"))
    print("step, split (farm) / whole (local):      ", ratio("split, farm hit", "whole, local warm", "step_s"))
    print("step, split (farm) / no-refusal (farm):  ", ratio("split, farm hit", "no refusal, farm hit", "step_s"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
