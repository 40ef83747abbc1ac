"""Text tables and human units, for the `torchfarm` commands and the SDK's reports.
Free of torch.

The tables are drawn by rich: it aligns the columns (numbers to the right), and on a
terminal folds a column too wide for it; piped (`| grep`, a test), a row stays one
line, however long."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchfarm.wire.labels import printable

_WIDE = 100_000
"""The width a table is drawn at when stdout is no terminal: no row is folded."""


def table(rows: Sequence[Sequence[object]], header: Sequence[str], right: Iterable[str] = ()) -> str:
    """Columns two spaces apart under a plain header, no borders and no trailing
    blanks; the columns named in `right` (numbers) aligned to the right."""
    right = set(right)
    tty = sys.stdout.isatty()
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style=None)
    for name in header:
        t.add_column(name, justify="right" if name in right else "left", no_wrap=not tty)
    for row in rows:
        # Text: no markup read in a cell; a cell is one line, whatever a farm sent.
        t.add_row(*(Text(printable(str(c), newlines=False)) for c in row))
    out = io.StringIO()
    width = shutil.get_terminal_size().columns if tty else _WIDE
    Console(file=out, width=width, no_color=True, highlight=False, emoji=False,
            markup=False, force_terminal=False).print(t)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def fmt_bytes(n: float) -> str:
    """1536 → "1.5 KB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def fmt_age(seconds: float) -> str:
    """Seconds → "45s", "12m", "3.5h", "2.0d"."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """"90", "90s", "15m", "12h", "7d", "2w" → seconds. Raises ValueError."""
    t = text.strip().lower()
    scale = _UNITS.get(t[-1:], 0)
    number = t[:-1] if scale else t
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not an age such as 90s, 15m, 12h, 7d or 2w") from None
    if value < 0:
        raise ValueError(f"{text!r}: an age cannot be negative")
    return value * (scale or 1)


def stage_timings(timings: Iterable[Any]) -> str:
    """A compile's `StageTiming`s on one line: "decompose 1.10s (queued 0.30s), lower
    2.31s, kernels 4.02s 12/19 hit, assemble 0.05s" (a staged compile), or the
    whole-graph compile's "compile 3.50s"."""
    parts = []
    for t in timings:
        part = f"{t.stage} {t.seconds:.2f}s"
        if t.queued_seconds >= 0.005:
            part += f" (queued {t.queued_seconds:.2f}s)"
        if t.kernels:
            part += f" {t.kernels_hit}/{t.kernels} hit"
        parts.append(part)
    return ", ".join(parts)
