"""The sandbox's processes: the child each run happens in, its limits, bubblewrap, and
the forkserver runs fork from. What a run sends and reads back is protocol.py's; the
compile steps over it are executor.py's.

The Celery pool process holds the signing key, the record key and the Redis
credentials. Running Inductor and g++ on a tenant's graph in that process gives the
graph (and any compiler bug it reaches) all three. So every compile step on a tenant's
input runs in a child:

- "bwrap": under bubblewrap, with a read-only view of the system, no network
  (`--unshare-net`: not even the loopback Redis), its own PID namespace (the parent's
  `/proc/<pid>/environ` is out of sight), a tmpfs `/tmp`, the job's scratch directory the
  one writable place, and the key files and secret directories overlaid with nothing.
- "process": the same child without bubblewrap (where user namespaces are not allowed):
  the scrubbed environment and the rlimits, but the same filesystem, network and PID
  view as the worker. Degraded: the worker says so at start-up and in its registration.
- "off": in this process, as before (development only).
- "auto" (the default): "bwrap" if bubblewrap runs here, else "process".

In every child mode the environment is an allow-list (`child_env`), and rlimits bound
memory (RLIMIT_AS, or RLIMIT_DATA for GPU kinds: workers/sandbox_limits.py) and CPU. Inputs and outputs are files in the scratch directory:
a JSON request and result, and raw bytes (no pickle). See docs/security.md.

A worker's sandbox keeps a `Forkserver`: one child, started in the sandbox on the first
run, that has imported torch and Inductor and asked the compiler its questions, and
forks a fresh child for each run (a copy of a process that has seen no tenant's input).
After each run it kills everything the run left (in bwrap, every other process of its
PID namespace) and empties its /tmp, so no run sees another's. A run that finds it busy,
or a sandbox without one, starts a child of its own as before.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchfarm.envnames import PREFIX
from workers import sandbox_limits
from workers.sandbox.protocol import RESULT_FILE, Failure, Op, SandboxFailed, read_outputs, write_inputs

if TYPE_CHECKING:
    from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

MODES = ("auto", "bwrap", "process", "off")
WATCH_S = 0.2
"""Seconds between a run's `watch` calls."""

_ENV_NAMES = frozenset({
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
    "LD_LIBRARY_PATH", "CC", "CXX", "CUDA_HOME", "CUDA_PATH", "ROCM_PATH",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "TORCHFARM_TOOLCHAIN_CACHE_DIR",
})
_ENV_PREFIXES = ("TORCHINDUCTOR_", "TRITON_", "OMP_", "MKL_", "KMP_")
"""What a compile may see of the worker's environment: the compiler's and Inductor's own
settings. Everything else (TORCHFARM_* URLs with passwords, key paths, cloud
credentials) stays out; the directories Inductor and Triton write to are the scratch's."""
_SCRATCH_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR", "HOME")

DEFAULT_HIDDEN = ("/run/secrets", "/var/run/secrets", "/etc/torchfarm")
"""Where deployments mount secrets (compose secrets, k8s service-account tokens and
secret volumes): overlaid with an empty tmpfs in the bwrap sandbox when they exist."""


