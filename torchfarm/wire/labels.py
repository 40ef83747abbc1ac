"""A request's label: the client's free text (model, graph, host), not part of the key.

The coordinator writes it into its log lines and keeps it beside the job and the
artifact (`torchfarm status`, `torchfarm cache ls`), so it is bounded like every other
field a client sends: at most `MAX_LABEL_CHARS` printable characters. A newline would
forge a log line, and megabytes of label would sit in Redis uncounted by any quota.
The SDK clips what it sends (`clip_label`); the coordinator refuses anything else.

Text the other way, from a farm to a user's terminal (its errors, the CLI's tables), is
made `printable` where it is shown: escape sequences could otherwise rewrite it.
"""

from __future__ import annotations

MAX_LABEL_CHARS = 256


class BadLabel(ValueError):
    pass


def check_label(label: str) -> None:
    if len(label) > MAX_LABEL_CHARS:
        raise BadLabel(f"label is {len(label)} characters; the farm accepts at most {MAX_LABEL_CHARS}")
    if not label.isprintable():
        bad = next(c for c in label if not c.isprintable())
        raise BadLabel(f"label holds the unprintable character {bad!r}")


def printable(text: str, newlines: bool = True) -> str:
    """`text` from elsewhere (a farm, a worker), fit for a terminal or a log: control
    characters, escape sequences' ESC and carriage returns among them, become spaces;
    newlines and tabs stay where `newlines` (a compile error's lines)."""
    keep = "\n\t" if newlines else ""
    return "".join(c if c.isprintable() or c in keep else " " for c in text)


def clip_label(text: str) -> str:
    """`text` as a label the farm accepts: unprintable characters become spaces, and it is
    cut to MAX_LABEL_CHARS."""
    return printable(text[:MAX_LABEL_CHARS], newlines=False)
