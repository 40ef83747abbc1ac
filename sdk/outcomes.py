"""Where each graph of this process was compiled: the tally logged at exit, and the
record in torch's structured trace (`TORCH_TRACE`) that tlparse shows.

A farm hit loads through Inductor's own caches, so in a `TORCH_TRACE` it reads as a
local `fx_graph_bundled_cache_hit`. `trace()` adds an `artifact` entry named
`torchfarm_graph` to the graph's compile (the Dynamo frame that captured it): where it
was compiled, the farm's key, outcome and stage timings, or why it was not. tlparse
lists it among that compile's artifacts, as a JSON file.

The tally counts graphs by where they run: on the farm's artifact (a hit, a compile, a
joined compile), compiled locally (no farm, a fallback), or eagerly (`wait=False` after
a failure, a target this process is not). At exit it is logged once, at INFO on this
module's logger:

    torchfarm: 5 graphs in this process: 3 from the farm (2 hits, 1 compiled), 1 compiled locally, 1 eager

A graph split at calls the farm refuses (sdk/split.py) counts as its pieces; the line
then ends with how many were split ("; 1 split at calls the farm refuses").
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sdk import report
from torchfarm.fx import internals

log = logging.getLogger(__name__)

FARM = (report.HIT, report.COMPILED, report.JOINED)
"""Outcomes of a graph that runs the farm's artifact."""
EAGER = "eager"
"""The graph runs eagerly here: `wait=False` after its farm compile failed."""
TRACE_ARTIFACT = "torchfarm_graph"
"""The name of the graph's record among its compile's artifacts in a TORCH_TRACE."""

_lock = threading.Lock()
_tally: Counter[str] = Counter()
_registered = False


def record(outcome: str) -> None:
    """Counts one graph's outcome (a `report` outcome or EAGER) for the exit summary."""
    global _registered
    with _lock:
        _tally[outcome] += 1
        if not _registered:
            _registered = True
            atexit.register(log_summary)


def summary(tally: Mapping[str, int] | None = None) -> str:
    """This process's graphs so far (or `tally`'s), by where they were compiled; "" when none."""
    with _lock:
        t = Counter(_tally if tally is None else tally)
    split = t.pop(report.SPLIT, 0)
    total = sum(t.values())
    if not total and not split:
        return ""
    farm = sum(t[o] for o in FARM)
    parts = [f"{t[report.HIT]} hits", f"{t[report.COMPILED]} compiled"]
    if t[report.JOINED]:
        parts.append(f"{t[report.JOINED]} joined")
    eager = t[EAGER] + t[report.FAILED]
    return (
        f"torchfarm: {total} graphs in this process: {farm} from the farm ({', '.join(parts)}), "
        f"{t[report.LOCAL]} compiled locally, {eager} eager"
        + (f"; {split} split at calls the farm refuses" if split else "")
    )


def log_summary() -> None:
    line = summary()
    if line:
        log.info("%s", line)


def compile_id() -> Any:
    """The compile (Dynamo frame) running on this thread, for a later `trace()` from
    another thread; None outside one."""
    return internals.resolve("CompileContext.current_compile_id")()


def trace(fields: dict[str, Any], compile_id: Any = None) -> None:
    """Records a graph's outcome in the structured trace, when one is being written."""
    internals.resolve("trace_structured")(
        "artifact",
        metadata_fn=lambda: {"name": TRACE_ARTIFACT, "encoding": "json"},
        payload_fn=lambda: json.dumps(fields, indent=2, sort_keys=True),
        compile_id=compile_id,
    )
