"""`make bench-gpu`: the first training step, farm against local and PyTorch's own caches.

    python bench/gpu_bench.py                                   # on a GPU: the issue's GPT
    python bench/gpu_bench.py --device cpu --models tiny-gpt,mlp --gpt "" --batch 4

For each model, each case a fresh process (examples/train_gpt.py) with its own empty
Inductor and Triton cache dirs, timed from the compile call to the end of the first
training step, loss and gradients compared with eager:

- eager: no compile;
- local cold, local warm: torch.compile, an empty cache dir, then the same dir again;
- pt-remote hit: Inductor's Redis remote caches (FX graph and AOTAutograd) filled by an
  earlier process, read from an empty local dir;
- farm cold, farm hit: through a local farm (one worker serving this device's exact
  target) with an empty farm cache, then again from an empty local dir;
- autotuned cold, autotuned hit: the same with mode="max-autotune".

For each case through the farm it sums the SDK's phases per graph (encode, submit and
wait, fetch, verify and load); the rest is Dynamo and the step itself. With
`--profile`, the warm and hit cases run once more under cProfile, and their self time by
area (Dynamo, Inductor, Triton, the SDK, waits on children and sockets...) is printed
side by side and kept in the JSON: one run on a GPU says where a hit's time goes.

Every case counts the compilers it ran (train_gpt.py --count): C++ builds, Triton
compiles (bench/counting/, Triton's compilation listener in every process of the case),
ptxas runs (a wrapper named by TRITON_PTXAS_PATH), Triton's own C builds of its driver
utilities and kernel launchers (a wrapper named by CC), and the Triton kernels that
benchmarked their configs at first launch. A hit should run none of the first three
and benchmark nothing; the C builds are shown beside a local warm start's.

The PyTorch remote cache and the farm need a redis-server: `--redis-server PATH`, else
the one in PATH; without one those cases are skipped and the output says so. Prints
medians and their ratios to local warm against the issue's targets, and writes
bench/results/gpu_bench.json (or --out). Exits 1 when a case fails, differs from eager
or a hit compiled anything; a missed time target is reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.harness import run_case  # noqa: E402
from localfarm.stack import LocalStack, free_port, start_redis_server  # noqa: E402

OUT = ROOT / "bench" / "results" / "gpu_bench.json"
COUNTING = ROOT / "bench" / "counting"
ISSUE_GPT = "layers=6,width=512,block=256,heads=8"
"""The GPT the GPU figures were measured on (6 blocks, width 512, sequence 256)."""

CASES = ("eager", "local cold", "local warm", "pt-remote hit", "farm cold", "farm hit",
         "autotuned cold", "autotuned hit")
NEEDS_REDIS = frozenset(CASES[3:])
HITS = ("farm hit", "autotuned hit")
TARGETS = (
    ("farm hit", "local warm", 0.8),
    ("farm hit", "pt-remote hit", 1.0),
    ("autotuned hit", "farm hit", 1.1),
    ("farm cold", "local cold", 1.0),
)
"""(case, against, most): the issue's targets, case / against <= most."""

TOLERANCE = {"float32": (1e-3, 1e-2)}
"""Loss and gradient error allowed against eager: Inductor reorders float32 reductions."""

OUTCOME = re.compile(r"torchfarm: graph \d+ of .*?: (hit|miss|joined|compiled locally)")
PHASES = ("encode", "submit+wait", "fetch", "load")
PHASE_LINE = re.compile(
    r"\| encode ([\d.]+)s submit\+wait ([\d.]+)s.*? fetch ([\d.]+)s load ([\d.]+)s \|")
"""sdk/backend.py's line for a graph from the farm: where its seconds went."""


def redis_server_dir(given: str, tmp: Path) -> Path | None:
    """A folder holding `redis-server` (the given one, linked under that name), or None."""
    path = given or shutil.which("redis-server") or ""
    if not path or not os.access(path, os.X_OK):
        return None
    bin_dir = tmp / "redis-bin"
    bin_dir.mkdir()
    (bin_dir / "redis-server").symlink_to(Path(path).resolve())
    return bin_dir


def ptxas_env(tmp: Path) -> dict[str, str]:
    """TRITON_PTXAS_PATH to a wrapper that counts the runs (not `--version`, which Triton
    runs to key its cache) of the ptxas Triton would run; none without Triton's CUDA side."""
    try:
        from triton import knobs

        real = knobs.nvidia.ptxas.path
    except (ImportError, RuntimeError, AttributeError):
        return {}
    wrapper = _counting_wrapper(
        tmp / "ptxas", real, 'case "$1" in --version) ;; *) echo ptxas >> "$TORCHFARM_BENCH_COUNTS" ;; esac'
    )
    return {"TRITON_PTXAS_PATH": wrapper, "TRITON_PTXAS_BLACKWELL_PATH": wrapper}


