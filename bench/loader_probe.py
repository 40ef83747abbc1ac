"""Measures the worker → client path on the default GPT (examples/models.py, batch 8).

    .venv/bin/python bench/loader_probe.py [--second-venv auto|PATH|none] [--batch 8]

1. Worker (this process, empty Inductor cache dir): capture the model with Dynamo,
   `workers.compiler.compile_graph`, write payload and kernels to a bundle directory.
2. Client, a fresh process with an empty TORCHINDUCTOR_CACHE_DIR and TMPDIR, from this
   venv: install kernels, deserialize, then one training step through `torch.compile`
   with a backend that returns the loaded artifact (Dynamo tracing included).
3. The same client from a second venv at another path (tests/second_venv.py).

Not a test: it prints one JSON report. Add `--no-kernels` to also time a client that
gets the payload without kernels (every kernel rebuilt locally).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
    from examples.models import GPTConfig, make_gpt

    return make_gpt(GPTConfig(), batch=batch)


def worker(bundle: Path, batch: int) -> dict[str, Any]:
    import torch
    from torch._guards import TracingContext
    from torch._inductor.utils import fresh_cache

    from workers.compiler import compile_graph

    model, inputs = make(batch)
    captured: dict[str, Any] = {}

    def backend(gm: Any, example_inputs: Any) -> Any:
        captured.update(gm=gm, inputs=example_inputs, fake_mode=TracingContext.get().fake_mode)
        return gm.forward

    torch.compile(model, backend=backend)(*inputs)
    with fresh_cache(dir=str(bundle)):
        t0 = time.perf_counter()
        result = compile_graph(captured["gm"], captured["inputs"], fake_mode=captured["fake_mode"])
        wall = time.perf_counter() - t0
    (bundle / "payload.bin").write_bytes(result.payload)
    for i, k in enumerate(result.kernels):
        (bundle / f"{i}.src").write_bytes(k.source)
        (bundle / f"{i}.bin").write_bytes(k.binary)
    return {
        "compile_graph_s": round(wall, 2),
        "timings_s": {k: round(v, 2) for k, v in result.timings.items()},
        "payload_bytes": len(result.payload),
        "kernels": len(result.kernels),
        "kernel_bytes": sum(len(k.binary) for k in result.kernels),
        "kernel_source_bytes": sum(len(k.source) for k in result.kernels),
    }


def client(bundle: Path, batch: int, with_kernels: bool) -> dict[str, Any]:
    t_start = time.perf_counter()
    import torch

    from sdk.loader import install_kernels, load_compiled
    from torchfarm.fx.hooks import count_kernel_builds

    t_import = time.perf_counter() - t_start
    n = len(list(bundle.glob("*.src")))
    kernels = [((bundle / f"{i}.src").read_bytes(), (bundle / f"{i}.bin").read_bytes()) for i in range(n)]
    payload = (bundle / "payload.bin").read_bytes()
    model, inputs = make(batch)
    reference = copy.deepcopy(model)
    with count_kernel_builds() as builds:
        t0 = time.perf_counter()
        installed = install_kernels(kernels) if with_kernels else 0
        t1 = time.perf_counter()
        compiled = load_compiled(payload)
        t2 = time.perf_counter()
        run = torch.compile(model, backend=lambda gm, ex: compiled)
        loss = run(*inputs)
        loss.backward()
        t3 = time.perf_counter()
        grads = [p.grad.clone() for p in model.parameters()]
        t3b = time.perf_counter()
        run(*inputs).backward()  # no tracing now: the artifact's own step time
        t4 = time.perf_counter()
    t5 = time.perf_counter()
    expected = reference(*inputs)
    expected.backward()
    t6 = time.perf_counter()
    grad_diff = max(
        (g - q.grad).abs().max().item() for g, q in zip(grads, reference.parameters(), strict=True)
    )
    return {
        "python": sys.executable,
        "import_s": round(t_import, 2),
        "install_s": round(t1 - t0, 3),
        "deserialize_s": round(t2 - t1, 2),
        "first_step_s": round(t3 - t2, 2),
        "second_step_s": round(t4 - t3b, 2),
        "eager_step_s": round(t6 - t5, 2),
        "install_plus_deserialize_s": round(t2 - t0, 2),
        "kernels_installed": installed,
        "local_cxx_builds": builds.count,
        "loss_abs_diff": abs(loss.item() - expected.item()),
        "max_grad_abs_diff": grad_diff,
    }


def run_client(python: str, bundle: Path, batch: int, with_kernels: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as empty:
        (Path(empty) / "cache").mkdir()
        (Path(empty) / "tmp").mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TORCHINDUCTOR_CACHE_DIR": str(Path(empty) / "cache"),
            "TMPDIR": str(Path(empty) / "tmp"),
        }
        cmd = [python, __file__, "client", str(bundle), "--batch", str(batch)]
        if not with_kernels:
            cmd.append("--no-kernels")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"python": python, "error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("role", nargs="?", default="all", choices=["all", "client"])
    parser.add_argument("bundle", nargs="?", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--second-venv", default="auto", help="auto, none, or a python path")
    parser.add_argument("--no-kernels", action="store_true")
    args = parser.parse_args()

    if args.role == "client":
        print(json.dumps(client(args.bundle, args.batch, not args.no_kernels)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp)
        report: dict[str, Any] = {"worker": worker(bundle, args.batch)}
        report["client_same_venv"] = run_client(sys.executable, bundle, args.batch, True)
        if args.second_venv != "none":
            python = args.second_venv
            if python == "auto":
                from tests.second_venv import VenvUnavailable, second_venv

                try:
                    python = str(second_venv())
                except VenvUnavailable as e:
                    python = ""
                    report["client_second_venv"] = {"error": str(e)}
            if python:
                report["client_second_venv"] = run_client(python, bundle, args.batch, True)
                if args.no_kernels:
                    report["client_second_venv_no_kernels"] = run_client(python, bundle, args.batch, False)
        elif args.no_kernels:
            report["client_same_venv_no_kernels"] = run_client(sys.executable, bundle, args.batch, False)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
