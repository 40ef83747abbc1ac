"""What a failed kernel compile may tell the client: the compiler's diagnostic of its own
source, bounded, and nothing of the worker's state.

Triton's errors quote the kernel's source (the client's own) and a message, which may hold
the repr of any object the frontend touched: a worker path, a module, an object's address,
or, through a format string, the worker's environment. `client_message` is applied where the
job records a failure, so every answer the coordinator relays has passed through it.
"""

from __future__ import annotations

import os
import re

MAX_CLIENT_MESSAGE_BYTES = 4096
"""Longest failure message a client gets back for a kernel job."""

MIN_SECRET_CHARS = 6
"""Environment values this long or longer are removed wherever they appear."""

_OBJECT_REPR = re.compile(r"<[^<>\n]{0,200}? at 0x[0-9a-fA-F]+>")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/@\s'\"]*@")
"""A scheme of at most 32 characters: unbounded, every start in a long run of letters
scanned to the run's end, quadratic in a long diagnostic."""
_ABSOLUTE_PATH = re.compile(r"(?<![\w.<>/-])/(?:[\w.+-]+/)+[\w.+-]+")
"""Two components or more: `x /2` in a quoted kernel line is not a path."""


def client_message(text: str, scratch: str | None = None) -> str:
    """`text` with environment values, object reprs, addresses, URL credentials and paths
    outside `scratch` (those inside it are made relative) removed, then bounded in size."""
    out = text
    if scratch:  # before the environment: the scratch dir is often one of its values
        for root in {os.path.realpath(scratch), os.path.abspath(scratch)}:
            out = out.replace(root.rstrip(os.sep) + os.sep, "")
    for value in _secrets():
        out = out.replace(value, "<redacted>")
    out = _OBJECT_REPR.sub("<object>", out)
    out = _ADDRESS.sub("<address>", out)
    out = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + "<redacted>@", out)
    out = _ABSOLUTE_PATH.sub("<path>", out)
    return _bounded(out)


def _secrets() -> list[str]:
    """Every environment value that could carry something worth stealing, longest first
    (so that a value holding another is removed whole)."""
    values = {v for v in os.environ.values() if len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def _bounded(text: str) -> str:
    """The start (the error's location and source excerpt) and the end (the message) of
    `text`, within MAX_CLIENT_MESSAGE_BYTES."""
    data = text.encode()
    if len(data) <= MAX_CLIENT_MESSAGE_BYTES:
        return text
    marker = "\n[... cut ...]\n"
    half = (MAX_CLIENT_MESSAGE_BYTES - len(marker)) // 2
    head = data[:half].decode(errors="ignore")
    tail = data[-half:].decode(errors="ignore")
    return head + marker + tail