class SandboxUnavailable(RuntimeError):
    """The sandbox asked for cannot run on this machine."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 0
    """The memory rlimit of the child (and the compilers it starts); 0: none."""
    memory_kind: str = "as"
    """Which rlimit bounds memory: "as" (RLIMIT_AS) or "data" (RLIMIT_DATA, for GPU
    kinds, whose runtime reserves address space: workers/sandbox_limits.py)."""
    cpu_s: int = 0
    """RLIMIT_CPU of the child, per process; 0: none."""
    wall_s: float = 0.0
    """Wall seconds before the child is killed; 0: none (Celery's limits still apply)."""
    file_bytes: int = 0
    """RLIMIT_FSIZE: the largest file the child (or a compiler) may write; 0: none."""


@dataclass(frozen=True)
class Sandbox:
    mode: str
    """"bwrap", "process" or "off" (resolved: never "auto")."""
    limits: Limits = Limits()
    hidden: tuple[str, ...] = ()
    """Files and directories the bwrap child must not see (key files, secret dirs)."""
    scratch_root: str = ""
    """Where per-job scratch directories are made; "" is the system's temp dir."""
    python: str = sys.executable
    forkserver: Forkserver | None = field(default=None, compare=False, repr=False)
    """Where runs fork from (`for_worker` gives each worker one); None: a child per run."""
    prebuilt_headers: bool = True
    """Whether the forkserver prebuilds Inductor's CPU prefix headers."""
    warm_compile: bool = False
    """Whether the forkserver runs the worker's warm-up compile (workers/priming.py)
    before its first run, as a worker's main process does before its pool forks."""
    devices: tuple[str, ...] = ()
    """Device nodes bound into the bwrap child (a GPU kind's: workers/sandbox_limits.py)."""
    installed_ops: tuple[str, ...] = ()
    """The worker's custom-op modules (TORCHFARM_INSTALLED_OP_MODULES), imported by the
    forkserver before its first run, so no run pays their import (transformers': seconds)."""

    @property
    def degraded(self) -> bool:
        return self.mode != "bwrap"

    def run(self, op: Op, request: Mapping[str, object], files: Mapping[str, bytes],
            max_output_bytes: int, forked: bool = True,
            watch: Callable[[str], None] | None = None) -> tuple[dict, dict[str, bytes]]:
        """Runs `workers.sandbox.child` `op` on `request` (JSON) and `files` (name → bytes) in
        a fresh scratch directory; returns its result (JSON) and output files, each
        checked: names it declared, inside the scratch, `max_output_bytes` in all.
        `forked`: in a fork of the forkserver, if there is one and it is free. `watch`
        is called with the scratch directory every `WATCH_S` while the run goes on."""
        server = self.forkserver if forked else None
        if server is not None and server.acquire():
            try:
                for _ in range(2):  # a server found dead as the run was sent is started again, once
                    root = server.root(self)
                    if not root:
                        break
                    try:
                        return self._run(op, request, files, max_output_bytes, root, server, watch)
                    except _NotTaken:
                        server.stop()
            finally:
                server.release()
        return self._run(op, request, files, max_output_bytes, self.scratch_root or None, None, watch)

    def close(self) -> None:
        """Stops the forkserver, if one runs (a later run starts it again)."""
        if self.forkserver is not None:
            self.forkserver.stop()

    def _run(self, op: Op, request: Mapping[str, object], files: Mapping[str, bytes],
             max_output_bytes: int, root: str | None, server: Forkserver | None,
             watch: Callable[[str], None] | None) -> tuple[dict, dict[str, bytes]]:
        scratch = tempfile.mkdtemp(prefix="tfjob-", dir=root)
        tick = None if watch is None else functools.partial(watch, scratch)
        try:
            write_inputs(scratch, op, request, files)
            if server is not None:
                server.run(self, scratch, tick)
            else:
                self._start_and_wait(scratch, tick)
            return read_outputs(scratch, max_output_bytes)
        except SandboxFailed as e:
            if e.kind != Failure.MEMORY:
                raise
            limit = f"{self.limits.memory_bytes >> 20} MiB" if self.limits.memory_bytes else "none set"
            # Short, since job records keep a message's tail: the limit, then the compiler's last words.
            tail = " ".join(str(e)[-800:].split())
            raise SandboxFailed(Failure.MEMORY, f"the compile ran past its memory limit ({limit}): ...{tail}") from e
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _start_and_wait(self, scratch: str, tick: Callable[[], None] | None = None) -> None:
        argv = [self.python, "-m", "workers.sandbox.child", scratch]
        if self.mode == "bwrap":
            argv = bwrap_argv(scratch, self.hidden, devices=self.devices) + argv
        log_path = os.path.join(scratch, "stderr.log")  # a file: the child may say a lot
        with open(log_path, "wb") as err:
            proc = subprocess.Popen(
                limited(argv, self.limits), env=child_env(os.environ, scratch), cwd=scratch,
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
            )
            try:
                _wait_ticking(proc, self.limits.wall_s or None, tick)
            except subprocess.TimeoutExpired as e:
                _kill(proc)
                raise SandboxFailed(Failure.CPU, f"the compile ran past its wall limit ({self.limits.wall_s:.0f}s)") from e
            except BaseException:  # Celery's soft limit, raised while waiting
                _kill(proc)
                raise
        if proc.returncode != 0 and not os.path.exists(os.path.join(scratch, RESULT_FILE)):
            raise _crash(proc.returncode, _tail(log_path), self.limits)


class _NotTaken(Exception):
    """The forkserver ended before it took a run: nothing of the run happened."""


READY_TIMEOUT_S = 300.0
"""Seconds a forkserver may take to import torch and Inductor and say it is ready."""
MAX_REPLY = 64 * 1024
SERVER_LOG = "server.log"
HEADERS = "headers"
"""The forkserver's directory (under its root) of prebuilt precompiled headers."""


class Forkserver:
    """One sandboxed child that a sandbox's runs fork from (see the module's text).

    Started on the first run, in the sandbox's mode and limits; started again after it
    died or a run was stopped (past the wall limit, or an exception such as Celery's
    soft limit while waiting). One run at a time: `acquire` fails while one is in
    flight. A server that cannot start is given up, with a warning: the sandbox then
    starts a child per run, as without one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._root = ""
        self._group = 0
        self._ready = False
        self._spawned = 0.0
        self._mode = ""
        self._stopper: weakref.finalize | None = None
        self.broken = ""
        """Why the server could not start; "" while it can."""
        self.runs = 0
        """Runs served by the current server."""

    def acquire(self) -> bool:
        return not self.broken and self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    @property
    def directory(self) -> str:
        """The current server's directory (its runs' scratch, its headers), or ""."""
        return self._root

    @property
    def pid(self) -> int | None:
        """The running server's process (bwrap's, in that mode), or None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self, box: Sandbox) -> None:
        """Starts the server without waiting for it to be ready (the first run waits):
        a worker's pool process calls this as it starts, so that the imports and header
        builds are done before its first job. The server probes the vector ISA itself
        if this process has not (each run still checks it picks the parent's)."""
        from torchfarm.fx.vecisa import known_record

        with self._lock:
            if self._proc is None and not self.broken:
                self._spawn(box, known_record())

    def root(self, box: Sandbox) -> str:
        """The directory the runs make their scratch in, the server started and ready;
        "" if it cannot start."""
        from torchfarm.fx.vecisa import probe_record

        if self._ready and self._proc is not None and self._proc.poll() is not None:
            self.stop()  # it ended after serving (a run killed it, or it found tampering)
        try:
            if self._proc is None:
                self._spawn(box, probe_record())
            if not self._ready:
                self._wait_ready()
        except SandboxUnavailable as e:
            self.broken = str(e)
            log.warning("the sandbox's forkserver did not start, so each compile starts a child "
                        "of its own: %s", e)
            return ""
        return self._root

    def run(self, box: Sandbox, scratch: str, tick: Callable[[], None] | None = None) -> None:
        """Runs the request written in `scratch` (under `root`) in a fork of the server;
        fails as `Sandbox._start_and_wait` does, or raises `_NotTaken` if the server
        ended before it took the run (it answers as it forks)."""
        self._sweep(scratch)
        try:
            self._send({"scratch": scratch})
            started = self._receive(READY_TIMEOUT_S)
        except (EOFError, OSError, ValueError, TimeoutError) as e:
            raise _NotTaken from e
        self._group = int(started.get("started", 0)) if box.mode != "bwrap" else 0
        try:
            reply = self._receive(box.limits.wall_s or None, tick)
        except TimeoutError as e:
            self.stop()
            raise SandboxFailed(Failure.CPU, f"the compile ran past its wall limit ({box.limits.wall_s:.0f}s)") from e
        except (EOFError, OSError, ValueError) as e:
            tail = _last_line(_tail(os.path.join(scratch, "stderr.log"))) or str(e)
            self.stop()
            raise SandboxFailed(Failure.CRASH, f"the sandbox's forkserver ended during the compile: {tail[:500]}") from e
        except BaseException:
            self.stop()
            raise
        self._group = 0
        self.runs += 1
        status = reply.get("status")
        if reply.get("ending"):  # it found the run changed what every run shares
            log.warning("the sandbox's forkserver ended after a run changed its prebuilt headers")
            self.stop()
        if not isinstance(status, int):
            self.stop()
            raise SandboxFailed(Failure.CRASH, "the sandbox's forkserver answered out of turn")
        if status != 0 and not os.path.exists(os.path.join(scratch, RESULT_FILE)):
            raise _crash(status, _tail(os.path.join(scratch, "stderr.log")), box.limits)

    def stop(self) -> None:
        """Kills the server and whatever it runs, and removes its directory."""
        if self._stopper is not None:
            self._stopper()
        if self._group:
            _kill_group(self._group)
        self._proc, self._root, self._group, self._stopper, self.runs = None, "", 0, None, 0

    def _spawn(self, box: Sandbox, vec_isa: dict) -> None:
        root = tempfile.mkdtemp(prefix="tfbox-", dir=box.scratch_root or None)
        self._mode = box.mode
        config = {
            "root": root,
            "limits": dataclasses.asdict(box.limits),
            "pid_namespace": box.mode == "bwrap",
            "outer_pid_namespace": os.readlink("/proc/self/ns/pid"),
            "vec_isa": vec_isa,
            "headers": box.prebuilt_headers,
            "warm": box.warm_compile,
            "installed_ops": list(box.installed_ops),
        }
        # -P: the working directory is not on the server's import path.
        argv = [box.python, "-P", "-m", "workers.sandbox.child", "--serve", json.dumps(config)]
        if box.mode == "bwrap":
            argv = bwrap_argv(root, box.hidden, chdir="/", server=True, devices=box.devices) + argv
        with open(os.path.join(root, SERVER_LOG), "wb") as err:
            # No limits but no core dumps: its forked runs set their own (child.py).
            self._proc = subprocess.Popen(
                limited(argv, Limits()), env=child_env(os.environ, root), cwd=root, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )
        self._root, self._ready, self._spawned = root, False, time.monotonic()
        self._stopper = weakref.finalize(self, _stop_server, self._proc, root)

    def _wait_ready(self) -> None:
        try:
            reply = self._receive(READY_TIMEOUT_S)
        except (TimeoutError, EOFError, OSError, ValueError) as e:
            why = _last_line(_tail(os.path.join(self._root, SERVER_LOG))) or repr(e)
            self.stop()
            raise SandboxUnavailable(why[:500]) from e
        if reply.get("ready") is not True:
            self.stop()
            raise SandboxUnavailable(str(reply.get("error", reply))[:500])
        self._ready = True
        log.info("the sandbox's forkserver is ready (%s, %.1f s after it started)",
                 self._mode, time.monotonic() - self._spawned)

    def _sweep(self, keep: str) -> None:
        """Removes what earlier runs left in the server's directory."""
        for name in os.listdir(self._root):
            path = os.path.join(self._root, name)
            if path != keep and name not in (SERVER_LOG, HEADERS):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)

    def _send(self, message: dict) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")
        self._proc.stdin.flush()

    def _receive(self, timeout: float | None, tick: Callable[[], None] | None = None) -> dict:
        """The server's next reply line; TimeoutError past `timeout`, EOFError if it ended.
        `tick` is called every `WATCH_S` while none has come."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            if tick is not None:
                left = WATCH_S if left is None else min(left, WATCH_S)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                if tick is not None:
                    tick()
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise EOFError("the forkserver's output ended")
            data += chunk
            if len(data) > MAX_REPLY:
                raise ValueError("the forkserver's reply is too long")
        reply = json.loads(data)
        if not isinstance(reply, dict):
            raise ValueError("the forkserver's reply is not an object")
        return reply


def _stop_server(proc: subprocess.Popen, root: str) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
    _kill(proc)
    shutil.rmtree(root, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _rlimits(limits: Limits) -> list[tuple[int, int, int]]:
    """`limits` as (resource, soft, hard) triples; no core dumps in any case."""
    triples = []
    if limits.memory_bytes:
        kind = sandbox_limits.memory_rlimit(limits.memory_kind)
        triples.append((kind, limits.memory_bytes, limits.memory_bytes))
    if limits.cpu_s:
        triples.append((resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 5))
    if limits.file_bytes:
        triples.append((resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes))
    return [*triples, (resource.RLIMIT_CORE, 0, 0)]


def apply_limits(limits: Limits) -> None:
    """Sets `limits` on this process; every process it starts inherits them."""
    for kind, soft, hard in _rlimits(limits):
        resource.setrlimit(kind, (soft, hard))


_RLIMIT_EXEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rlimit_exec.py")


def limited(argv: list[str], limits: Limits) -> list[str]:
    """`argv` run under `limits`: a fresh interpreter sets them and execs it
    (workers/sandbox/rlimit_exec.py), so bwrap and everything it starts inherit them,
    and no Python runs in the forked copy of this threaded process (`preexec_fn` did)."""
    return [sys.executable, "-I", "-S", _RLIMIT_EXEC, json.dumps(_rlimits(limits)), "--", *argv]


def _tail(path: str, size: int = 16 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _crash(returncode: int, stderr: str, limits: Limits) -> SandboxFailed:
    tail = _last_line(stderr)
    if returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and limits.cpu_s):
        return SandboxFailed(Failure.CPU, f"the compile ran past its CPU limit ({limits.cpu_s}s)")
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return SandboxFailed(Failure.MEMORY, "the child ran out of memory")
    return SandboxFailed(Failure.CRASH, f"the sandboxed compile ended with status {returncode}: {tail[:500]}")


def _wait_ticking(proc: subprocess.Popen, timeout: float | None, tick: Callable[[], None] | None) -> None:
    """`proc.wait(timeout)`, calling `tick` every `WATCH_S` meanwhile."""
    if tick is None:
        proc.wait(timeout=timeout)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
        try:
            proc.wait(timeout=WATCH_S if left is None else min(left, WATCH_S))
            return
        except subprocess.TimeoutExpired:
            tick()


def child_env(environ: Mapping[str, str], scratch: str) -> dict[str, str]:
    """The child's environment: the allow-list of the worker's, and scratch directories."""
    env = {
        k: v for k, v in environ.items()
        if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)
    }
    env.update(scratch_env(scratch))
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


def scratch_env(scratch: str) -> dict[str, str]:
    """The variables that point a child's caches, temp files and home into `scratch`."""
    return {name: os.path.join(scratch, "home") if name == "HOME" else scratch for name in _SCRATCH_ENV}


