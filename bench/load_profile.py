"""Where a farm hit's load goes, on the default GPT (examples/models.py, batch 8).

    .venv/bin/python bench/load_profile.py [--batch 8] [--repeat 1]

The worker step of bench/loader_probe.py writes a bundle (payload, kernels) and the
worker's probe record (`torchfarm.fx.vecisa.probed_toolchain`). Then fresh client processes, each
with an empty TORCHINDUCTOR_CACHE_DIR and TMPDIR, load it side by side:

- `no_record`: the manifest carries no probe record (the load before issue 19's item 2);
- `record`: it does, so the load starts no compiler.

Each client runs the load under cProfile and reports the phases (seed the probes, key
the kernels, write the binaries, deserialize) and, inside deserialize, the cumulative
time of the torch functions that do the work: unpickling, importing each wrapper
module, dlopen'ing each kernel library, writing files. Compiler processes are counted
with a wrapper on PATH. Not a test: it prints one JSON report (docs/load-profile.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

INSIDE = {
    "unpickle": [("_pickle.loads", "~"), ("'load' of '_pickle.Unpickler'", "~")],
    "import wrapper modules": [("load_by_key_path", "codecache.py")],
    "dlopen kernels": [("__init__", "ctypes/__init__.py")],
    "write files": [("write_atomic", "codecache.py")],
    "key kernels (load_async)": [("load_async", "codecache.py")],
    "probe builds (check_build)": [("check_build", "cpu_vec_isa.py")],
}
"""Report name → (substring of a function's name, end of its file) whose cumulative
time is shown."""


def _cumulative(stats: pstats.Stats, parts: list[tuple[str, str]]) -> float:
    total = 0.0
    for (path, _, func), row in stats.stats.items():  # type: ignore[attr-defined]
        if any(name in func and path.endswith(suffix) for name, suffix in parts):
            total += row[3]
    return round(total, 3)


def client(bundle: Path, use_record: bool, top: int = 0) -> dict[str, Any]:
    t_start = time.perf_counter()
    import torch  # noqa: F401

    from sdk import loader, vecisa
    from torchfarm.fx import toolchain as local_toolchain

    t_import = time.perf_counter() - t_start
    n = len(list(bundle.glob("*.src")))
    kernels = [((bundle / f"{i}.src").read_bytes(), (bundle / f"{i}.bin").read_bytes()) for i in range(n)]
    payload = (bundle / "payload.bin").read_bytes()
    record = json.loads((bundle / "toolchain.json").read_text()) if use_record else {}
    profile = cProfile.Profile()
    with loader.count_kernel_builds() as builds:
        profile.enable()
        t0 = time.perf_counter()
        local_toolchain.seed_inductor()
        if record:
            vecisa.seed(record["vec_isa"])
        else:
            loader._skip_isa_probe()
        t1 = time.perf_counter()
        installed = loader.install_kernels(kernels, record)
        t2 = time.perf_counter()
        loader.load_compiled(payload)
        t3 = time.perf_counter()
        profile.disable()
    phases = {"seed probes": t1 - t0, "key and write kernels": t2 - t1, "deserialize": t3 - t2}
    stats = pstats.Stats(profile, stream=sys.stderr)
    if top:
        stats.sort_stats("cumulative").print_stats(top)
    inside = {label: _cumulative(stats, parts) for label, parts in INSIDE.items()}
    return {
        "import_s": round(t_import, 2),
        "load_s": round(t3 - t0, 3),
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "cumulative_s": inside,
        "kernels": n,
        "installed": installed,
        "cxx_builds": builds.count,
    }


def spy_path(directory: Path, log_file: Path) -> str:
    directory.mkdir()
    for name in ("g++", "gcc", "c++", "cc", "clang", "clang++"):
        import shutil

        real = shutil.which(name)
        script = directory / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log_file}"\n'
                          + (f'exec "{real}" "$@"\n' if real else "exit 127\n"))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return f"{directory}{os.pathsep}{os.environ['PATH']}"


def run_client(bundle: Path, use_record: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as empty:
        root = Path(empty)
        (root / "cache").mkdir()
        (root / "tmp").mkdir()
        log_file = root / "calls.log"
        log_file.touch()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "cache"),
            "TMPDIR": str(root / "tmp"),
            "PATH": spy_path(root / "spy", log_file),
        }
        env.pop("CXX", None)
        # The machine's toolchain record exists for both: the first process on a machine
        # asks the compiler for its version once (torchfarm/fx/toolchain.py); that is not a hit's cost.
        prime = "from torchfarm.fx.fingerprint import local_fingerprint as f; f()"
        subprocess.run([sys.executable, "-c", prime], env=env, check=True, timeout=600)
        log_file.write_text("")
        cmd = [sys.executable, __file__, "client", str(bundle)] + ([] if use_record else ["--no-record"])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
        calls = log_file.read_text().splitlines()
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["compiler_processes"] = len(calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", nargs="?", default="all", choices=["all", "client"])
    parser.add_argument("bundle", nargs="?", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--bundle-dir", type=Path, help="keep (or reuse) the worker's bundle here")
    parser.add_argument("--top", type=int, default=0, help="client: print its top N functions to stderr")
    args = parser.parse_args()
    if args.role == "client":
        print(json.dumps(client(args.bundle, not args.no_record, args.top)))
        return

    from bench.loader_probe import worker
    from torchfarm.fx.vecisa import probed_toolchain

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle_dir or Path(tmp)
        report: dict[str, Any] = {}
        if not (bundle / "toolchain.json").exists():
            bundle.mkdir(parents=True, exist_ok=True)
            report["worker"] = worker(bundle, args.batch)
            (bundle / "toolchain.json").write_text(json.dumps(probed_toolchain()))
        for _ in range(args.repeat):
            for name, use in (("no_record", False), ("record", True)):
                report.setdefault(name, []).append(run_client(bundle, use))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
