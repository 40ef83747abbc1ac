"""The `torchfarm` commands' tables, drawn by rich, and the hit rates they lead with.

rich aligns the columns (numbers to the right), and on a terminal folds a column too
wide for it; piped (`| grep`, a test), a row stays one line, however long."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

_WIDE = 100_000
"""The width a table is drawn at when stdout is no terminal: no row is folded."""


def table(rows: Sequence[Sequence[object]], header: Sequence[str], right: Iterable[str] = ()) -> str:
    """Columns two spaces apart under a plain header, no borders and no trailing
    blanks; the columns named in `right` (numbers) aligned to the right."""
    right = set(right)
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style=None)
    for name in header:
        t.add_column(name, justify="right" if name in right else "left", no_wrap=not _tty())
    for row in rows:
        t.add_row(*(Text(str(c)) for c in row))  # Text: no markup read in a cell
    out = io.StringIO()
    Console(file=out, width=_width(), no_color=True, highlight=False, emoji=False,
            markup=False, force_terminal=False).print(t)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def _tty() -> bool:
    import sys

    return sys.stdout.isatty()


def _width() -> int:
    import shutil

    return shutil.get_terminal_size().columns if _tty() else _WIDE


def hit_rate(hits: int, entries: int) -> str:
    """Hits over lookups, where each entry stands for the one lookup that missed and
    compiled it: "75.0%" for 3 hits on 1 entry; "-" with neither."""
    lookups = hits + entries
    return f"{100.0 * hits / lookups:.1f}%" if lookups else "-"


def model_of(label: str) -> str:
    """The model part of a graph's label ("MLP (train.py) graph 2 from host" → "MLP
    (train.py)"); the whole label when it names no graph, "-" when empty."""
    if not label:
        return "-"
    head, sep, _ = label.partition(" graph ")
    return head if sep else label
