"""The question a destructive command asks before it acts (`cache evict`, `cache gc`)."""

from __future__ import annotations

import sys

from cli.errors import CliError


def confirm(what: str, yes: bool) -> None:
    """Returns if `what` ("evict 3 entries, 1.2 MB") may go ahead: --yes was given, or
    the user answered y on the terminal. Raises CliError otherwise; with no terminal to
    ask on (a script, a pipe) and no --yes, refuses rather than guess."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"refusing to {what} without --yes: stdin is not a terminal to ask on", 2)
    answer = input(f"{what}? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("nothing done", 1)