def bwrap_argv(scratch: str, hidden: Iterable[str], chdir: str = "", server: bool = False,
               devices: Iterable[str] = ()) -> list[str]:
    """bubblewrap's command line: the system read-only, no network, a PID namespace of
    its own, a private /tmp, the `devices` nodes, the scratch writable, and every hidden
    path empty, as is the directory that holds the scratch (the runs beside it are other
    pool processes', other tenants'). The interpreter's directories that an emptied
    directory held are bound back read-only (`python_to_bind_back`). The working
    directory is `chdir`, else the scratch. A child dies with the thread that started it
    (`--die-with-parent`); a `server` (the forkserver, which may outlive that thread)
    ends when its stdin does, that is, with the worker process."""
    argv = [
        "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        *(() if server else ("--die-with-parent",)), "--new-session", "--cap-drop", "ALL",
    ]
    for path in devices:
        argv += ["--dev-bind", path, path]
    emptied = emptied_dirs(scratch, hidden)
    for path in emptied:
        argv += ["--tmpfs", path]
    for path in python_to_bind_back(scratch, emptied):
        argv += ["--ro-bind", path, path]
    for path in hidden:
        if os.path.exists(path) and not os.path.isdir(path):
            argv += ["--ro-bind", "/dev/null", path]
    return [*argv, "--bind", scratch, scratch, "--chdir", chdir or scratch]


