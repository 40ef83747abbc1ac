"""The sandboxed child's entry point: `python -m workers.sandbox.child SCRATCH`.

It runs the compiler on what the trusted parent (workers/sandbox/process.py) wrote into the
scratch directory and writes what came of it there: `request.json` names the op and its
inputs (files under `in/`); the child writes its outputs under `out/` and `result.json`
listing them, or an error. JSON and raw bytes only: the parent unpickles nothing.

It has no Redis, no keys and no network; it must not need them. Ops:
- "build": C++ kernel specs (`in/<name>`) → their binaries (`out/<name>.bin`), built as
  many at once as `threads`;
- "whole": a `CompileRequest` (`in/request.pb`) → decoded, compiled whole
  (`compile_graph`): the payload, each kernel's spec and binary, the added guards;
- "decompose": the same request → AOTAutograd's graphs (`decompose_graph`), as the
  fields they are stored as (`out/dec.<field>`);
- "lower": the same request (and its stored decomposition, `in/dec.<field>`) →
  lowered (`lower_graph`): the payload, each kernel's spec, the added guards, the specs
  streamed out under `stream/` as the compile asks for them;
- "ranks": the same request → the first rank sharing its key whose AOTAutograd graphs
  differ from the client rank's, or none (workers/ranks.py's check);
- "export": an export request → its AOTInductor package;
- "triton": a `KernelRequest` → the Triton kernel's binary, assembly and metadata.

The compiling ops replay the vector-ISA record of the parent's Inductor, so the child
picks the same ISA (the one the manifest names) and builds nothing to find it.

`python -P -m workers.sandbox.child --serve CONFIG` is a worker's forkserver
(workers/sandbox/process.py's `Forkserver`): it imports what the ops need, asks the compiler
its questions once, then reads one JSON line per run (`{"scratch": ...}`) on stdin,
forks a child that runs `main` on that scratch under the limits, clears up after it,
and answers its exit status on stdout. No run sees another: each child is a fresh copy
of a server that has run no tenant's input, and after it ends the server kills what it
left (in its own PID namespace, every other process) and empties its /tmp.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn

from workers.sandbox.process import HEADERS
from workers.sandbox.protocol import STREAM, Failure, Op

if TYPE_CHECKING:
    from workers.sandbox.process import Limits

_MEMORY_WORDS = ("out of memory", "virtual memory exhausted", "cannot allocate memory", "memoryerror")


def _set_up(request: dict[str, Any]) -> None:
    """The child's compiler set up as the parent's: its answers, the installed custom-op
    packages, the vector ISA."""
    from torchfarm.fx import toolchain, vecisa
    from torchfarm.fx.torch_library import use_installed

    toolchain.seed_inductor()
    use_installed(tuple(str(m) for m in request.get("installed_ops", ())))
    if request.get("vec_isa"):
        vecisa.seed(request["vec_isa"])


def _build(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    from workers.compiler import start_kernel_build

    _set_up(request)
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
    files = _write(scratch, {f"{name}.bin": binary for name, (binary, _) in zip(names, done, strict=True)})
    return {"files": files, "seconds": [s for _, s in done]}


class _Refused(Exception):
    """A failure whose kind is not the compiler's: "graph" (the graph does not decode),
    "guard" (the compile added a guard the farm cannot ship), "rejected" (the kernel
    checker refused a Triton source), or a lowering's other way: "undecomposable" (the
    stored decomposition does not fit) and "whole" (only the whole-graph path compiles it)."""

    def __init__(self, kind: Failure, message: str):
        super().__init__(message)
        self.kind = kind


def _compile_request(scratch: str, request: dict[str, Any]) -> Any:
    """The `CompileRequest` in `in/request.pb`, the compiler set up (`_set_up`)."""
    from torchfarm.v1 import farm_pb2

    _set_up(request)
    compile_request = farm_pb2.CompileRequest()
    with open(os.path.join(scratch, "in", "request.pb"), "rb") as f:
        compile_request.ParseFromString(f.read())
    return compile_request


def _decoded(scratch: str, request: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The `CompileRequest` in `in/request.pb`, decoded as the parent decoded it: the
    request, its `DecodedGraph` and its Inductor options."""
    from torchfarm.fx import global_state
    from torchfarm.graph.graph_errors import GraphError
    from workers import fakepg
    from workers.runtime import JobFailed, check_options

    compile_request = _compile_request(scratch, request)
    try:
        inductor_options = check_options(compile_request)
        with global_state.applied(compile_request.options):
            decoded = fakepg.decoded(compile_request.graph)
    except (GraphError, JobFailed) as e:
        raise _Refused(Failure.GRAPH, str(e)) from e
    return compile_request, decoded, inductor_options