def triton_cc_env(tmp: Path) -> dict[str, str]:
    """CC for a wrapper that counts the C builds Triton runs (its driver's utilities and
    each kernel signature's launcher, `triton.runtime.build._build`, which takes CC
    first) and runs the compiler Triton would: a hit that loads Triton's own launchers
    builds them in a process whose Triton cache is empty; Inductor's static launcher
    builds none. Inductor's C++ kernels use CXX, not CC."""
    real = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not real:
        return {}
    return {"CC": _counting_wrapper(tmp / "cc", real, 'echo triton-cc >> "$TORCHFARM_BENCH_COUNTS"')}


def _counting_wrapper(path: Path, real: str, count: str) -> str:
    """A shell script at `path` that runs `count` (a line appended to the counts file)
    and then `real` with its arguments; its path."""
    path.write_text(f'#!/bin/sh\n{count}\nexec "{real}" "$@"\n')
    path.chmod(0o755)
    return str(path)


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.base_env = {**ptxas_env(tmp), **triton_cc_env(tmp)}
        self.train_args = ["--count", "--gpt", args.gpt]
        if args.batch:
            self.train_args += ["--batch", str(args.batch)]
        self.runs = 0

    def case(self, model: str, backend: str, cache: Path, *, remote: str = "",
             env: dict[str, str] | None = None, mode: str = "", profile: Path | None = None) -> dict:
        """One fresh process; its report with the farm's outcome and phases per graph.
        With `profile`, the process also writes where its first step went there."""
        self.runs += 1
        counts = self.tmp / f"counts-{self.runs}"
        full_env = {
            **self.base_env,
            "TORCHFARM_BENCH_COUNTS": str(counts),
            "PYTHONPATH": os.pathsep.join(filter(None, (str(COUNTING), os.environ.get("PYTHONPATH")))),
            **(env or {}),
        }
        extra = [*self.train_args, *(["--mode", mode] if mode else []),
                 *(["--profile", str(profile)] if profile else [])]
        report = run_case(model, backend, cache, remote=remote, steps=self.args.steps, check=True,
                          env=full_env, device=self.args.device, args=tuple(extra))
        log = report.pop("log")
        report["outcomes"] = [m.group(1) for line in log if (m := OUTCOME.search(line))]
        report["farm_phases_s"] = farm_phases(log)
        return report


def pt_remote_env(port: int) -> dict[str, str]:
    return {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_HOST": "127.0.0.1",
        "TORCHINDUCTOR_REDIS_PORT": str(port),
    }


def farm_phases(log: list[str]) -> dict[str, float]:
    """The SDK's per-graph phases (sdk/backend.py's INFO line), summed over the graphs."""
    total = dict.fromkeys(PHASES, 0.0)
    for line in log:
        if m := PHASE_LINE.search(line):
            for name, seconds in zip(PHASES, m.groups(), strict=True):
                total[name] += float(seconds)
    return total


def bench_once(bench: Bench, model: str, d: Path, stack: LocalStack | None, pt_port: int) -> dict[str, dict]:
    """Every case that can run, once, in order; {case: report}."""
    got = {
        "eager": bench.case(model, "eager", d / "eager"),
        "local cold": bench.case(model, "local", d / "local"),
        "local warm": bench.case(model, "local", d / "local"),
    }
    if stack is None:
        return got
    redis.Redis(port=pt_port).flushall()
    bench.case(model, "local", d / "pt-fill", env=pt_remote_env(pt_port))
    got["pt-remote hit"] = bench.case(model, "local", d / "pt-hit", env=pt_remote_env(pt_port))
    stack.store().r.flushdb()  # an empty farm cache for the cold cases
    for prefix, mode in (("farm", ""), ("autotuned", "max-autotune")):
        for phase in ("cold", "hit"):
            got[f"{prefix} {phase}"] = bench.case(
                model, "farm", d / f"{prefix}-{phase}", remote=stack.address, env=trusted(stack), mode=mode)
    return got


def trusted(stack: LocalStack) -> dict[str, str]:
    return {"TORCHFARM_TRUSTED_KEYS_FILE": str(stack.trusted_keys_file)}