def emptied_dirs(scratch: str, hidden: Iterable[str]) -> list[str]:
    """The directories a child sees empty: /tmp, the directory that holds `scratch`
    (unless /tmp already covers it), and the hidden directories."""
    holder = os.path.dirname(os.path.abspath(scratch))
    emptied = ["/tmp"]
    if holder != "/" and not _within(holder, "/tmp"):
        emptied.append(holder)
    emptied += [p for p in hidden if os.path.isdir(p) and not any(_within(p, e) for e in emptied)]
    return emptied


def _within(path: str, directory: str) -> bool:
    return os.path.commonpath([path, directory]) == directory


_CHILD_PACKAGES = ("workers", "torchfarm")
"""What the child (`python -m workers.sandbox.child`) imports of the farm."""


def python_to_bind_back(scratch: str, emptied: Iterable[str] = ("/tmp",)) -> list[str]:
    """The interpreter's directories that lie under an `emptied` directory (a venv or a
    checkout made under /tmp, say), which the child would not see: bound back
    read-only. Never an emptied directory itself, nor one holding `scratch` (its
    siblings are other runs'). The import path's '' is the working directory, and the
    farm's packages count wherever they were imported from: an editable install finds
    them on no import path."""
    emptied = list(emptied)
    imported_from = [
        os.path.dirname(os.path.dirname(os.path.abspath(init)))
        for name in _CHILD_PACKAGES
        if (init := getattr(sys.modules.get(name), "__file__", None))
    ]
    candidates = {
        os.path.abspath(p)
        for p in (sys.prefix, os.path.dirname(sys.executable), *sys.path,
                  *os.environ.get("PYTHONPATH", "").split(os.pathsep))
        if p
    }
    candidates.update(imported_from)
    if "" in sys.path:
        candidates.add(os.getcwd())
    chosen: list[str] = []
    for path in sorted(candidates, key=len):
        if (
            not any(path != e and _within(path, e) for e in emptied) or not os.path.isdir(path)
            or _within(scratch, path)
            or any(_within(path, c) for c in chosen)
        ):
            continue
        chosen.append(path)
    return chosen


