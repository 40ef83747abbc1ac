"""A second virtualenv at another path, for tests that load artifacts "on another machine".

Inductor keys C++ kernels by their compiler command line, which holds the absolute
include paths of the torch installation (torch-facts.md). A client test that runs in
the worker's own environment cannot tell whether kernels were found by the right key or
by luck, so such tests run their client with `second_venv()`'s interpreter.

By default the venv is a client installed as docs/sdk.md tells a user to install one:
`pip install 'torchfarm[sdk]'` (from this checkout), with nothing else and no
constraints file, so no Triton: a test run with it shows that `[sdk]` alone is enough
against the farm `torchfarm up` starts. The tests still put the checkout first on
`PYTHONPATH`, so the code under test is this checkout's whichever checkout built the
cached venv; what the install proves is which dependencies `[sdk]` brings.

The venv is built once per requirement set and reused: a cache under the system temp
dir, keyed by the torch version and a digest of the requirements, guarded by a file lock
so concurrent test sessions build it once. `pip` resolves torch from the local wheel
mirror in tens of seconds; the first build takes about a minute on two cores.

    python = second_venv()          # or: second_venv(["torch==2.13.0"])
    subprocess.run([str(python), "-c", ...], env={..., "PYTHONPATH": repo_root})
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from scripts.extra_requirements import requirements

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"

CACHE_ENV = "TORCHFARM_TEST_VENVS"
"""Overrides where the venvs live (default: <system temp>/torchfarm-test-venvs)."""

BUILD_TIMEOUT_S = 900.0
"""Upper bound for creating a venv and installing its requirements."""

_COMPLETE = ".torchfarm-complete"
"""Written last, so a half-built venv (killed run) is rebuilt rather than reused."""


class VenvUnavailable(RuntimeError):
    """The venv could not be built here (no network mirror, no wheel, no venv module)."""


CLIENT_EXTRAS = ("sdk",)
"""What docs/sdk.md tells a training job to install: `pip install 'torchfarm[sdk]'`."""


def project_requirements(extras: Sequence[str] = CLIENT_EXTRAS) -> list[str]:
    """What `pip install 'torchfarm[<extras>]'` brings: pyproject's runtime dependencies
    and those of `extras`. The venv's cache is keyed on them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return requirements(project, list(extras))


def second_venv(requirements: Sequence[str] | None = None, extras: Sequence[str] = CLIENT_EXTRAS) -> Path:
    """The python executable of a cached venv: with `requirements` installed, under this
    project's constraints; by default, this checkout installed with `extras` as a user
    installs it, unconstrained. Raises VenvUnavailable with pip's message on failure."""
    own = requirements is None
    reqs = sorted(project_requirements(extras) if own else requirements)
    # The project itself, unconstrained, is another venv than its requirements constrained.
    venv = _cache_root() / _cache_name([*reqs, "torchfarm"] if own else reqs)
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / _COMPLETE).exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
        project = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
        wanted = [project] if own else ["-c", str(CONSTRAINTS), *reqs]
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted],
            "pip install",
        )
        (venv / _COMPLETE).write_text("\n".join(reqs) + "\n")
    _remove_superseded(venv)
    return python


def _remove_superseded(venv: Path) -> None:
    """Removes this interpreter's other venvs of the same torch (made for requirements
    since changed; 1.6 GB each) that no session holds the lock of."""
    prefix = venv.name.rsplit("-", 1)[0] + "-"
    for other in venv.parent.glob(prefix + "*.lock"):
        stale = other.with_suffix("")
        if stale == venv:
            continue
        with open(other, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(stale, ignore_errors=True)


def _cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "torchfarm-test-venvs")


def _cache_name(reqs: Sequence[str]) -> str:
    torch_req = next((_torch_pin(r) for r in reqs if _name(r) == "torch"), "torch")
    pins = CONSTRAINTS.read_text() if CONSTRAINTS.exists() else ""
    digest = hashlib.sha256("\n".join([sys.version, pins, *reqs]).encode()).hexdigest()[:12]
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return f"{torch_req.replace('==', '-').replace(' ', '')}-{python}-{digest}"


def _torch_pin(requirement: str) -> str:
    """"torch==2.13.0" of a torch requirement, markers and spaces dropped."""
    return requirement.split(";", 1)[0].replace(" ", "")


def _name(requirement: str) -> str:
    for sep in "=<>!~[; ":
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip().lower()


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VenvUnavailable(f"{what} failed: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise VenvUnavailable(f"{what} exited {proc.returncode}: " + " | ".join(tail))