def profile_once(bench: Bench, model: str, d: Path, stack: LocalStack | None, pt_port: int) -> dict[str, dict]:
    """The warm and hit cases once more, profiled, after `bench_once` filled their caches
    in `d`: {case: where its first step went (bench/profile_summary.py)}. Not timed: the
    profiler slows what it sees."""
    out = d / "profiles"
    out.mkdir()
    # {case: (backend, cache dir, the case's other arguments)}: as bench_once runs it,
    # from a cache dir that is warm for the warm case and empty for a hit.
    runs: dict[str, tuple[str, Path, dict]] = {"local warm": ("local", d / "local", {})}
    if stack is not None:
        runs["pt-remote hit"] = ("local", d / "pt-hit-profiled", {"env": pt_remote_env(pt_port)})
        farm = {"remote": stack.address, "env": trusted(stack)}
        runs["farm hit"] = ("farm", d / "farm-hit-profiled", farm)
        runs["autotuned hit"] = ("farm", d / "autotuned-hit-profiled", {**farm, "mode": "max-autotune"})
    profiles = {}
    for case, (backend, cache, kwargs) in runs.items():
        path = out / (case.replace(" ", "-") + ".json")
        bench.case(model, backend, cache, profile=path, **kwargs)
        profiles[case] = json.loads(path.read_text())
    return profiles


def problems(case: str, report: dict) -> list[str]:
    """What makes a case's run wrong: numbers off eager, a hit that was not, a hit that
    compiled."""
    found = []
    loss_tol, grad_tol = TOLERANCE["float32"]
    if report["loss_abs_err"] > loss_tol or report["grad_max_abs_err"] > grad_tol:
        found.append(f"differs from eager: loss {report['loss_abs_err']:.1e}, grads {report['grad_max_abs_err']:.1e}")
    outcomes = report["outcomes"]
    if case.endswith("cold") and case != "local cold" and (not outcomes or set(outcomes) - {"miss", "joined"}):
        found.append(f"expected farm misses, got {outcomes}")
    if case in HITS:
        if not outcomes or set(outcomes) != {"hit"}:
            found.append(f"expected farm hits, got {outcomes}")
        # Triton's C builds are reported, not failed: a local warm start may run them too.
        ran = {k: v for k, v in report["compiles"].items()
               if k not in ("triton-cache-hit", "triton-cc", "autotune") and v}
        if ran:
            found.append(f"a hit ran compilers: {ran}")
        if report["compiles"].get("autotune"):
            found.append(f"a hit benchmarked {report['compiles']['autotune']} kernels' configs")
    return found


def summarize(model: str, reports: list[dict[str, dict]]) -> dict:
    cases = [c for c in CASES if c in reports[0]]
    med = {c: statistics.median(r[c]["first_step_s"] for r in reports) for c in cases}
    warm = med["local warm"]
    return {
        "median_s": med,
        "vs_local_warm": {c: med[c] / warm for c in cases},
        "targets": [
            {"case": c, "against": a, "ratio": med[c] / med[a], "most": most, "met": med[c] / med[a] <= most}
            for c, a, most in TARGETS if c in med and a in med
        ],
        "compiles": {c: reports[-1][c].get("compiles", {}) for c in cases},
        "outcomes": {c: reports[-1][c]["outcomes"] for c in cases},
        "errors_vs_eager": {c: [reports[-1][c]["loss_abs_err"], reports[-1][c]["grad_max_abs_err"]] for c in cases},
        "runs": {c: [r[c]["first_step_s"] for r in reports] for c in cases},
        "problems": {c: p for c in cases if (p := problems(c, reports[-1][c]))},
        "farm_phases_s": {
            c: phases for c in cases if any((phases := reports[-1][c]["farm_phases_s"]).values())
        },
    }


def print_model(model: str, res: dict) -> None:
    print(f"\n{model}: first training step, median (s), and / local warm")
    for c, secs in res["median_s"].items():
        n = res["compiles"][c]
        counts = (f"cpp {n.get('cpp', 0)}, triton {n.get('triton', 0)}, ptxas {n.get('ptxas', 0)}, "
                  f"triton cc {n.get('triton-cc', 0)}; autotune benchmarks {n.get('autotune', 0)}")
        outcome = ",".join(sorted(set(res["outcomes"][c]))) or "-"
        print(f"  {c:15} {secs:8.2f}s  {res['vs_local_warm'][c]:5.2f}x  farm {outcome:11} compilers: {counts}")
    for t in res["targets"]:
        print(f"  target {t['case']} / {t['against']} <= {t['most']}: {t['ratio']:.2f} "
              f"{'met' if t['met'] else 'MISSED'}")
    for c, phases in res["farm_phases_s"].items():
        rest = res["runs"][c][-1] - sum(phases.values())
        print(f"  {c:15} " + "  ".join(f"{k} {v:.2f}s" for k, v in phases.items()) + f"  rest {rest:.2f}s")
    if profiles := res.get("profiles"):
        print_profiles(profiles)
    for c, found in res["problems"].items():
        print(f"  PROBLEM {c}: " + "; ".join(found))


