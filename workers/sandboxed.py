"""The sandboxed child's entry point: `python -m workers.sandboxed SCRATCH`.

It runs the compiler on what the trusted parent (workers/sandbox.py) wrote into the
scratch directory and writes what came of it there: `request.json` names the op and its
inputs (files under `in/`); the child writes its outputs under `out/` and `result.json`
listing them, or an error. JSON and raw bytes only: the parent unpickles nothing.

It has no Redis, no keys and no network; it must not need them. Ops:
- "build": C++ kernel specs (`in/<name>`) → their binaries (`out/<name>.bin`), built as
  many at once as `threads`;
- "whole": a `CompileRequest` (`in/request.pb`) → decoded, compiled whole
  (`compile_graph`): the payload, each kernel's spec and binary, the added guards.

Both replay the vector-ISA record of the parent's Inductor, so the child picks the same
ISA (the one the manifest names) and builds nothing to find it.
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


class _Refused(Exception):
    """A failure whose kind is not the compiler's: "graph" (the graph does not decode) or
    "guard" (the compile added a guard the farm cannot ship)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _whole(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    from torchfarm.fx import global_state, toolchain, vecisa
    from torchfarm.fx import guards as shape_guards
    from torchfarm.fx.customops import use_installed
    from torchfarm.fx.decode import decode_graph
    from torchfarm.graph_errors import GraphError
    from torchfarm.v1 import farm_pb2
    from workers.compiler import compile_graph
    from workers.fakepg import fake_groups
    from workers.runtime import JobFailed, added_guards, check_options

    toolchain.seed_inductor()
    use_installed(tuple(str(m) for m in request.get("installed_ops", ())))
    if request.get("vec_isa"):
        vecisa.seed(request["vec_isa"])
    compile_request = farm_pb2.CompileRequest()
    with open(os.path.join(scratch, "in", "request.pb"), "rb") as f:
        compile_request.ParseFromString(f.read())
    try:
        inductor_options = check_options(compile_request)
        with global_state.applied(compile_request.options):
            decoded = decode_graph(compile_request.graph)
    except (GraphError, JobFailed) as e:
        raise _Refused("graph", str(e)) from e
    mark = shape_guards.snapshot(decoded.shape_env)
    with fake_groups(compile_request.graph.groups), global_state.applied(compile_request.options):
        result = compile_graph(
            decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
            dynamic=compile_request.options.dynamic, mode=compile_request.options.mode,
            inductor_options=inductor_options,
        )
    try:
        guards = added_guards(decoded, mark)
    except JobFailed as e:
        raise _Refused("guard", str(e)) from e
    outputs = {"payload.bin": result.payload}
    for i, kernel in enumerate(result.kernels):
        outputs[f"k{i}.src"], outputs[f"k{i}.bin"] = kernel.source, kernel.binary
    for name, data in outputs.items():
        with open(os.path.join(scratch, "out", name), "wb") as out:
            out.write(data)
    return {
        "files": list(outputs), "kernels": len(result.kernels), "guards": list(guards),
        "timings": result.timings, "stats": result.stats,
    }


OPS = {"build": _build, "whole": _whole}


def main(scratch: str) -> int:
    with open(os.path.join(scratch, "request.json")) as f:
        request = json.load(f)
    try:
        result = OPS[request["op"]](scratch, request)
    except _Refused as e:
        result = {"error": {"kind": e.kind, "message": str(e)[:64 * 1024]}}
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
