"""`make bench`: where compile time goes, farm against local and PyTorch's own caches.

For each model (GPT and CNN examples), side by side in one run, each case a fresh
process timed from the compile call to the end of the first training step:

- local cold: torch.compile, empty Inductor cache dir;
- local warm: torch.compile, the same cache dir again;
- pt-remote hit: PyTorch's Redis remote caches (FX graph + AOTAutograd) filled by an
  earlier run, read from an empty local dir;
- farm cold: through the farm with an empty farm cache, one worker;
- farm hit: through the farm again from an empty local dir;
- precompiled hit: through the farm from an empty local dir, after a run that uploaded
  its precompiled frames (sdk/precompile.py): no Dynamo tracing, no compiler.

Writes a table to stdout, bench/results/compile_bench.json and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.harness import run_case  # noqa: E402
from localfarm.stack import LocalStack, free_port, start_redis_server  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"
CASES = ("local cold", "local warm", "pt-remote hit", "farm cold", "farm hit", "precompiled hit")


def precompile_env(tmp: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The producer's and the consumer's settings for precompiled packages."""
    from torchfarm.trust.signing import Signer

    signer = Signer.generate()
    signer.save(tmp / "precompile-key.pem")
    (tmp / "precompile-trusted.json").write_text(json.dumps(signer.trusted_entry()))
    consumer = {"TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(tmp / "precompile-trusted.json")}
    return {**consumer, "TORCHFARM_PRECOMPILE_KEY_FILE": str(tmp / "precompile-key.pem")}, consumer


def precompiled_hit(model: str, stack: LocalStack, d: Path) -> float:
    """Uploads the model's package in one process, then times a fresh one that loads it."""
    producer, consumer = precompile_env(d.parent)
    run_case(model, "farm", d / "pc-fill", remote=stack.address, env=producer)
    report = run_case(model, "farm", d / "pc-hit", remote=stack.address, env=consumer)
    if not any("precompiled hit" in line for line in report["log"]):
        raise RuntimeError(f"{model}: the precompiled case was no precompiled hit:\n" + "\n".join(report["log"]))
    return float(report["first_step_s"])


def bench_model(model: str, stack: LocalStack, redis_port: int, tmp: Path, repeats: int) -> dict:
    runs: dict[str, list[float]] = {c: [] for c in CASES}
    for r in range(repeats):
        d = tmp / f"{model}-{r}"
        pt_env = {
            "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
            "TORCHINDUCTOR_REDIS_HOST": "127.0.0.1",
            "TORCHINDUCTOR_REDIS_PORT": str(redis_port),
        }
        runs["local cold"].append(run_case(model, "local", d / "local")["first_step_s"])
        runs["local warm"].append(run_case(model, "local", d / "local")["first_step_s"])
        redis.Redis(port=redis_port).flushall()
        run_case(model, "local", d / "pt-fill", env=pt_env)
        runs["pt-remote hit"].append(run_case(model, "local", d / "pt-hit", env=pt_env)["first_step_s"])
        stack.store().r.flushdb()  # an empty farm cache for the cold case
        runs["farm cold"].append(
            run_case(model, "farm", d / "farm-cold", remote=stack.address)["first_step_s"]
        )
        runs["farm hit"].append(
            run_case(model, "farm", d / "farm-hit", remote=stack.address)["first_step_s"]
        )
        runs["precompiled hit"].append(precompiled_hit(model, stack, d))
        print(f"  {model} run {r + 1}: " + ", ".join(f"{c} {v[-1]:.2f}s" for c, v in runs.items()), flush=True)
    med = {c: statistics.median(v) for c, v in runs.items()}
    return {
        "runs": runs,
        "median_s": med,
        "ratios": {
            "farm hit / local warm": med["farm hit"] / med["local warm"],
            "farm cold / local cold": med["farm cold"] / med["local cold"],
            "farm hit / pt-remote hit": med["farm hit"] / med["pt-remote hit"],
            "precompiled hit / local warm": med["precompiled hit"] / med["local warm"],
            "precompiled hit / pt-remote hit": med["precompiled hit"] / med["pt-remote hit"],
            "precompiled hit / farm hit": med["precompiled hit"] / med["farm hit"],
        },
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4))
    for ax, (model, res) in zip(axes if len(results) > 1 else [axes], results.items(), strict=False):
        values = [res["median_s"][c] for c in CASES]
        ax.bar(range(len(CASES)), values, color=["#888", "#bbb", "#c96", "#369", "#6a3", "#3a6"])
        ax.set_xticks(range(len(CASES)), CASES, rotation=30, ha="right")
        ax.set_ylabel("compile call → end of first step (s)")
        ax.set_title(model)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt,cnn")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="torchfarm-bench-") as tmp:
        tmp = Path(tmp)
        pt_port = free_port()
        pt_redis = start_redis_server(pt_port, tmp)
        try:
            # The worker warms Inductor before it registers: minutes on a loaded machine.
            stack = LocalStack(workers=1, workdir=tmp / "stack").start(timeout_s=args.start_timeout)
            try:
                for model in args.models.split(","):
                    print(f"benchmarking {model} ...", flush=True)
                    results[model] = bench_model(model, stack, pt_port, tmp, args.repeats)
            finally:
                stack.stop()
        finally:
            pt_redis.terminate()
            pt_redis.wait()
    print()
    header = f"{'model':6}" + "".join(f"{c:>17}" for c in CASES)
    print(header)
    for model, res in results.items():
        print(f"{model:6}" + "".join(f"{res['median_s'][c]:16.2f}s" for c in CASES))
    print()
    for model, res in results.items():
        print(model + ": " + ", ".join(f"{k} = {v:.2f}" for k, v in res["ratios"].items()))
    (OUT / "compile_bench.json").write_text(json.dumps(results, indent=2))
    plot(results, OUT / "compile_bench.png")
    print(f"\nwrote {OUT / 'compile_bench.json'} and {OUT / 'compile_bench.png'}")


if __name__ == "__main__":
    main()
