"""This machine's C/C++ toolchain answers, asked once per machine instead of per process.

A farm hit must start no compiler (issue 19), yet the fingerprint (torchfarm/fx/fingerprint.py) holds
the compiler's version line and what `-march=native` resolves to, and Inductor asks the
compiler again in every process: `cpp_compiler_search` runs `--version`,
`_is_intel_compiler` runs `--version`, `get_compiler_version_info` runs `-v`. Each is
`functools.cache`d for the process only.

So the answers to those queries are kept in a small JSON file, named by a digest of
what they depend on: the compiler binary as found on PATH (resolved path, size, mtime,
inode), the CPU (/proc/cpuinfo's model and flags, for `-march=native`), Inductor's
compiler and march settings, and the torch version. A process that finds the file asks
the compiler nothing: `seed_inductor` fills Inductor's caches by calling those very
functions while their `subprocess` calls are answered from the file. A query the file
lacks runs for real (and is added), so a torch that asks something new is slow, not
wrong. The file only saves time: everything in it is what this machine's compiler said,
and a changed compiler or CPU names another file.

Torch internals relied on (torch 2.13.0, pinned in tests/unit/test_toolchain.py):
`torch._inductor.cpp_builder` reaches the compiler through its module global
`subprocess` (`check_output`), from `cpp_compiler_search` (`lru_cache(1)`),
`_is_intel_compiler`, `get_compiler_version_info` and `_is_gcc_version_less_than`
(`functools.cache`); `get_cpp_compiler()` searches `config.cpp.cxx`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import threading
import types
from collections.abc import Sequence
from typing import Any

from torchfarm.files import write_atomic
from torchfarm.fx import internals
from torchfarm.fx.internals import resolve

log = logging.getLogger(__name__)

RECORD_FORMAT = "torchfarm.toolchain/1"
"""Schema of a toolchain record file."""

_QUERY_TIMEOUT_S = 30.0
"""Upper bound for one compiler query (`--version`, `-v`, `-Q --help=target`)."""

_lock = threading.RLock()


def cache_dir() -> str:
    """Where records live: TORCHFARM_TOOLCHAIN_CACHE_DIR, else ~/.cache/torchfarm/toolchain."""
    return os.environ.get("TORCHFARM_TOOLCHAIN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchfarm", "toolchain"
    )


def candidates() -> list[str]:
    """The compiler names Inductor searches, in its order (`config.cpp.cxx`; None, which
    means "install one with conda", is skipped here as Inductor skips it by default)."""
    config = resolve("inductor_config")

    cxx = config.cpp.cxx
    names = cxx if isinstance(cxx, (list, tuple)) else (cxx,)
    return [n for n in names if isinstance(n, str)]


def _binary_identity(name: str) -> list[Any]:
    path = shutil.which(name)
    if path is None:
        return [name, None]
    real = os.path.realpath(path)
    st = os.stat(real)
    return [name, path, real, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def _cpu_identity() -> list[str]:
    # -march=native is resolved from the CPU; two CPUs with one model line and one
    # flag set resolve alike.
    wanted = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU part")
    seen: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                name, _, value = line.partition(":")
                if name.strip() in wanted:
                    seen[name.strip()] = value.strip()
    except OSError:
        seen["processor"] = platform.processor()
    return [f"{k}={seen[k]}" for k in sorted(seen)]


def identity() -> str:
    """Digest of everything the compiler's answers depend on."""
    import torch

    body = {
        "compilers": [_binary_identity(n) for n in candidates()],
        "cpu": _cpu_identity(),
        "march": internals.cpp_march(),
        "machine": platform.machine(),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class Record:
    """Answers of compiler queries: argv → (returncode, stdout, stderr), as text."""

    def __init__(self, path: str, answers: dict[str, list[Any]]):
        self.path = path
        self.answers = answers
        self.asked = 0
        """Queries this process had to run because the record lacked them."""

    def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        """The answer to `argv`, from the record, or by running it once (then kept)."""
        key = json.dumps(list(argv))
        with _lock:
            answer = self.answers.get(key)
            if answer is None:
                answer = list(_run(argv))
                self.answers[key] = answer
                self.asked += 1
                self._save()
        return int(answer[0]), str(answer[1]), str(answer[2])

    def _save(self) -> None:
        body = {"format": RECORD_FORMAT, "answers": self.answers}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            write_atomic(self.path, json.dumps(body, sort_keys=True).encode())
        except OSError as e:  # a read-only home only costs the queries again
            log.debug("toolchain record %s not written: %s", self.path, e)


def _run(argv: Sequence[str]) -> tuple[int, str, str]:
    env = {**os.environ, "LC_ALL": "C"}
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, env=env, timeout=_QUERY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return 127, "", str(e)
    return done.returncode, done.stdout, done.stderr


@functools.cache
def record() -> Record:
    """This machine's record, read from disk once per process (empty when there is none)."""
    path = os.path.join(cache_dir(), f"{identity()[:32]}.json")
    answers: dict[str, list[Any]] = {}
    try:
        with open(path) as f:
            body = json.load(f)
        if body.get("format") == RECORD_FORMAT and isinstance(body.get("answers"), dict):
            answers = {
                str(k): v for k, v in body["answers"].items()
                if isinstance(v, list) and len(v) == 3
            }
    except (OSError, ValueError):
        pass
    return Record(path, answers)


def _replayed_subprocess(rec: Record) -> types.ModuleType:
    """`subprocess` as cpp_builder sees it while seeding: compiler queries answered by
    the record, with `check_output`'s contract (bytes, CalledProcessError)."""
    shim = types.ModuleType("subprocess")
    shim.__dict__.update(subprocess.__dict__)

    def check_output(cmd: Any, *args: Any, **kwargs: Any) -> bytes:
        if not isinstance(cmd, (list, tuple)) or not all(isinstance(c, str) for c in cmd):
            return subprocess.check_output(cmd, *args, **kwargs)
        rc, out, err = rec.run(cmd)
        text = out + err if kwargs.get("stderr") == subprocess.STDOUT else out
        if rc != 0:
            raise subprocess.CalledProcessError(rc, cmd, output=text.encode())
        return text.encode()

    shim.check_output = check_output  # type: ignore[attr-defined]
    return shim


_seeded = False


def seed_inductor() -> None:
    """Fills Inductor's compiler-query caches from the record, once per process.

    Each cached function is called while cpp_builder's `subprocess` answers from the
    record, so its cache holds exactly what it would have computed by asking."""
    global _seeded
    cpp_builder = resolve("cpp_builder")

    with _lock:
        if _seeded:
            return
        rec = record()
        real = cpp_builder.subprocess
        cpp_builder.subprocess = _replayed_subprocess(rec)
        try:
            try:
                compiler = cpp_builder.get_cpp_compiler()
            except Exception as e:  # noqa: BLE001  InvalidCxxCompiler: no C++ kernel loads here
                log.debug("no C++ compiler for Inductor: %s", e)
                return
            cpp_builder.get_compiler_version_info(compiler)
            cpp_builder._is_intel_compiler(compiler)
            if platform.machine() in ("aarch64", "arm64") and internals.internal("is_gcc_version_less_than"):
                cpp_builder._is_gcc_version_less_than(compiler, 13)
        finally:
            cpp_builder.subprocess = real
            _seeded = True
