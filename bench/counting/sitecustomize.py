"""Counts Triton compiles in every Python process of a benchmarked run.

bench/gpu_bench.py puts this folder first on PYTHONPATH and names a file in
TORCHFARM_BENCH_COUNTS; Python imports this module at start-up, in the training process
and in the compile workers Inductor starts (their PYTHONPATH is the parent's sys.path).
When `triton.knobs` is imported, its compilation listener is set: Triton calls it once
per `triton.compile`, saying whether its own cache answered, and a line is appended to
the file ("triton" or "triton-cache-hit"). The ptxas wrapper gpu_bench.py writes appends
"ptxas". Appends of one short line are atomic, so processes may share the file.

Triton is never imported here: start-up stays as fast as without this module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

_FILE = os.environ.get("TORCHFARM_BENCH_COUNTS", "")


def _append(word: str) -> None:
    with open(_FILE, "a") as f:
        f.write(word + "\n")


def _listener(*, cache_hit: bool, **_: Any) -> None:
    _append("triton-cache-hit" if cache_hit else "triton")


class _SetListener(importlib.abc.MetaPathFinder):
    """Finds `triton.knobs` as the other finders do, and sets the listener once it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "triton.knobs":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            module.compilation.listener = _listener

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _FILE:
    sys.meta_path.insert(0, _SetListener())