def _guards(decoded: Any, mark: tuple) -> list[Any]:
    from workers.job import JobFailed, added_guards

    try:
        return list(added_guards(decoded, mark))
    except JobFailed as e:
        raise _Refused(Failure.GUARD, str(e)) from e


def _write(scratch: str, outputs: dict[str, bytes]) -> list[str]:
    for name, data in outputs.items():
        with open(os.path.join(scratch, "out", name), "wb") as out:
            out.write(data)
    return list(outputs)


def _whole(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    from torchfarm.fx import global_state
    from torchfarm.fx import guards as shape_guards
    from workers.compiler import compile_graph
    from workers.fakepg import fake_groups

    compile_request, decoded, inductor_options = _decoded(scratch, request)
    mark = shape_guards.snapshot(decoded.shape_env)
    with fake_groups(compile_request.graph), global_state.applied(compile_request.options):
        result = compile_graph(
            decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
            dynamic=compile_request.options.dynamic, mode=compile_request.options.mode,
            inductor_options=inductor_options,
        )
    guards = _guards(decoded, mark)
    outputs = {"payload.bin": result.payload}
    for i, kernel in enumerate(result.kernels):
        outputs[f"k{i}.src"], outputs[f"k{i}.bin"] = kernel.source, kernel.binary
    return {
        "files": _write(scratch, outputs), "kernels": len(result.kernels), "guards": guards,
        "timings": result.timings, "stats": result.stats, "autotune": result.autotune,
    }


class _Streamed:
    """`lower_graph`'s `on_kernel` in the child: each spec written to `stream/<n>`."""

    def __init__(self, scratch: str):
        self.place = os.path.join(scratch, STREAM)
        os.makedirs(self.place, exist_ok=True)
        self.count = 0

    def __call__(self, spec: bytes) -> None:
        name = os.path.join(self.place, str(self.count))
        with open(name + ".part", "wb") as f:
            f.write(spec)
        os.rename(name + ".part", name)
        self.count += 1


def _lower(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    """The staged lowering: `lower_graph` of the request, taking the stored
    decomposition's graphs (`in/dec.<field>`) when there is one; the specs stream out
    (`_Streamed`) while it runs."""
    from torchfarm.fx import global_state
    from torchfarm.fx import guards as shape_guards
    from workers.aot_seam import Decomposition, NotDecomposable, using_decomposition
    from workers.compiler import NeedsWholeGraph, lower_graph
    from workers.fakepg import fake_groups

    compile_request, decoded, inductor_options = _decoded(scratch, request)
    used: list[str] = []
    seam = None
    mark = shape_guards.snapshot(decoded.shape_env)
    try:
        if request.get("decomposition"):
            fields = {}
            for name in request["decomposition"]:
                with open(os.path.join(scratch, "in", f"dec.{name}"), "rb") as f:
                    fields[str(name).encode()] = f.read()
            seam = using_decomposition(Decomposition.from_fields(fields), decoded, used)
        with fake_groups(compile_request.graph), global_state.applied(compile_request.options):
            lowered = lower_graph(
                decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
                dynamic=compile_request.options.dynamic, mode=compile_request.options.mode,
                inductor_options=inductor_options, on_kernel=_Streamed(scratch), aot_seam=seam,
            )
    except NotDecomposable as e:
        raise _Refused(Failure.UNDECOMPOSABLE, str(e)) from e
    except NeedsWholeGraph as e:
        raise _Refused(Failure.WHOLE, str(e)) from e
    guards = _guards(decoded, mark)
    outputs = {"payload.bin": lowered.payload, **{f"s{i}.spec": s for i, s in enumerate(lowered.specs)}}
    return {
        "files": _write(scratch, outputs), "specs": len(lowered.specs), "guards": guards,
        "timings": lowered.timings, "stats": lowered.stats, "used": bool(used),
        "autotune": lowered.autotune,
    }


def _decompose(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    """The staged compile's decomposition: AOTAutograd's graphs of the request, as the
    fields they are stored as (`out/dec.<field>`)."""
    from torchfarm.fx import global_state
    from workers.aot_seam import NotDecomposable, decompose_graph
    from workers.fakepg import fake_groups

    compile_request, decoded, inductor_options = _decoded(scratch, request)
    options = compile_request.options
    try:
        with fake_groups(compile_request.graph), global_state.applied(options):
            dec = decompose_graph(
                decoded, dynamic=options.dynamic, mode=options.mode, inductor_options=inductor_options,
            )
    except NotDecomposable as e:
        raise _Refused(Failure.UNDECOMPOSABLE, str(e)) from e
    outputs = {f"dec.{name}": data for name, data in dec.to_fields().items()}
    return {"files": _write(scratch, outputs), "seconds": dec.seconds}


def _ranks(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    """The DTensor rank check (workers/ranks.py) of the request: `differs`, the first
    checked rank whose graphs differ from the client rank's, or None."""
    from torchfarm.fx import global_state
    from torchfarm.graph.graph_errors import GraphError
    from workers import ranks
    from workers.compiler import CompileFailed
    from workers.runtime import JobFailed, check_options

    compile_request = _compile_request(scratch, request)
    graph = compile_request.graph
    try:
        inductor_options = check_options(compile_request)
        with global_state.applied(compile_request.options):
            differs = ranks.first_differing(
                graph, ranks.checked_ranks(graph), compile_request.options, inductor_options,
            )
    except (GraphError, JobFailed) as e:
        raise _Refused(Failure.GRAPH, str(e)) from e
    except CompileFailed as e:
        raise _Refused(Failure.COMPILE, str(e)) from e
    return {"files": [], "differs": differs}


def _export(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    """An export request (`in/request.pb`) → its AOTInductor package (`out/package.pt2`)."""
    from torchfarm.graph.graph_errors import GraphError
    from workers.aoti import build_package
    from workers.runtime import JobFailed, check_options

    export_request = _compile_request(scratch, request)
    try:
        result = build_package(export_request.graph, export_request.export, check_options(export_request))
    except (GraphError, JobFailed) as e:
        raise _Refused(Failure.GRAPH, str(e)) from e
    return {"files": _write(scratch, {"package.pt2": result.package}), "timings": result.timings}


def _triton(scratch: str, request: dict[str, Any]) -> dict[str, Any]:
    """A Triton kernel request (`in/request.pb`) compiled for `request["target"]`: its
    binary, assembly and metadata."""
    from torchfarm.kernels.triton_check import KernelRejected
    from torchfarm.v1 import farm_pb2
    from torchfarm.wire import targets
    from workers.triton_compile import KernelCompileError, compile_kernel

    kernel_request = farm_pb2.KernelRequest()
    with open(os.path.join(scratch, "in", "request.pb"), "rb") as f:
        kernel_request.ParseFromString(f.read())
    try:
        result = compile_kernel(kernel_request, targets.parse(str(request["target"])))
    except KernelRejected as e:
        raise _Refused(Failure.REJECTED, str(e)) from e
    except KernelCompileError as e:  # told as the unsandboxed compile tells it
        raise _Refused(Failure.COMPILE, str(e)) from e
    outputs = {"kernel.bin": result.binary, "kernel.asm": result.assembly.encode()}
    return {
        "files": _write(scratch, outputs), "kind": result.kind, "metadata": result.metadata,
        "seconds": result.seconds,
    }


OPS = {
    Op.BUILD: _build, Op.WHOLE: _whole, Op.DECOMPOSE: _decompose, Op.LOWER: _lower, Op.RANKS: _ranks,
    Op.EXPORT: _export, Op.TRITON: _triton,
}


def main(scratch: str) -> int:
    with open(os.path.join(scratch, "request.json")) as f:
        request = json.load(f)
    try:
        result = OPS[request["op"]](scratch, request)
    except _Refused as e:
        result = {"error": {"kind": e.kind, "message": str(e)[:64 * 1024]}}
    except MemoryError:
        result = {"error": {"kind": Failure.MEMORY, "message": "the compile ran out of memory"}}
    except Exception as e:  # the compiler's error: the tenant's input, told back bounded
        message = f"{type(e).__name__}: {e}"[:64 * 1024]
        kind = Failure.MEMORY if any(w in message.lower() for w in _MEMORY_WORDS) else Failure.COMPILE
        result = {"error": {"kind": kind, "message": message}}
    with open(os.path.join(scratch, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_SETTLE_S = 10.0
"""Seconds the server waits, after killing a run's leftovers, for them to be gone."""


def serve(config: dict[str, Any]) -> int:
    """The forkserver's loop (see the module's text)."""
    from workers.sandbox.process import Limits

    _prctl(_PR_SET_DUMPABLE, 0)  # a run's process may not ptrace it or read its memory
    own_namespace = bool(config["pid_namespace"])
    if own_namespace and os.readlink("/proc/self/ns/pid") == config["outer_pid_namespace"]:
        _answer({"error": "the forkserver is not in a PID namespace of its own"})
        return 2
    limits = Limits(**config["limits"])
    root = str(config["root"])
    try:
        headers = _preload(
            root, config.get("vec_isa") or {}, bool(config.get("headers", True)), bool(config.get("warm")),
            tuple(str(m) for m in config.get("installed_ops", ())),
        )
        _answer({"ready": True})
        return _serve_runs(root, limits, own_namespace, headers)
    finally:  # a worker killed outright cannot remove it (its prebuilt headers: about 275 MB)
        _remove_all(root)


def _serve_runs(root: str, limits: Limits, own_namespace: bool, headers: dict[str, tuple[int, ...]]) -> int:
    """One run per request line until the worker's pipe ends (0) or a run changed the
    prebuilt headers (3)."""
    lines = _Lines(0)
    while (line := lines.next()) is not None:
        scratch = str(json.loads(line)["scratch"])
        pid = os.fork()
        if pid == 0:
            _run_forked(scratch, limits, own_namespace)
        _answer({"started": pid})
        status = _wait(pid, lines)
        _clear(pid, own_namespace, root)
        if status is None:  # the worker is gone
            return 0
        if _digests(os.path.join(root, HEADERS)) != headers:
            _answer({"status": status, "ending": True})
            print("a run changed the prebuilt headers: the forkserver ends", file=sys.stderr, flush=True)
            return 3
        _answer({"status": status})
    return 0


def _remove_all(root: str) -> None:
    """Empties the server's directory and removes it (under bwrap it is a mount point,
    which only the worker can remove: it stays, empty)."""
    _empty(root, keep="")
    try:
        os.rmdir(root)
    except OSError:
        pass


_OPS_IMPORT = (
    "torchfarm.fx.torch_library", "torchfarm.fx.decode", "torchfarm.fx.global_state", "torchfarm.fx.guards",
    "torchfarm.graph.graph_errors", "torchfarm.v1.farm_pb2", "workers.aot_seam", "workers.aoti", "workers.compiler",
    "workers.fakepg", "workers.priming", "workers.ranks", "workers.runtime", "workers.triton_compile",
)


def _preload(
    root: str, vec_isa: dict[str, Any], headers: bool, warm: bool, installed_ops: tuple[str, ...] = (),
) -> dict[str, tuple[int, ...]]:
    """Everything the ops import, the worker's custom-op modules (`installed_ops`, the
    operator's list: what each run's `_set_up` would import again), the compiler's
    answers and the parent's vector ISA,
    (`headers`) Inductor's precompiled headers for CPU kernels (`_prebuild_headers`), and
    (`warm`) the worker's warm-up compile (workers/priming.py), a fixed graph of the
    farm's own: what each run would otherwise spend its first seconds on. Returns the
    headers' digests."""
    for module in _OPS_IMPORT:
        importlib.import_module(module)
    from torchfarm.fx import toolchain, vecisa
    from torchfarm.fx.torch_library import use_installed

    use_installed(installed_ops)

    toolchain.seed_inductor()
    if vec_isa:
        vecisa.seed(vec_isa)
    else:
        vecisa.picked()  # the probe, run here: each run's `vecisa.seed` checks it against the parent's
    if warm:
        from workers.priming import warm_inductor

        try:
            warm_inductor(compile=True)
        except Exception as e:  # each run then pays the same set-up, as without it
            print(f"the forkserver's warm-up failed: {type(e).__name__}: {e}", file=sys.stderr)
    return _prebuild_headers(os.path.join(root, HEADERS)) if headers else {}


_HEADER_SEED = 'extern "C" void torchfarm_header_seed() {}\n'


def _prebuild_headers(headers: str) -> dict[str, tuple[int, ...]]:
    """Inductor precompiles its C++ prefix header on a process's first kernel build,
    into a directory fixed at import: for a fork, one run's scratch, rebuilt by every
    run (seconds each). The server builds it here instead, once for vectorized kernels
    and once for scalar ones, by building a trusted kernel of each kind; Inductor's
    cache of the header paths, which every fork copies, then spares the runs the build.
    A kind not built here (the cpp_wrapper's header) a run builds in its own scratch
    (`_run_forked`). The digests let the server notice a run that changed them."""
    from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
    from torchfarm.fx.internals import resolve
    from workers.compiler import start_kernel_build

    _point_headers_at(resolve("codecache"), headers)
    for vectorized in (True, False):
        args = spec_args({"main_code": _HEADER_SEED, "device_type": "cpu", "extra_flags": (),
                          "needs_vec_isa": vectorized})
        start_kernel_build(KernelSpec("CppPythonBindingsCodeCache", args, output=0, outputs=1).to_bytes())()
    return _digests(headers)


def _point_headers_at(codecache: Any, headers: str) -> None:
    codecache._HEADER_DIR = headers
    codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")


def _digests(top: str) -> dict[str, tuple[int, ...]]:
    """Each path under `top` (relative), with its inode, mode, size, mtime and ctime: a
    run that writes, replaces or re-times a file changes its ctime, which it cannot set
    back (that takes CAP_SYS_TIME). Cheaper than hashing the headers (hundreds of MB)
    after every run."""
    found: dict[str, tuple[int, ...]] = {}
    for parent, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            found[os.path.relpath(path, top)] = (
                info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
            )
    return found


def _run_forked(scratch: str, limits: Limits, own_namespace: bool) -> NoReturn:
    """The forked child: its own process group, output to the scratch's log, the
    limits, the scratch's directories; then the op."""
    from workers.sandbox.process import apply_limits, scratch_env

    code = 70
    try:
        os.setpgid(0, 0)
        if not own_namespace:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(_PR_SET_DUMPABLE, 1)
        log = os.open(os.path.join(scratch, "stderr.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        apply_limits(limits)
        from torchfarm.fx.internals import resolve

        _point_headers_at(resolve("codecache"), os.path.join(scratch, HEADERS))
        os.chdir(scratch)
        os.environ.update(scratch_env(scratch))
        tempfile.tempdir = None
        code = main(scratch)
    except BaseException:  # noqa: BLE001  the fork must end here, whatever happened
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, lines: _Lines) -> int | None:
    """The run's exit status (negative: the signal that ended it), or None if the
    worker closed the pipe meanwhile (the run is killed)."""
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, 0], [], [])
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                return os.waitstatus_to_exitcode(status)
            if not lines.fill():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
    finally:
        os.close(pidfd)


def _clear(pid: int, own_namespace: bool, keep: str) -> None:
    """Kills whatever the run left running and, in a namespace of its own, empties the
    places it could leave files for the next run."""
    if not own_namespace:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    deadline = time.monotonic() + _SETTLE_S
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # every process of the namespace but init and this one
        except ProcessLookupError:
            pass
        if not _others_alive() or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    for place in ("/tmp", "/dev/shm"):
        _empty(place, keep)


def _empty(place: str, keep: str) -> None:
    """Removes what is in `place`, on its own file system only (the server's directory,
    bound into /tmp, is another), and never `keep` or a directory above it."""
    try:
        device = os.lstat(place).st_dev
    except OSError:
        return
    for name in _listdir(place):
        path = os.path.join(place, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_dev != device or path == keep:
            continue
        if stat.S_ISDIR(info.st_mode):
            if keep.startswith(path + os.sep):
                _empty(path, keep)
            else:
                shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


def _others_alive() -> bool:
    """Whether a process of this namespace other than init and this one still runs."""
    me = os.getpid()
    for name in _listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            return True
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _answer(message: dict[str, Any]) -> None:
    os.write(1, json.dumps(message).encode() + b"\n")


class _Lines:
    """Lines read from a file descriptor, unbuffered, so `select` on it stays true."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def fill(self) -> bool:
        """Reads what is there; False at the end."""
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        return bool(chunk)

    def next(self) -> str | None:
        """The next line, or None at the end."""
        while b"\n" not in self.buffer:
            if not self.fill():
                return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.exit(serve(json.loads(sys.argv[2])))
    sys.exit(main(sys.argv[1]))
