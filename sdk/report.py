"""What the farm did for each graph: the report `sdk.warm` and `torchfarm warm` print.

`FarmBackend` publishes one `GraphReport` per graph to the sinks that were collecting
when the backend was made (`collect()`), so a report holds exactly the graphs of the
models compiled inside it. Free of torch.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from torchfarm.tables import fmt_bytes, table

REPORT_ENV = "TORCHFARM_WARM_REPORT"
"""Set by `torchfarm warm`: the file the script's process writes its report to (JSON)."""
STEPS_ENV = "TORCHFARM_WARM_STEPS"
"""Set by `torchfarm warm`: stop the script at the end of this many steps (0: never)."""

HIT = "hit"
"""The farm's cache held the graph's artifact."""
COMPILED = "compiled"
"""The farm compiled the graph for this call."""
JOINED = "joined"
"""Another client's compile of the same key was in flight; this call waited for it."""
LOCAL = "local"
"""The farm could not; the graph was compiled locally (fallback="local")."""
FAILED = "failed"
"""The farm could not, and it ran eagerly here: a graph for another target
(`sdk.warm(target=...)`), or any graph under `torchfarm warm`, where a local compile
would fill no cache."""
SPLIT = "split"
"""Split at calls the farm refuses (sdk/split.py): those ran eagerly here (`error` names
them); its pieces are graphs of their own, each with its report (`split_from`)."""


@dataclass(frozen=True)
class GraphReport:
    model: str
    graph: int
    """Dynamo's graph index within the model: 1, 2, ... (graph breaks make several)."""
    outcome: str
    key: str = ""
    target: str = ""
    seconds: float = 0.0
    """Wall time of this graph's farm round trip here: submit, wait, fetch, verify, load."""
    compile_seconds: float = 0.0
    """The farm's compile time for it (the job's stage timings); 0 on a cache hit."""
    kernels: int = 0
    bytes: int = 0
    error: str = ""
    split_from: int = 0
    """Set on a piece of a SPLIT graph: that graph's index."""


@dataclass
class WarmReport:
    graphs: list[GraphReport] = field(default_factory=list)

    @property
    def compiles(self) -> list[GraphReport]:
        """The graphs something compiled: a SPLIT graph's pieces, not the graph."""
        return [g for g in self.graphs if g.outcome != SPLIT]

    @property
    def hits(self) -> int:
        return sum(g.outcome == HIT for g in self.graphs)

    @property
    def compiled(self) -> int:
        return sum(g.outcome in (COMPILED, JOINED) for g in self.graphs)

    @property
    def failed(self) -> int:
        return sum(g.outcome in (LOCAL, FAILED) for g in self.graphs)

    @property
    def all_hits(self) -> bool:
        """True when there were graphs and the farm's cache held every one."""
        return bool(self.compiles) and self.hits == len(self.compiles)

    def summary(self) -> str:
        split = len(self.graphs) - len(self.compiles)
        return (
            f"{len(self.compiles)} graphs: {self.hits} already cached, {self.compiled} compiled "
            f"by the farm, {self.failed} not on the farm"
            + (f"; {split} split at calls the farm refuses, which ran eagerly" if split else "")
        )

    def __str__(self) -> str:
        if not self.graphs:
            return "no graphs were compiled (did the script call an sdk.compile model?)"
        rows = [
            [
                g.model, g.graph, g.key[:12] or "-", g.target or "-", g.outcome,
                f"{g.compile_seconds:.2f}s" if g.outcome != HIT else "-", f"{g.seconds:.2f}s",
                g.kernels, fmt_bytes(g.bytes), g.error[:60],
            ]
            for g in self.graphs
        ]
        header = ["MODEL", "GRAPH", "KEY", "TARGET", "OUTCOME", "COMPILE", "ROUND TRIP",
                  "KERNELS", "BYTES", "ERROR"]
        numbers = ["GRAPH", "COMPILE", "ROUND TRIP", "KERNELS", "BYTES"]
        return table(rows, header, right=numbers) + "\n" + self.summary()

    def to_json(self) -> str:
        return json.dumps({"graphs": [asdict(g) for g in self.graphs]}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> WarmReport:
        return cls([GraphReport(**g) for g in json.loads(text)["graphs"]])


_lock = threading.Lock()
_collecting: list[list[GraphReport]] = []


@contextlib.contextmanager
def collect() -> Iterator[list[GraphReport]]:
    """Collects the reports of the backends made inside the block (into the list)."""
    sink: list[GraphReport] = []
    with _lock:
        _collecting.append(sink)
    try:
        yield sink
    finally:
        with _lock:  # by identity: two sinks with equal contents are still two
            del _collecting[next(i for i, s in enumerate(_collecting) if s is sink)]


def active_sinks() -> tuple[list[GraphReport], ...]:
    """The sinks collecting now: a backend keeps these and publishes to them."""
    with _lock:
        return tuple(_collecting)


def same_sinks(a: tuple[list[GraphReport], ...], b: tuple[list[GraphReport], ...]) -> bool:
    """Whether two backends report to the same sinks: by identity, as equal contents
    are still two sinks."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def publish(sinks: tuple[list[GraphReport], ...], report: GraphReport) -> None:
    with _lock:
        for sink in sinks:
            sink.append(report)
