"""The `torchfarm` commands' argument parser: every option's default in its --help, and
each command's name ("torchfarm cache gc") in `args.prog`, for its error lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def _shown(action: argparse.Action) -> bool:
    """Whether the option's default is worth showing (not for positionals, flags, or
    options unset by default); 0 is shown, though 0 == False."""
    default: Any = action.default
    return bool(action.option_strings) and default is not None and default is not False \
        and default not in ("", [], argparse.SUPPRESS)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter, except that it leaves out empty and
    false defaults (an unset option, a flag) and helps that already give theirs."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = action.help or ""
        if not _shown(action) or "default" in help.lower():
            return help
        return f"{help} (default: %(default)s)"

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _shown(action):
            action.help = "(default: %(default)s)"  # argparse prints no line for a None help
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that formats with HelpFormatter; its subcommands' parsers are
    Parsers too (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # A subcommand's parser sets its defaults after its parent's: the deepest wins.
        self.set_defaults(prog=self.prog, command_parser=self)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's, except that an argument no parser took is reported by the
        command's own parser, with its usage, not by the top level's."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            parsed.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def port(text: str) -> int:
    """An argparse type: a TCP port number (0 for "pick one", where an option says so)."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535)")
    return value


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of `minimum` or more."""
    def parse(text: str) -> int:
        value = _integer(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not a count of {minimum} or more")
        return value

    return parse


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