def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap can make its namespaces here, and why not."""
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (Debian package bubblewrap)"
    try:
        done = subprocess.run(
            [*bwrap_argv(tempfile.gettempdir(), ()), "true"],
            capture_output=True, timeout=30, check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"bwrap did not run: {e}"
    if done.returncode != 0:
        return False, f"bwrap failed: {done.stderr.decode(errors='replace').strip()[:300]}"
    return True, ""


def resolve(mode: str) -> str:
    """The sandbox mode to run: "auto" becomes "bwrap" where it works, else "process"
    (with a warning); an explicit "bwrap" that cannot run is an error."""
    if mode not in MODES:
        raise ValueError(f"TORCHFARM_SANDBOX={mode!r}: want one of {', '.join(MODES)}")
    if mode in ("process", "off"):
        if mode == "off":
            log.warning("TORCHFARM_SANDBOX=off: compiles run in the process that holds the signing "
                        "key and the Redis credentials (development only)")
        return mode
    ok, why = bwrap_works()
    if ok:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxUnavailable(f"TORCHFARM_SANDBOX=bwrap, but {why}")
    log.warning("the compile sandbox is DEGRADED (process mode): %s; compiles run in a child with "
                "a scrubbed environment and rlimits, but see the worker's files and network", why)
    return "process"


CREDENTIALS_IN_HOME = (".aws", ".azure", ".config", ".docker", ".kube", ".ssh", ".netrc", ".git-credentials", ".pgpass", ".triton")
"""What of the worker user's home a child must not see: cloud and cluster credentials
(an S3 blob store's keys in ~/.aws), the trust and token files under ~/.config, and
Triton's default cache (other tenants' kernels)."""

CREDENTIAL_VARIABLES = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "GOOGLE_APPLICATION_CREDENTIALS",
                        "AZURE_CONFIG_DIR", "KUBECONFIG", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""Variables naming credential files or the worker's own caches (the compiled graphs of
every tenant it served), wherever the operator put them."""


