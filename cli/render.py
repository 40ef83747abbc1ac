"""The hit rates the `torchfarm` commands' tables lead with, and the model a label names
(the tables themselves are drawn by torchfarm/tables.py)."""

from __future__ import annotations


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