def print_profiles(profiles: dict[str, dict], rows: int = 14) -> None:
    """Self seconds by area, the profiled cases side by side, the largest areas first."""
    areas = sorted({a for p in profiles.values() for a in p["by_area_s"]},
                   key=lambda a: -max(p["by_area_s"].get(a, 0.0) for p in profiles.values()))[:rows]
    cases = list(profiles)
    print("  profiled (self seconds by area; the profiler slows what it sees):")
    print("  " + " " * 24 + "".join(f"{c:>15}" for c in cases))
    for row in ("total", "imports"):
        print("  " + f"{row:24}" + "".join(f"{profiles[c][row + '_s']:15.2f}" for c in cases))
    for a in areas:
        print("  " + f"{a[:24]:24}" + "".join(f"{profiles[c]['by_area_s'].get(a, 0.0):15.2f}" for c in cases))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help='"cuda" (default) or "cpu"')
    ap.add_argument("--models", default="gpt,cnn,mlp", help="train_gpt.py models, comma-separated")
    ap.add_argument("--gpt", default=ISSUE_GPT, help='GPT size, "" for the default GPTConfig')
    ap.add_argument("--batch", type=int, default=16, help="batch size, 0 for each model's own")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--redis-server", default="", help="path of redis-server (default: the one in PATH)")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--profile", action="store_true",
                    help="then run the warm and hit cases once more under cProfile (bench/profile_summary.py)")
    return ap.parse_args()


def run(args: argparse.Namespace, tmp: Path) -> dict:
    bench = Bench(args, tmp)
    redis_dir = redis_server_dir(args.redis_server, tmp)
    skipped = [] if redis_dir else sorted(NEEDS_REDIS, key=CASES.index)
    if redis_dir:
        os.environ["PATH"] = f"{redis_dir}{os.pathsep}{os.environ['PATH']}"
    else:
        why = (f"--redis-server {args.redis_server} is not an executable file" if args.redis_server
               else "no redis-server in PATH (give --redis-server PATH)")
        print(f"gpu_bench: {why}: skipping " + ", ".join(skipped), flush=True)
    if not bench.base_env and args.device.startswith("cuda"):
        print("gpu_bench: Triton's ptxas not found: ptxas runs are not counted", flush=True)
    results: dict = {"device": args.device, "gpt": args.gpt, "batch": args.batch, "skipped": skipped,
                     "models": {}}
    stack, pt_redis, pt_port = None, None, 0
    try:
        if redis_dir:
            pt_port = free_port()
            pt_redis = start_redis_server(pt_port, tmp)
            env = {"TORCHFARM_TARGETS": "local", "TORCHFARM_SANDBOX": "auto"} if args.device != "cpu" else {}
            t0 = time.monotonic()
            stack = LocalStack(workers=1, workdir=tmp / "stack", extra_env=env).start(timeout_s=args.start_timeout)
            print(f"gpu_bench: local farm ready in {time.monotonic() - t0:.0f}s at {stack.address}", flush=True)
        for model in args.models.split(","):
            reports = []
            for r in range(args.repeats):
                print(f"gpu_bench: {model} run {r + 1} ...", flush=True)
                reports.append(bench_once(bench, model, tmp / f"{model}-{r}", stack, pt_port))
            results["models"][model] = summarize(model, reports)
            if args.profile:
                print(f"gpu_bench: {model} profiled ...", flush=True)
                results["models"][model]["profiles"] = profile_once(
                    bench, model, tmp / f"{model}-{args.repeats - 1}", stack, pt_port)
            print_model(model, results["models"][model])
    finally:
        if stack is not None:
            stack.stop()
        if pt_redis is not None:
            pt_redis.terminate()
            pt_redis.wait()
    return results


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="torchfarm-gpu-bench-") as tmp:
        results = run(args, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    if results["skipped"]:
        print("skipped (no redis-server): " + ", ".join(results["skipped"]))
    if any(res["problems"] for res in results["models"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
