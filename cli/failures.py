"""How a `torchfarm` command fails: one line on stderr, `torchfarm COMMAND: what went
wrong`, and a non-zero exit status, never a traceback (unless --traceback asks for it).

    CliError            its own status (1, or 2 for a usage error)
    KeyboardInterrupt   130, as a shell reports SIGINT
    BrokenPipeError     141, as a shell reports SIGPIPE (`torchfarm token bob | head -1`)
    grpc.RpcError       1: the status code and its detail
    Redis errors        1: which Redis, and why (an operator's command, a service)
    OSError             1: the file or address, and why
    anything else       70 (EX_SOFTWARE): a bug; the type and message
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

from cli.errors import CliError

SOFTWARE = 70
"""sysexits.h's EX_SOFTWARE: an error the command did not expect, a bug."""


@dataclass
class Outcome:
    status: int = 0


def describe(error: BaseException) -> tuple[str, int]:
    """The one line and the exit status for `error`."""
    if isinstance(error, CliError):
        return str(error), error.status
    module = type(error).__module__
    if module.startswith("grpc"):
        code, details = getattr(error, "code", None), getattr(error, "details", None)
        if callable(code) and callable(details):
            return f"{code().name}: {details()}", 1
    if module.startswith(("redis", "kombu")):
        return f"Redis: {error}", 1
    if isinstance(error, OSError):
        return str(error), 1
    return f"{type(error).__name__}: {error} (a bug? --traceback shows where)", SOFTWARE


@contextlib.contextmanager
def reported(prog: str, show_traceback: bool = False) -> Iterator[Outcome]:
    """Runs the block; an exception leaving it is printed as one line and sets the
    outcome's status instead."""
    outcome = Outcome()
    try:
        yield outcome
    except BrokenPipeError:
        # Whoever read our output has gone: nothing to say, and the interpreter must not
        # fail again flushing stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        outcome.status = 141
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        outcome.status = 130
    except Exception as e:  # noqa: BLE001 - the point: nothing leaves as a traceback
        if show_traceback:
            traceback.print_exc()
        line, outcome.status = describe(e)
        print(f"{prog}: {line}", file=sys.stderr)
