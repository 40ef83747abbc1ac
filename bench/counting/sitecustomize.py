"""Counts Triton compiles and autotune benchmarks in every Python process of a benchmarked run.

bench/gpu_bench.py puts this folder first on PYTHONPATH and names a file in
TORCHFARM_BENCH_COUNTS; Python imports this module at start-up, in the training process
and in the compile workers Inductor starts (their PYTHONPATH is the parent's sys.path).
When `triton.knobs` is imported, its compilation listener is set: Triton calls it once
per `triton.compile`, saying whether its own cache answered, and a line is appended to
the file ("triton" or "triton-cache-hit"). When Inductor's Triton runtime is imported, a
kernel benchmarking its configs appends "autotune" (a hit whose kernels found their
autotune records benchmarks none). The ptxas and CC wrappers gpu_bench.py writes append
"ptxas" and "triton-cc". Appends of one short line are atomic, so processes may share
the file.

Neither Triton nor torch is imported here: start-up stays as fast as without this module.
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


def _set_listener(knobs: Any) -> None:
    knobs.compilation.listener = _listener


def _count_benchmarks(heuristics: Any) -> None:
    """Each time a Triton kernel benchmarks its configs to pick one (at its first launch,
    when no autotune record names the winner), "autotune" is appended."""
    autotuner = heuristics.CachingAutotuner
    real = autotuner.benchmark_all_configs

    def benchmark_all_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        _append("autotune")
        return real(self, *args, **kwargs)

    autotuner.benchmark_all_configs = benchmark_all_configs


_AFTER_IMPORT = {
    "triton.knobs": _set_listener,
    "torch._inductor.runtime.triton_heuristics": _count_benchmarks,
}
"""Modules, and what to do to each once it ran."""


class _Instrument(importlib.abc.MetaPathFinder):
    """Finds the modules of `_AFTER_IMPORT` as the other finders do, and instruments each
    once it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _AFTER_IMPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _AFTER_IMPORT[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _FILE:
    sys.meta_path.insert(0, _Instrument())
