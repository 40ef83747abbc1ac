"""Progress of farm compiles: graph i of n, the stage, and kernels done of the total.

One `Progress` per `sdk.compile`d model. `Progress.graph(index, key)` follows one
graph from submit to load; the Watch stream's `JobStatus` updates it (`GraphTrack.update`).
A compile shorter than `progress_after_s` shows nothing, so cache hits print nothing
extra. Past it:

- stderr is a terminal: one line redrawn in place, with a bar once the farm reports a
  kernel total, ended with a newline when the graph is ready;
- otherwise: an INFO line on the `sdk.progress` logger every `progress_every_s`.

Nothing at all when `sdk.progress` is not enabled for INFO: the `sdk` logger (or the
root logger, Python's default being WARNING) set above INFO.

"graph i of n so far": Dynamo hands the backend one graph at a time and does not say
how many follow (graph breaks and recompiles are found as the model runs), so n is the
number of graphs this model has handed over until now, never a promise of the total.
Kernel counts come from `JobStatus.kernels_total/kernels_done/kernels_hit`; while the
farm reports no total (0), only the stage and the elapsed time are shown.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO

from sdk.settings import SDKSettings
from torchfarm.v1 import farm_pb2

log = logging.getLogger(__name__)

TICK_S = 0.25
"""How often the drawing thread wakes while any compile is in flight."""

BAR_WIDTH = 20
"""Characters in the terminal bar."""


@dataclass
class GraphTrack:
    """What is known about one graph's compile; written by the thread that waits on the
    farm, read by the drawing thread (single attribute writes, so no lock)."""

    index: int
    key: str
    started: float
    stage: str = "submit"
    kernels_total: int = 0
    kernels_done: int = 0
    kernels_hit: int = 0
    shown: bool = field(default=False, repr=False)

    def update(self, status: farm_pb2.JobStatus) -> None:
        if status.state == farm_pb2.QUEUED:
            self.stage = "waiting for a worker" if status.unserved else "queued"
        elif status.stage:
            self.stage = status.stage
        self.kernels_total = status.kernels_total
        self.kernels_done = status.kernels_done
        self.kernels_hit = status.kernels_hit

    def set_stage(self, stage: str) -> None:
        self.stage = stage


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = min(width, width * done // total) if total > 0 else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def describe(track: GraphTrack, graphs_so_far: int, now: float, with_bar: bool = False) -> str:
    """"graph 2 of 3 so far: compile, kernels 12/30 (4 cached), 14s"; the kernel part
    only once the farm reports a total."""
    parts = [track.stage]
    if track.kernels_total > 0:
        kernels = f"kernels {track.kernels_done}/{track.kernels_total}"
        if track.kernels_hit:
            kernels += f" ({track.kernels_hit} cached)"
        parts.append((bar(track.kernels_done, track.kernels_total) + " " if with_bar else "") + kernels)
    parts.append(f"{now - track.started:.0f}s")
    return f"graph {track.index} of {max(graphs_so_far, track.index)} so far: " + ", ".join(parts)


class Progress:
    def __init__(
        self,
        name: str,
        settings: SDKSettings,
        graphs_so_far: Callable[[], int],
        *,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        draw_thread: bool = True,
    ):
        """`stream` defaults to sys.stderr at the time of drawing; `draw_thread=False`
        leaves drawing to explicit `draw(now)` calls (unit tests)."""
        self.name = name
        self.after_s = settings.progress_after_s
        self.every_s = settings.progress_every_s
        self._graphs_so_far = graphs_so_far
        self._stream = stream
        self._clock = clock
        self._draw_thread = draw_thread
        self._lock = threading.Lock()
        self._active: dict[int, GraphTrack] = {}
        self._ticker: threading.Thread | None = None
        self._last_line = 0.0
        self._drawn = 0

    @property
    def stream(self) -> IO[str]:
        return self._stream if self._stream is not None else sys.stderr

    def enabled(self) -> bool:
        return log.isEnabledFor(logging.INFO)

    def terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    @contextmanager
    def graph(self, index: int, key: str) -> Iterator[GraphTrack]:
        """Tracks one graph's compile for the duration of the block. A nested block for
        the same graph (a resubmit) shares the outer one's track."""
        with self._lock:
            outer = self._active.get(index)
        if outer is not None:
            yield outer
            return
        track = GraphTrack(index, key, self._clock())
        if not self.enabled():
            yield track
            return
        with self._lock:
            self._active[index] = track
            if self._ticker is None and self._draw_thread:
                self._ticker = threading.Thread(
                    target=self._run, name="torchfarm-progress", daemon=True
                )
                self._ticker.start()
        outcome = "failed"
        try:
            yield track
            outcome = "ready"
        finally:
            with self._lock:
                self._active.pop(index, None)
                if track.shown:
                    self._finish(track, outcome)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                if not self._active:
                    self._ticker = None
                    return
                self.draw(self._clock())

    def draw(self, now: float) -> None:
        """Shows every compile in flight past `after_s`. The drawing thread calls it with
        the lock held."""
        due = [t for t in self._active.values() if now - t.started >= self.after_s]
        if not due:
            return
        n = self._graphs_so_far()
        if self.terminal():
            line = f"torchfarm: {self.name} " + " | ".join(
                describe(t, n, now, with_bar=True) for t in due
            )
            self._write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
        elif any(not t.shown for t in due) or now - self._last_line >= self.every_s:
            self._last_line = now
            for t in due:
                log.info("torchfarm: %s %s key=%s", self.name, describe(t, n, now), t.key[:12])
        for t in due:
            t.shown = True

    def _finish(self, track: GraphTrack, outcome: str) -> None:
        elapsed = self._clock() - track.started
        line = f"torchfarm: {self.name} graph {track.index}: {outcome} after {elapsed:.1f}s"
        if self.terminal():
            self._write("\r" + line.ljust(self._drawn) + "\n")
            self._drawn = 0
        else:
            log.info("%s key=%s", line, track.key[:12])

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream must not break a compile
            pass
