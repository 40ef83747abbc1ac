"""Runs a job at the start of a large chunk of the interpreter's frame stack.

CPython (3.11 on) keeps a thread's Python frames in a data stack made of chunks, 16 KiB
at first. A call that does not fit in the current chunk maps a new one (mmap), and its
return unmaps it (munmap). A hot loop whose calls cross a chunk boundary pays a map,
an unmap and fresh page faults on every call (CPython gh-142183: 3.13 and 3.14 keep
one spare chunk since March 2026; 3.11, which the farm runs, does not). Where a job's
frames start depends on the Celery and billiard frames above the task, so whether
Inductor's loops land on a boundary is luck of the call depth.

In the worker, they did: the GPT example's lowering in a pool process mapped and
unmapped chunks hundreds of thousands of times, and ran far slower than in a plain
process; through `in_stack_room` it faults as a plain process does (figures in
docs/measurements.md).

`in_stack_room(fn, ...)` calls `fn` from a frame that asks for `ROOM_SLOTS` stack
slots. No chunk has that much room left, so CPython maps a chunk for it alone, sized to
the next power of two of 16 KiB (`push_chunk` in Python/pystate.c): twice what the
frame asks for. The frame never touches its stack slots (no page is faulted in for
them), and every frame of the job below it fits in the other half, unless it nests
deeper than about 260,000 slots (thousands of frames). One map and one unmap per job.
Pinned in tests/unit/test_stackroom.py: the thrash outside the room, and none inside.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

ROOM_SLOTS = 1 << 18
"""Stack slots (8 bytes each) the entry frame asks for: 2 MiB, so the chunk is 4 MiB
and the job's frames have the other 2 MiB."""


def _enter(fn: Callable[..., R], args: tuple, kwargs: dict) -> R:
    return fn(*args, **kwargs)


# The same function, with a frame as large as the room: `co_stacksize` only sizes the
# frame's reservation on the data stack, and the interpreter uses what the code needs.
_roomy_enter = types.FunctionType(
    _enter.__code__.replace(co_stacksize=ROOM_SLOTS), _enter.__globals__, "_roomy_enter"
)


def in_stack_room(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn(*args, **kwargs)`, its frames at the start of a data-stack chunk of their own."""
    return _roomy_enter(fn, args, kwargs)
