"""`make bench-scaling`: how a cold farm compile scales with workers (staged pipeline).

The GPT example (examples/models.py, the model `make demo` trains), each case a fresh
client process timed from the compile call to the end of the first training step
(examples/harness.py), against a farm whose caches are all empty (a new stack: new
Redis, new worker Inductor dirs):

- cold with 1 worker and with 2 workers, each worker pinned to its own core
  (`LocalStack(pin_cores=True)`, as `torchfarm up --pin-cores`);
- each stage's share of the farm time, from the artifacts' manifests (`stages`);
- an estimate for 8 and 32 workers from those measured shares (the model below);
- the "second model": a GPT built from the same blocks with two more of them, cold
  against a farm whose kernel cache holds the first GPT's kernels, and against an
  empty one. Worker Inductor dirs are emptied for both, so only Redis's kernel cache
  differs.

The estimate (Amdahl): only kernel generation runs on several workers at once, so

    T(N) = T(1) − K + K / min(N, B)

where T(1) is the measured 1-worker time, K the kernel-build work (the sum of every
kernel job's build seconds, manifest timing "kernels_busy") and B the number of
kernel-build jobs (kernels / TORCHFARM_KERNEL_BATCH): no more than B workers can
help. Decomposition, lowering, assembly, transfer and the client's own work stay
serial. It is an estimate from one machine's fractions, not a measurement.

Writes a table to stdout and bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.harness import run_case  # noqa: E402
from torchfarm.stack import LocalStack  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
ESTIMATE_WORKERS = (8, 32)
TARGET_RATIO = 0.65
"""The goal for 2 pinned workers over 1 pinned worker, cold (docs/scaling.md)."""


def farm_stages(stack: LocalStack) -> dict:
    """Stage seconds summed over the graphs of the last run, from their manifests."""
    store = stack.store()
    sums: dict[str, float] = {}
    queued: dict[str, float] = {}
    busy = kernels = hit = batches = 0.0
    for key in store.artifact_keys():
        manifest = store.get_manifest(key)
        if manifest is None:
            continue
        if not manifest.stages:
            raise RuntimeError(f"artifact {key[:12]} was compiled whole, not staged")
        for s in manifest.stages:
            sums[s["stage"]] = sums.get(s["stage"], 0.0) + s["seconds"]
            queued[s["stage"]] = queued.get(s["stage"], 0.0) + s["queued_seconds"]
            if s["stage"] == "kernels":
                kernels += s["kernels"]
                hit += s["kernels_hit"]
        busy += manifest.timings.get("kernels_busy", 0.0)
    batch = int(stack.extra_env.get("TORCHFARM_KERNEL_BATCH", "2"))
    batches = math.ceil((kernels - hit) / batch) if kernels > hit else 0
    return {
        "seconds": sums, "queued_seconds": queued, "kernels_busy_s": busy,
        "kernels": int(kernels), "kernels_hit": int(hit), "kernel_jobs": int(batches),
    }


def clean_workers(stack: LocalStack) -> None:
    """Restarts every worker with an empty Inductor cache dir (a fresh machine's)."""
    n = len([p for p in stack.procs if p.startswith("worker")])
    for i in range(n):
        stack.stop_process(f"worker{i}")
        shutil.rmtree(stack.workdir / f"worker{i}", ignore_errors=True)
    for i in range(n):
        stack.start_worker(i)
    stack.wait_ready(120)


def clear_farm(stack: LocalStack) -> None:
    """Empties the farm's caches in Redis (artifacts, blobs, kernel cache, job records)
    but keeps the workers' registrations."""
    r = stack.store().r
    for pattern in ("tf:artifact:*", "tf:blob:*", "tf:kbin:*", "tf:job:*", "tf:stat:*", "tf:recent"):
        names = list(r.scan_iter(match=pattern, count=1000))
        if names:
            r.delete(*names)


def cold(workers: int, tmp: Path, run: int, second_model: bool) -> dict:
    env = {"TORCHFARM_PIPELINE": "staged"}
    out: dict = {}
    with LocalStack(workers=workers, pin_cores=True, workdir=tmp / f"stack{workers}-{run}",
                    extra_env=env) as stack:
        report = run_case("gpt", "farm", tmp / f"client{workers}-{run}", remote=stack.address)
        out["first_step_s"] = report["first_step_s"]
        out["stages"] = farm_stages(stack)
        if second_model:
            clean_workers(stack)
            for key in stack.store().artifact_keys():  # keep the kernel cache only
                stack.store().delete_artifact(key)
            warm = run_case("gpt-deeper", "farm", tmp / f"deeper-warm-{run}", remote=stack.address)
            out["second_model_warm_kernels_s"] = warm["first_step_s"]
            out["second_model_warm_stages"] = farm_stages(stack)
            clear_farm(stack)
            clean_workers(stack)
            empty = run_case("gpt-deeper", "farm", tmp / f"deeper-cold-{run}", remote=stack.address)
            out["second_model_empty_s"] = empty["first_step_s"]
            out["second_model_empty_stages"] = farm_stages(stack)
    return out


def estimate(t1: float, busy: float, jobs: int, n: int) -> float:
    return t1 - busy + busy / max(1, min(n, jobs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="torchfarm-scaling-") as tmp:
        for r in range(args.repeats):
            for n in (1, 2):
                print(f"cold GPT compile, {n} pinned worker(s), run {r + 1} ...", flush=True)
                runs[n].append(cold(n, Path(tmp), r, second_model=(n == 1)))
                print(f"  {runs[n][-1]['first_step_s']:.2f}s", flush=True)
    t = {n: statistics.median(x["first_step_s"] for x in v) for n, v in runs.items()}
    one = runs[1][len(runs[1]) // 2]
    busy, jobs = one["stages"]["kernels_busy_s"], one["stages"]["kernel_jobs"]
    farm_total = sum(one["stages"]["seconds"].values())
    shares = {s: v / t[1] for s, v in one["stages"]["seconds"].items()}
    result = {
        "model": "gpt (examples/models.py GPTConfig())",
        "first_step_s": {str(n): v for n, v in t.items()},
        "ratio_2_over_1": t[2] / t[1],
        "target_ratio": TARGET_RATIO,
        "stage_seconds_1_worker": one["stages"]["seconds"],
        "stage_share_of_first_step_1_worker": shares,
        "client_and_transfer_share": max(0.0, 1 - farm_total / t[1]),
        "kernels": one["stages"]["kernels"],
        "kernel_jobs": jobs,
        "kernels_busy_s": busy,
        "estimate_model": "T(N) = T(1) - K + K / min(N, B); K = kernels_busy_s, B = kernel_jobs",
        "estimated_first_step_s": {
            str(n): estimate(t[1], busy, jobs, n) for n in (2, *ESTIMATE_WORKERS)
        },
        "second_model": {
            "kernel_cache_with_first_model_s": one["second_model_warm_kernels_s"],
            "empty_cache_s": one["second_model_empty_s"],
            "kernels_hit": one["second_model_warm_stages"]["kernels_hit"],
            "kernels": one["second_model_warm_stages"]["kernels"],
        },
        "runs": {str(n): v for n, v in runs.items()},
    }
    print()
    print(f"{'case':42} {'first step':>11}")
    print(f"{'cold, 1 pinned worker':42} {t[1]:10.2f}s")
    print(f"{'cold, 2 pinned workers':42} {t[2]:10.2f}s   ratio {t[2] / t[1]:.2f} (target ≤ {TARGET_RATIO})")
    for n in ESTIMATE_WORKERS:
        print(f"{f'cold, {n} workers (estimate)':42} {result['estimated_first_step_s'][str(n)]:10.2f}s")
    sm = result["second_model"]
    print(f"{'second model, kernel cache has the first':42} {sm['kernel_cache_with_first_model_s']:10.2f}s"
          f"   {sm['kernels_hit']}/{sm['kernels']} kernels hit")
    print(f"{'second model, empty farm cache':42} {sm['empty_cache_s']:10.2f}s")
    print()
    print("1-worker stage shares of the first step: " + ", ".join(
        f"{s} {v:.0%}" for s, v in shares.items()) + f", client and transfer {result['client_and_transfer_share']:.0%}")
    print(f"kernel builds: {busy:.1f}s of work in {jobs} jobs ({result['kernels']} kernels)")
    print(f"estimate: {result['estimate_model']}")
    (OUT / "scaling.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {OUT / 'scaling.json'}")


if __name__ == "__main__":
    main()
