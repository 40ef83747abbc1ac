"""The name a compiled model goes by in the farm's labels ("MLP (examples.models) graph 2
from host") and views: its class, or function, and where it comes from, so that two
models of one class name (every `nn.Sequential`) can be told apart."""

from __future__ import annotations

import os
import sys
from typing import Any

_OURS = ("sdk", "torch", "functools", "contextlib")
"""Modules whose frames are not the caller's: the SDK's own and torch's wrappers."""


def model_name(fn: Any) -> str:
    """`fn`'s class (a module) or qualified name (a function), then its module, or for a
    class of torch's own or of a script, the file and line that compiled it."""
    own = getattr(fn, "__qualname__", None)
    name = own or type(fn).__qualname__
    module = (getattr(fn, "__module__", None) if own else type(fn).__module__) or ""
    if module and module != "__main__" and module.split(".")[0] != "torch":
        return f"{name} ({module})"
    site = _call_site()
    return f"{name} ({site})" if site else name


def _call_site() -> str:
    """"train.py:57": the first frame outside the SDK and torch, the user's call."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in _OURS:
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""
