"""`make bench-scaling`: how a cold farm compile scales with workers (staged pipeline).

The GPT example (examples/models.py, the model `make demo` trains), each case a fresh
client process timed from the compile call to the end of the first training step
(examples/harness.py), against a farm whose caches are all empty (a new stack: new
Redis, new worker Inductor dirs):

- cold with 1 worker and with 2 workers, each worker pinned to its own core
  (`LocalStack(pin_cores=True)`, as `torchfarm up --pin-cores`);
- the farm's compile time: for each graph, from the coordinator's job record
  (`created`, when the request was queued) to the assembly's success (`updated`),
  summed over the run's graphs. It leaves out what the client does whatever serves the
  compile (Dynamo's capture, loading the artifact, the step itself), which is the
  same for one worker and for two;
- each stage's share of the farm time, from the artifacts' manifests (`stages`);
- an estimate for 8 and 32 workers from those measured shares (the model below);
- the "second model": a GPT built from the same blocks with two more of them, cold
  against a farm whose kernel cache holds the first GPT's kernels, and against an
  empty one. Worker Inductor dirs are emptied for both, so only Redis's kernel cache
  differs.

The estimate: kernel builds are the part that runs on several workers at once, and
they start while the lowering still runs (the forward graph's kernels are sent while the
backward graph is lowered). Each artifact's manifest records every kernel-build job the
lowering sent: when, in seconds after the lowering began, and how long its kernels took
to build on this 1-worker run. The estimate replays that schedule on N workers: the
lowering's own worker is free once the lowering ends, the N − 1 others from the start,
and each job, in the order sent, goes to the worker that can start it first. With P(N)
the time the last build ends,

    T(N) = T(1) − P(1) + P(N)

Decomposition, lowering, assembly, transfer and the client's own work stay as measured.
The 2-worker estimate is checked against the 2-worker measurement. It is an estimate
from one machine's figures, not a measurement: it ignores queueing overhead, contention
for memory bandwidth, and builds that slow down when workers share a machine.

Writes a table to stdout and bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.harness import run_case  # noqa: E402
from localfarm.stack import LocalStack  # noqa: E402
from torchfarm.storage.store import JobState  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
ESTIMATE_WORKERS = (8, 32)
TARGET_RATIO = 0.65
"""The goal for 2 pinned workers over 1 pinned worker, cold (docs/scaling.md)."""


def farm_stages(stack: LocalStack) -> dict:
    """Stage seconds summed over the graphs of the last run, from their manifests."""
    store = stack.store()
    sums: dict[str, float] = {}
    queued: dict[str, float] = {}
    busy = kernels = hit = wall = 0.0
    schedules = []
    for key in store.artifact_keys():
        manifest, job = store.get_manifest(key), store.get_job(key)
        if manifest is None:
            continue
        if job is None or job.state != JobState.SUCCEEDED:
            raise RuntimeError(f"artifact {key[:12]} has no succeeded job record")
        wall += job.updated - job.created
        if not manifest.stages:
            raise RuntimeError(f"artifact {key[:12]} was compiled whole, not staged")
        for s in manifest.stages:
            sums[s["stage"]] = sums.get(s["stage"], 0.0) + s["seconds"]
            queued[s["stage"]] = queued.get(s["stage"], 0.0) + s["queued_seconds"]
            if s["stage"] == "kernels":
                kernels += s["kernels"]
                hit += s["kernels_hit"]
                schedules.append({"sends": s.get("sends", []), "lowered_after_s": s.get("lowered_after_s", 0.0)})
        busy += manifest.timings.get("kernels_busy", 0.0)
    batches = sum(len(g["sends"]) for g in schedules)
    return {
        "farm_s": wall, "seconds": sums, "queued_seconds": queued, "kernels_busy_s": busy,
        "kernels": int(kernels), "kernels_hit": int(hit), "kernel_jobs": int(batches),
        "schedules": schedules,
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


def kernel_phase(sends: list[list[float]], lowered_after: float, workers: int) -> float:
    """When the last kernel build of one graph ends, in seconds after its lowering began,
    on `workers` workers (the module docstring's P(N))."""
    free = [lowered_after] + [0.0] * (workers - 1)
    end = lowered_after
    for after, seconds in sorted(sends):
        w = min(range(workers), key=lambda i: max(free[i], after))
        free[w] = max(free[w], after) + seconds
        end = max(end, free[w])
    return end


def estimate(t1: float, schedules: list[dict], n: int) -> float:
    """T(N) = T(1) − P(1) + P(N), over the graphs of the 1-worker run."""
    return t1 + sum(
        kernel_phase(g["sends"], g["lowered_after_s"], n) - kernel_phase(g["sends"], g["lowered_after_s"], 1)
        for g in schedules
    )


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
    farm = {n: statistics.median(x["stages"]["farm_s"] for x in v) for n, v in runs.items()}
    one = sorted(runs[1], key=lambda r: r["first_step_s"])[len(runs[1]) // 2]  # the median run
    busy, jobs = one["stages"]["kernels_busy_s"], one["stages"]["kernel_jobs"]
    schedules = one["stages"]["schedules"]
    farm_total = sum(one["stages"]["seconds"].values())
    shares = {s: v / t[1] for s, v in one["stages"]["seconds"].items()}
    result = {
        "model": "gpt (examples/models.py GPTConfig())",
        "first_step_s": {str(n): v for n, v in t.items()},
        "ratio_2_over_1": t[2] / t[1],
        "farm_compile_s": {str(n): v for n, v in farm.items()},
        "farm_ratio_2_over_1": farm[2] / farm[1],
        "target_ratio": TARGET_RATIO,
        "stage_seconds_1_worker": one["stages"]["seconds"],
        "stage_share_of_first_step_1_worker": shares,
        "client_and_transfer_share": max(0.0, 1 - farm_total / t[1]),
        "kernels": one["stages"]["kernels"],
        "kernel_jobs": jobs,
        "kernels_busy_s": busy,
        "estimate_model": "T(N) = T(1) - P(1) + P(N); P(N): the 1-worker run's kernel-build "
        "jobs, as sent, replayed on N workers (bench/scaling.py kernel_phase)",
        "estimated_first_step_s": {
            str(n): estimate(t[1], schedules, n) for n in (2, *ESTIMATE_WORKERS)
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
    print(f"{'case':42} {'first step':>11} {'farm compile':>13}")
    print(f"{'cold, 1 pinned worker':42} {t[1]:10.2f}s {farm[1]:12.2f}s")
    print(f"{'cold, 2 pinned workers':42} {t[2]:10.2f}s {farm[2]:12.2f}s")
    print(f"{'ratio, 2 workers / 1 (target ≤ ' + str(TARGET_RATIO) + ')':42} {t[2] / t[1]:11.2f} {farm[2] / farm[1]:13.2f}")
    print(f"{'cold, 2 workers (estimate, to check it)':42} {result['estimated_first_step_s']['2']:10.2f}s")
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
