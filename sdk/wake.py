"""Submitting while the target's pool is down or starting: wait for it, within a bound.

A coordinator answers NO_WORKER (FAILED_PRECONDITION) when no live worker serves a graph's
target and the target is not one it knows (services/coordinator/farm.py queues jobs for
known targets even with no worker live, which is what wakes a pool scaled to zero). A
pool that is starting (pods scheduled, workers warming up) says the same for a
moment. Falling back at once would compile locally what the farm is seconds from
taking, so the submit is retried with backoff for up to `wake_timeout_s`, with the
graph's progress showing "waiting for a worker"; past it the NO_WORKER error stands and
the graph falls back (fallback="local") or raises. Free of torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sdk.errors import NoWorker
from sdk.progress import GraphTrack
from sdk.settings import SDKSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_DELAY_S = 0.5
"""First pause between submits; it doubles up to MAX_DELAY_S."""
MAX_DELAY_S = 5.0


def submit_waking(
    submit: Callable[[], T],
    settings: SDKSettings,
    track: GraphTrack | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`submit()`, retried while it fails NO_WORKER and `settings.wake_timeout_s` lasts."""
    deadline = clock() + settings.wake_timeout_s
    delay = FIRST_DELAY_S
    warned = False
    while True:
        try:
            return submit()
        except NoWorker as e:
            left = deadline - clock()
            if left < delay:
                raise
            if not warned:
                log.warning(
                    "torchfarm: no worker serves this graph's target yet (%s); waiting up to "
                    "%.0f s for one to start (TORCHFARM_WAKE_TIMEOUT_S)", e, left,
                )
                warned = True
            if track is not None:
                track.set_stage("waiting for a worker")
            sleep(delay)
            delay = min(2 * delay, MAX_DELAY_S)
