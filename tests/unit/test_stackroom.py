"""workers/stackroom.py: a loop of calls across a data-stack chunk boundary maps and
unmaps a chunk on every call (CPython 3.11; gh-142183), and does not inside the room.

Each probe recurses to a depth, takes a frame padded by 0 to `PAD` slots, then makes
`CALLS` calls of a leaf function, counting the process's minor page faults (a chunk
mapped afresh is faulted in afresh). Depths and pads together put the leaf's frame at
every slot of one 16 KiB chunk's end, so one probe lands on the far side of a boundary.
"""

from __future__ import annotations

import resource
import sys
import types

import pytest

from workers.stackroom import in_stack_room

CALLS = 200
DEPTHS = range(0, 250)
"""Frames of `_down` (about 10 slots each): more than a 16 KiB chunk's 2,048 slots."""
PAD = 24


def _leaf() -> None:
    return None


def _loop() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CALLS):
        _leaf()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


_PADDED = [
    types.FunctionType(_loop.__code__.replace(co_stacksize=_loop.__code__.co_stacksize + k), globals())
    for k in range(PAD)
]


def _down(depth: int, pad: int) -> int:
    return _down(depth - 1, pad) if depth else _PADDED[pad]()


def _worst() -> int:
    return max(_down(d, k) for d in DEPTHS for k in range(PAD))


def test_a_call_loop_on_a_chunk_boundary_thrashes_outside_the_room_only():
    inside = in_stack_room(_worst)
    assert inside < CALLS // 4, f"{inside} page faults for {CALLS} calls in the room"
    outside = _worst()
    if sys.version_info[:2] == (3, 11):  # keeps no spare chunk (gh-142183)
        assert outside >= CALLS, "no call loop crossed a chunk boundary: the room is not needed"


def test_the_room_returns_and_raises_what_the_call_does():
    assert in_stack_room(lambda a, b: a * b, 6, b=7) == 42
    with pytest.raises(ZeroDivisionError):
        in_stack_room(divmod, 1, 0)
