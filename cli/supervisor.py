"""`torchfarm up`'s children, watched: one that dies is restarted, a bounded number of
times; past the bound the farm stops, and the error names the child, its exit status
and the last lines of its log. A child is always reaped: none is left a zombie.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from cli import launch

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Restarts of one child allowed within RESTART_WINDOW_S before the farm stops."""

RESTART_WINDOW_S = 300.0
"""The window MAX_RESTARTS counts in: a child that crashes again and again stops the
farm; one that dies once a day is restarted every time."""

TAIL_LINES = 20
"""Lines of a dead child's log shown when the farm stops for it."""


class ChildFailed(RuntimeError):
    """A child died and may not be restarted; the message carries its log's tail."""

    def __init__(self, name: str, code: int | None, logfile: Path, why: str):
        self.name, self.code, self.logfile = name, code, logfile
        super().__init__(
            f"{name} {_exit_text(code)} {why}; the farm stops. Last lines of {logfile}:\n"
            + launch.log_tail(logfile, TAIL_LINES)
        )


def _exit_text(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


@dataclass
class _Child:
    name: str
    start: Callable[[], subprocess.Popen]
    logfile: Path
    proc: subprocess.Popen
    restarts: deque[float] = field(default_factory=deque)


LEFT_OVER_GRACE_S = 5.0
"""How long a stop waits for what the children started outside their process groups
to end on its own."""


class Supervisor:
    """Starts children and keeps them running; `check` restarts the dead ones."""

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S,
                 out: TextIO | None = None, left_over_grace_s: float = LEFT_OVER_GRACE_S):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.left_over_grace_s = left_over_grace_s
        self.out = out or sys.stderr
        self.children: dict[str, _Child] = {}

    def start(self, name: str, start: Callable[[], subprocess.Popen], logfile: Path) -> None:
        """Starts a child with `start`, which is called again for each restart."""
        self.children[name] = _Child(name, start, logfile, start())

    def alive(self) -> None:
        """Raises ChildFailed if any child has died (while the farm starts: no restarts)."""
        for c in self.children.values():
            if c.proc.poll() is not None:
                _end_group(c.proc)
                raise ChildFailed(c.name, c.proc.returncode, c.logfile, "while the farm started")

    def check(self) -> None:
        """Restarts each child that died, within its bound; raises ChildFailed past it."""
        now = time.monotonic()
        for c in self.children.values():
            code = c.proc.poll()  # reaps it
            if code is None:
                continue
            _end_group(c.proc)
            while c.restarts and now - c.restarts[0] > self.window_s:
                c.restarts.popleft()
            if len(c.restarts) >= self.max_restarts:
                raise ChildFailed(
                    c.name, code, c.logfile,
                    f"({self.max_restarts} restarts in the last {self.window_s:.0f}s)",
                )
            c.restarts.append(now)
            print(
                f"torchfarm: {c.name} {_exit_text(code)}; restarting it "
                f"({len(c.restarts)} of {self.max_restarts}); its log: {c.logfile}",
                file=self.out, flush=True,
            )
            c.proc = c.start()

    def run(self, stop: threading.Event, poll_s: float = 0.5) -> None:
        """Watches the children until `stop` is set; raises ChildFailed."""
        while not stop.wait(poll_s):
            self.check()

    def stop(self, names: list[str], timeout_s: float = launch.STOP_TIMEOUT_S) -> None:
        """Stops the named children (those started), all at once, then whatever they
        started outside their process group that outlived them."""
        procs = {n: self.children.pop(n).proc for n in names if n in self.children}
        left = set().union(*(descendants(p.pid) for p in procs.values()))
        launch.stop(procs, timeout_s)
        # A worker's sandbox server runs in a session of its own (bubblewrap's
        # --new-session), out of reach of the group kill. It ends when its worker's pipe
        # closes, a moment after the worker, or, stopped while it prebuilds its headers,
        # once they are built: one still running after `left_over_grace_s` is stopped
        # here, as a normal stop.
        deadline = time.monotonic() + self.left_over_grace_s
        while any(map(_alive, left)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in sorted(left):
            if _alive(pid):
                log.info("pid %d, started by the farm, outlived its parent by %.0fs; stopping it",
                         pid, self.left_over_grace_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)


def _end_group(proc: subprocess.Popen) -> None:
    """Kills what a dead child left in its process group (a Celery worker's pool
    process): it has nothing left to serve, and what it writes as it finds its parent
    gone would fill the log tail that reports the death, or the restarted child's log."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
