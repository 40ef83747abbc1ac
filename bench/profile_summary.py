"""Where a first training step's time goes: a cProfile run, summarized as JSON.

examples/train_gpt.py `--profile PATH` profiles its main thread from the compile call
to the end of the first step and writes `summarize(profile)` to PATH; bench/gpu_bench.py
`--profile` runs the warm and hit cases once more that way, so one run on a GPU says
where a hit's time goes (issue: fetch, verify, writing kernels, Triton's driver and
launcher, module loads, Dynamo) and what a local warm start does instead.

Self time is grouped by area (the package of the function's file, or a builtin's own
name: a wait on a child process is `posix.waitpid`, a read on a socket `recv`), so two
cases compare area by area; the top functions by cumulative time name the calls.
The profile sees the main thread only: threads and child processes show as waits.
"""

from __future__ import annotations

import cProfile
import pstats
import re
from collections import defaultdict

AREAS = (
    ("torch/_dynamo/", "dynamo"),
    ("torch/_functorch/", "aot_autograd"),
    ("torch/_inductor/runtime/", "inductor runtime"),
    ("torch/_inductor/", "inductor"),
    ("torch/_subclasses/", "fake tensors"),
    ("torch/fx/", "fx"),
    ("torch/utils/_sympy/", "sympy"),
    ("sympy/", "sympy"),
    ("torch/cuda/", "torch.cuda"),
    ("torch/", "torch other"),
    ("triton/", "triton"),
    ("sdk/", "torchfarm sdk"),
    ("torchfarm/", "torchfarm"),
    ("grpc/", "grpc"),
    ("google/protobuf/", "protobuf"),
    ("cryptography/", "cryptography"),
    ("examples/", "example script"),
)
"""(path fragment, area), first match wins."""

_BUILTIN = re.compile(r"<(?:built-in method|method) '?([\w.]+)'? ?")


def area(filename: str, funcname: str) -> str:
    """The area a function's self time counts to."""
    if filename == "~":  # a builtin: its own name says what it waited on or did
        m = _BUILTIN.search(funcname)
        return "builtin " + (m.group(1) if m else funcname)
    path = filename.replace("\\", "/")
    for fragment, name in AREAS:
        if fragment in path:
            return name
    if "/site-packages/" in path:  # another package: its name
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python" in path or filename.startswith("<frozen"):
        return "python stdlib"
    return "other"


def _where(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    parts = filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-3:])}:{line}({name})"


def summarize(profile: cProfile.Profile, top: int = 40) -> dict:
    """{"total_s", "imports_s", "by_area_s", "top_cumulative", "top_self"}; each top row
    is [where, calls, self seconds, cumulative seconds]. `imports_s` is the time spent
    importing modules, whatever their area (a module's top level runs in its import)."""
    stats = pstats.Stats(profile).stats  # {func: (primitive calls, calls, self, cumulative, callers)}
    by_area: dict[str, float] = defaultdict(float)
    imports_s = 0.0
    for (filename, _, name), (_, _, self_s, cum_s, _) in stats.items():
        by_area[area(filename, name)] += self_s
        if name == "_find_and_load" and "importlib._bootstrap" in filename:
            imports_s = cum_s  # the outermost import's; cProfile counts a recursion once
    rows = [[_where(f), calls, round(self_s, 4), round(cum_s, 4)] for f, (_, calls, self_s, cum_s, _) in stats.items()]
    return {
        "total_s": round(sum(by_area.values()), 4),
        "imports_s": round(imports_s, 4),
        "by_area_s": {k: round(v, 4) for k, v in sorted(by_area.items(), key=lambda kv: -kv[1]) if v >= 0.001},
        "top_cumulative": sorted(rows, key=lambda r: -r[3])[:top],
        "top_self": sorted(rows, key=lambda r: -r[2])[:top],
    }
