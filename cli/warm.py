"""`torchfarm warm SCRIPT.py [args]`: run a training script to fill the farm's cache.

    torchfarm warm [--remote grpc://host:port] [--steps N] [--json] SCRIPT.py [args...]

The script runs in a fresh Python process (`python -m sdk.warm_mode`, with the farm's
address in TORCHFARM_REMOTE) in warm mode: each `sdk.compile` model compiles on the
farm, blocking, and the script stops at the end of step N (default 1; 0 runs it to its
end). Then this prints what was compiled and what was already cached (sdk/warm_mode.py).
It exits 1 when a graph is not on the farm (the farm was down or refused it; such a
graph ran eagerly, as a local compile would fill no cache) or none was compiled, so a
prewarm job that warmed nothing fails.
Options go before SCRIPT.py; everything after it is the script's own arguments. With
--json, stdout is the report alone and the script's output goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from cli.parser import count

if TYPE_CHECKING:
    from sdk.report import GraphReport


def add_warm_parser(sub: argparse._SubParsersAction) -> None:
    warm = sub.add_parser(
        "warm", help="run SCRIPT.py so that its sdk.compile models compile on the farm ahead of time"
    )
    warm.add_argument("--remote", default="", help="grpc://host:port (default TORCHFARM_REMOTE)")
    warm.add_argument(
        "--steps", type=count(0), default=1,
        help="stop at the end of N steps: when a compiled model is called the (N+1)-th time "
        "(default 1; 0 runs the script to its end)",
    )
    warm.add_argument("--json", action="store_true", help="print the report as JSON")
    warm.add_argument("script", help="the Python script to run")
    warm.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    warm.set_defaults(run=_warm)


def _warm(args: argparse.Namespace) -> int:
    remote = args.remote or os.environ.get("TORCHFARM_REMOTE", "")
    if not remote:
        late = [a for a in args.args if a == "--remote" or a.startswith("--remote=")]
        hint = f" ({late[0]} after the script is the script's own argument: put it before)" if late else ""
        print(f"torchfarm warm: give --remote or set TORCHFARM_REMOTE{hint}", file=sys.stderr)
        return 2
    if not Path(args.script).is_file():
        print(f"torchfarm warm: no such script: {args.script}", file=sys.stderr)
        return 2
    if args.steps < 0:
        print("torchfarm warm: --steps must not be negative", file=sys.stderr)
        return 2
    from sdk.report import COMPILED, HIT, JOINED, REPORT_ENV, STEPS_ENV, WarmReport  # torch-free

    with tempfile.TemporaryDirectory(prefix="torchfarm-warm-") as tmp:
        report_path = Path(tmp) / "report.json"
        env = {**os.environ, "TORCHFARM_REMOTE": remote, REPORT_ENV: str(report_path),
               STEPS_ENV: str(args.steps)}
        spec = importlib.util.find_spec("sdk")
        if spec is not None and spec.origin:  # a source checkout: the child finds it too
            root = str(Path(spec.origin).resolve().parent.parent)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        # With --json, stdout carries the report alone: the script's output goes to stderr.
        status = subprocess.run(
            [sys.executable, "-m", "sdk.warm_mode", args.script, *args.args], env=env,
            stdout=sys.stderr if args.json else None,
        ).returncode
        if not report_path.exists():
            print(f"torchfarm warm: the script ended (status {status}) without a report",
                  file=sys.stderr)
            return status or 1
        report = WarmReport.from_json(report_path.read_text())
    print(report.to_json() if args.json else report, flush=True)
    if status:
        print(f"torchfarm warm: the script exited with status {status}", file=sys.stderr)
        return status
    missing = [g for g in report.compiles if g.outcome not in (HIT, COMPILED, JOINED)]
    if missing:
        print(f"torchfarm warm: {len(missing)} of {len(report.compiles)} graphs are not on the farm:",
              file=sys.stderr)
        for error, graphs in _by_error(missing).items():
            print(f"  {graphs}: {error}", file=sys.stderr)
        return 1
    if not report.compiles:
        print("torchfarm warm: the script compiled no graph on the farm", file=sys.stderr)
        return 1
    return 0


def _by_error(graphs: list[GraphReport]) -> dict[str, str]:
    """Each error whole (the table cuts it) with the graphs that met it."""
    found: dict[str, list[str]] = {}
    for g in graphs:
        found.setdefault(g.error or g.outcome, []).append(f"graph {g.graph} of {g.model}")
    return {error: ", ".join(names) for error, names in found.items()}
