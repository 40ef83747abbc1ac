"""The sandboxed child's entry point: `python -m workers.sandboxed SCRATCH`.

It runs the compiler on what the trusted parent (workers/sandbox.py) wrote into the
scratch directory and writes what came of it there: `request.json` names the op and its
inputs (files under `in/`); the child writes its outputs under `out/` and `result.json`
listing them, or an error. JSON and raw bytes only: the parent unpickles nothing.

It has no Redis, no keys and no network; it must not need them. Ops:
- "build": C++ kernel specs (`in/<name>`) → their binaries (`out/<name>.bin`), built as
  many at once as `threads`, with the vector-ISA record of the parent's Inductor
  replayed, so the child picks the same ISA and builds nothing to find it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_MEMORY_WORDS = ("out of memory", "virtual memory exhausted", "cannot allocate memory", "memoryerror")


def _build(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    from torchfarm.fx import toolchain, vecisa
    from workers.compiler import start_kernel_build

    toolchain.seed_inductor()
    if request.get("vec_isa"):
        vecisa.seed(request["vec_isa"])
    names = [str(n) for n in request["specs"]]
    builds = []
    for name in names:
        with open(os.path.join(scratch, "in", name), "rb") as spec:
            builds.append(start_kernel_build(spec.read()))

    def timed(build: Any) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        kernel = build()
        return kernel.binary, time.perf_counter() - t0

    threads = max(1, min(len(builds), int(request.get("threads", 1))))
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(timed, builds))
    files = []
    for name, (binary, _) in zip(names, done, strict=True):
        with open(os.path.join(scratch, "out", f"{name}.bin"), "wb") as out:
            out.write(binary)
        files.append(f"{name}.bin")
    return {"files": files, "seconds": [s for _, s in done]}


OPS = {"build": _build}


def main(scratch: str) -> int:
    with open(os.path.join(scratch, "request.json")) as f:
        request = json.load(f)
    try:
        result = OPS[request["op"]](scratch, request)
    except MemoryError:
        result = {"error": {"kind": "memory", "message": "the compile ran out of memory"}}
    except Exception as e:  # the compiler's error: the tenant's input, told back bounded
        message = f"{type(e).__name__}: {e}"[:64 * 1024]
        kind = "memory" if any(w in message.lower() for w in _MEMORY_WORDS) else "compile"
        result = {"error": {"kind": kind, "message": message}}
    with open(os.path.join(scratch, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
