"""Runs `examples/train_gpt.py` cases in fresh processes and tabulates them.

Shared by the demo (`make demo`) and the benchmark (`make bench`): each case is a new
interpreter with its own Inductor cache dir, so "cold" and "hit" mean what they say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_gpt.py"


def run_case(
    model: str,
    backend: str,
    cache_dir: Path,
    *,
    remote: str = "",
    steps: int = 3,
    check: bool = False,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    device: str = "cpu",
    args: tuple[str, ...] = (),
) -> dict:
    """One case in a new interpreter; `args` are more of train_gpt.py's flags."""
    cmd = [python, str(TRAIN), "--model", model, "--backend", backend, "--steps", str(steps), *args]
    if device != "cpu":
        cmd += ["--device", device]
    if remote:
        cmd += ["--remote", remote]
    if check:
        cmd.append("--check")
    full_env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
        **(env or {}),
    }
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{model}/{backend} failed:\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["log"] = [l for l in proc.stderr.splitlines() if "torchfarm" in l]
    return report


def table(rows: list[tuple[str, float, str]]) -> str:
    """Rows of (case, seconds, note) as an aligned text table."""
    width = max(len(r[0]) for r in rows)
    lines = [f"{'case'.ljust(width)}  first step  note", f"{'-' * width}  ----------  ----"]
    lines += [f"{name.ljust(width)}  {secs:9.2f}s  {note}" for name, secs, note in rows]
    return "\n".join(lines)