def worker_secrets(environ: Mapping[str, str]) -> list[str]:
    """The paths of a worker's environment a child must not see: every
    `TORCHFARM_*_FILE` (a setting read from a file: a Redis URL with its password, a
    key; torchfarm/settings.py), CREDENTIAL_VARIABLES' paths and CREDENTIALS_IN_HOME.
    The child is given its own caches and home in its scratch (`scratch_env`)."""
    paths = [v for k, v in environ.items() if k.startswith(PREFIX) and k.endswith("_FILE")]
    for name in CREDENTIAL_VARIABLES:
        paths += environ.get(name, "").split(os.pathsep)
    home = environ.get("HOME") or os.path.expanduser("~")
    paths += [os.path.join(home, name) for name in CREDENTIALS_IN_HOME]
    return [p for p in paths if p and os.path.isabs(p) and os.path.exists(p)]


def hidden_paths(secret_files: Iterable[str], extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The paths a bwrap child must not see: the key files themselves, and the usual
    secret mounts."""
    # Real paths: bwrap makes each mount point inside the new root, where a symlinked
    # parent (/var/run -> /run in Debian images) points out of it. A path under a hidden
    # directory is covered by that directory's empty tmpfs.
    paths = dict.fromkeys(os.path.realpath(p) for p in (*secret_files, *DEFAULT_HIDDEN, *extra) if p)
    dirs = [p for p in paths if os.path.isdir(p)]
    return tuple(p for p in paths if not any(p != d and p.startswith(d + os.sep) for d in dirs))


def limits_for(settings: WorkerSettings, device: str = "cpu") -> Limits:
    """A worker's sandbox limits for compiles of `device` kind (workers/sandbox_limits.py)."""
    return Limits(
        memory_bytes=settings.sandbox_memory_mb << 20,
        memory_kind=sandbox_limits.policy_for(device).memory_rlimit,
        cpu_s=settings.sandbox_cpu_s,
        wall_s=float(settings.hard_time_limit_s),
        file_bytes=settings.max_artifact_bytes + (64 << 20),
    )


def child_command(box: Sandbox, argv: list[str], scratch: str) -> tuple[list[str], dict[str, str]]:
    """`argv` as the sandbox would run it in a child of its own: the command line
    (under bubblewrap in bwrap mode, the device nodes bound, under the box's limits) and
    its environment. For checks that must hold where compiles run."""
    if box.mode == "bwrap":
        argv = bwrap_argv(scratch, box.hidden, devices=box.devices) + argv
    return limited(argv, box.limits), child_env(os.environ, scratch)


def for_worker(settings: WorkerSettings, mode: str, warm_compile: bool = False, device: str = "cpu",
               environ: Mapping[str, str] | None = None) -> Sandbox:
    """The sandbox of a worker whose mode `resolve` chose: its limits (as `device`
    kind's policy says, workers/sandbox_limits.py), the key files and secret mounts
    hidden from it, the device's nodes, and its forkserver (`warm_compile`: warmed up by
    a compile, for a worker that lowers graphs)."""
    policy = sandbox_limits.policy_for(device)
    secrets = (settings.signing_key_file, settings.record_key_file, *worker_secrets(os.environ if environ is None else environ))
    return Sandbox(
        mode=mode,
        limits=limits_for(settings, device),
        hidden=hidden_paths(secrets, settings.sandbox_hidden),
        scratch_root=settings.sandbox_dir,
        forkserver=Forkserver() if settings.sandbox_forkserver else None,
        prebuilt_headers=settings.sandbox_headers,
        warm_compile=warm_compile,
        devices=policy.nodes(),
        installed_ops=settings.installed_op_modules,
    )
