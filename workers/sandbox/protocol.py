"""The file protocol between a worker and its sandboxed child (workers/sandbox/child.py).

A run's scratch directory holds `request.json` (the op and its JSON arguments) and
`in/<name>` (raw bytes) from the parent; the child writes `result.json` (a JSON object:
its results and the names of its files, or an `error` of a `Failure` kind) and
`out/<name>`, and a lowering streams its kernel specs to `stream/<n>`. No pickle on
either side. The parent reads every file by descriptor, never through a link, within a
bound, and checks names and kinds before anything trusts them: the child ran a tenant's
input.
"""

from __future__ import annotations

import enum
import json
import os
import stat
from collections.abc import Iterable, Mapping

RESULT_FILE = "result.json"
REQUEST_FILE = "request.json"
MAX_RESULT_JSON = 4 * 1024 * 1024
"""Bytes of the child's result.json the parent reads at most."""
STREAM = "stream"
"""A run's directory (in its scratch) of the kernel specs a lowering streams out as it
asks for them: `<n>` for the n-th, renamed into place once written (`SpecStream`)."""


class Op(enum.StrEnum):
    """What a run asks the child to do (child.py's `OPS`)."""

    BUILD = "build"
    """C++ kernel builds from their specs."""
    WHOLE = "whole"
    """The whole-graph compile."""
    DECOMPOSE = "decompose"
    """AOTAutograd up to its partition."""
    LOWER = "lower"
    """Inductor on the graph, C++ builds deferred; specs streamed out."""
    RANKS = "ranks"
    """The DTensor rank check."""
    EXPORT = "export"
    """An AOTInductor package."""
    TRITON = "triton"
    """A Triton kernel for a named target."""


class Failure(enum.StrEnum):
    """Why a sandboxed run failed. The child reports the kinds in `CHILD_FAILURES`; the
    parent finds `CPU` and `CRASH` itself (workers/sandbox/process.py)."""

    COMPILE = "compile"
    """The compiler's own error: the tenant's input."""
    GRAPH = "graph"
    """The graph did not decode."""
    GUARD = "guard"
    """The compile added a shape guard the farm cannot ship."""
    REJECTED = "rejected"
    """The kernel checker refused a Triton source."""
    UNDECOMPOSABLE = "undecomposable"
    """The stored decomposition does not fit: the lowering decomposes in place."""
    WHOLE = "whole"
    """Only the whole-graph path compiles the graph."""
    MEMORY = "memory"
    """Past the memory limit."""
    CPU = "cpu"
    """Past the CPU or wall limit."""
    CRASH = "crash"
    """Anything else: killed, no result, a malformed result."""


CHILD_FAILURES = frozenset(Failure) - {Failure.CPU, Failure.CRASH}
"""The kinds a child may report (child.py's `Refused` and `main`)."""


class SandboxFailed(Exception):
    """A sandboxed run failed, for the reason `kind` says."""

    def __init__(self, kind: Failure, message: str):
        super().__init__(message)
        self.kind = kind


def write_inputs(scratch: str, op: Op, request: Mapping[str, object], files: Mapping[str, bytes]) -> None:
    os.makedirs(os.path.join(scratch, "in"))
    os.makedirs(os.path.join(scratch, "out"))
    for name, data in files.items():
        check_name(name)
        with open(os.path.join(scratch, "in", name), "wb") as f:
            f.write(data)
    with open(os.path.join(scratch, REQUEST_FILE), "w") as f:
        json.dump({"op": op, **request}, f)


def read_outputs(scratch: str, max_output_bytes: int) -> tuple[dict, dict[str, bytes]]:
    """The child's result and the files it names, checked before anything trusts them.
    Read by descriptor (`read_at`): a leftover of the run cannot swap a file or out/ for
    a link between a check and an open, to a file only this process can read."""
    try:
        top = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)  # the parent made it
    except OSError as e:  # removed with a server that ended after the run
        raise SandboxFailed(Failure.CRASH, f"the sandboxed compile left no result: {e}") from e
    try:
        return _read_result(top, max_output_bytes)
    finally:
        os.close(top)


def _read_result(scratch: int, max_output_bytes: int) -> tuple[dict, dict[str, bytes]]:
    raw = read_at(scratch, RESULT_FILE, MAX_RESULT_JSON + 1)
    if raw is None:
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile left no result")
    if len(raw) > MAX_RESULT_JSON:
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's result is too large")
    try:
        result = json.loads(raw)
    except ValueError as e:
        raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's result is not JSON: {e}") from e
    if not isinstance(result, dict):
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's result is not an object")
    error = result.get("error")
    if error is not None:
        kind = error.get("kind") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if not isinstance(kind, str) or kind not in CHILD_FAILURES or not isinstance(message, str):
            raise SandboxFailed(Failure.CRASH, "the sandboxed compile's error is malformed")
        raise SandboxFailed(Failure(kind), message[:64 * 1024])
    names = result.get("files", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's file list is malformed")
    try:
        out = os.open("out", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=scratch)
    except OSError as e:
        raise SandboxFailed(Failure.CRASH, "the sandboxed compile's out/ is not a plain directory") from e
    try:
        return result, _read_files(out, names, max_output_bytes)
    finally:
        os.close(out)




def _read_files(out: int, names: Iterable[str], max_bytes: int) -> dict[str, bytes]:
    """The files `names` of the directory open as `out`, `max_bytes` in all."""
    files: dict[str, bytes] = {}
    total = 0
    for name in names:
        check_name(name)
        data = read_at(out, name, max_bytes - total + 1)
        if data is None:
            raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's output {name!r} is not there")
        total += len(data)
        if total > max_bytes:
            raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's outputs exceed {max_bytes} bytes")
        files[name] = data
    return files


def read_at(directory: int, name: str, limit: int) -> bytes | None:
    """At most `limit` bytes of the regular file `name` in the directory open as
    `directory`, never through a link (the child wrote it, and could have made it point
    at a file only this process can read); None if there is no such file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a link
        raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's {name!r} is not a plain file") from e
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxFailed(Failure.CRASH, f"the sandboxed compile's {name!r} is not a plain file")
        return f.read(limit)


def check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or "\\" in name or len(name) > 100:
        raise SandboxFailed(Failure.CRASH, f"a sandbox file name that is not plain: {name[:100]!r}")
