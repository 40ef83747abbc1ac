"""Train a small model for a few steps through the farm, or locally, and time it.

    python examples/train_gpt.py --remote grpc://127.0.0.1:50051      # through the farm
    python examples/train_gpt.py --backend local                       # plain torch.compile
    python examples/train_gpt.py --backend eager                       # no compile at all

The only change from a torch.compile training script is the `sdk.compile` line. The
script prints one JSON line: the time from the compile call to the end of the first
training step (Dynamo tracing, compile or fetch, first forward and backward), later
step times, the loss, and how far loss and gradients are from eager PyTorch. With
`--count`, also how many compilers ran in this process and its children: C++ builds,
Triton compiles and ptxas runs (bench/gpu_bench.py and bench/counting/). With
`--profile PATH`, where the first step's time went (bench/profile_summary.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import sdk  # noqa: E402
from examples.models import TINY_GPT, GPTConfig, make_cnn, make_gpt, make_mlp  # noqa: E402

MODELS = {
    "gpt": lambda cfg, batch: make_gpt(cfg, **batch),
    # The same blocks, two more of them: its kernels are the GPT's (bench/scaling.py).
    "gpt-deeper": lambda cfg, batch: make_gpt(dataclasses.replace(cfg, layers=cfg.layers + 2), **batch),
    "tiny-gpt": lambda cfg, batch: make_gpt(TINY_GPT, **(batch or {"batch": 4})),
    "cnn": lambda cfg, batch: make_cnn(**batch),
    "mlp": lambda cfg, batch: make_mlp(**batch),
}
"""Each takes the GPT's config (`--gpt`) and the batch size (`--batch`, {} for the model's own)."""


def gpt_config(spec: str) -> GPTConfig:
    """`layers=6,width=512,block=256,heads=8` over the default GPTConfig."""
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    changes = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--gpt: {name!r} is none of {sorted(fields)}")
        changes[name] = int(value)
    return dataclasses.replace(GPTConfig(), **changes)


def loss_of(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    out = model(*inputs)
    return out if out.dim() == 0 else out.float().pow(2).mean()


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def child_counts() -> dict[str, int]:
    """Triton compiles, ptxas runs, Triton's C builds and autotune benchmarks in this
    process and the compile workers it started, as bench/counting/ and
    bench/gpu_bench.py's wrappers appended them to the file TORCHFARM_BENCH_COUNTS names."""
    path = os.environ.get("TORCHFARM_BENCH_COUNTS", "")
    lines = Path(path).read_text().split() if path and Path(path).exists() else []
    return {k: lines.count(k) for k in ("triton", "triton-cache-hit", "ptxas", "triton-cc", "autotune")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt")
    ap.add_argument("--backend", choices=["farm", "local", "eager"], default="farm")
    ap.add_argument("--mode", default=None, help='torch.compile mode, e.g. "max-autotune"')
    ap.add_argument("--gpt", default="", help="GPT size over the default: layers=6,width=512,block=256")
    ap.add_argument("--batch", type=int, default=0, help="batch size (0: the model's own)")
    ap.add_argument("--count", action="store_true", help="count C++ builds, Triton compiles, ptxas runs")
    ap.add_argument("--remote", default=os.environ.get("TORCHFARM_REMOTE", ""))
    ap.add_argument("--fallback", choices=["local", "error"], default="error")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare loss and grads with eager")
    ap.add_argument("--device", default="cpu", help='"cpu" or "cuda" (scripts/gpu_check.sh)')
    ap.add_argument("--profile", type=Path, default=None,
                    help="profile the first step; write where its time went to this JSON file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    model, inputs = MODELS[args.model](gpt_config(args.gpt), {"batch": args.batch} if args.batch else {})
    model = model.to(args.device)
    inputs = tuple(x.to(args.device) for x in inputs)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    eager = copy.deepcopy(model) if args.check else None

    counting = contextlib.ExitStack()
    builds = None
    if args.count:
        from torchfarm.fx.hooks import count_kernel_builds

        builds = counting.enter_context(count_kernel_builds())
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    mode = {"mode": args.mode} if args.mode else {}
    if args.backend == "farm":
        compiled = sdk.compile(model, remote=args.remote, fallback=args.fallback, **mode)
    elif args.backend == "local":
        compiled = torch.compile(model, **mode)
    else:
        compiled = model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step_times, losses = [], []
    first_grads = None
    for step in range(args.steps):
        s = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(compiled, inputs)
        loss.backward()
        if step == 0:
            first_grads = grads(model)
        opt.step()
        sync()  # GPU work is asynchronous: time it to its end
        step_times.append(time.perf_counter() - (t0 if step == 0 else s))
        if step == 0 and profile is not None:
            profile.disable()
            from bench.profile_summary import summarize

            args.profile.write_text(json.dumps(summarize(profile)))
        losses.append(loss.item())
    counting.close()

    report = {
        "model": args.model,
        "backend": args.backend,
        "device": args.device,
        "first_step_s": step_times[0],
        "later_step_s": sorted(step_times[1:])[len(step_times[1:]) // 2] if args.steps > 1 else None,
        "loss": losses[0],
    }
    if builds is not None:
        report["compiles"] = {"cpp": builds.count, **child_counts()}
    if eager is not None:
        eager_loss = loss_of(eager, inputs)
        eager_loss.backward()
        report["loss_abs_err"] = abs(eager_loss.item() - losses[0])
        report["grad_max_abs_err"] = max(
            (a - b).abs().max().item() for a, b in zip(first_grads, grads(eager), strict=False)
        )
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
