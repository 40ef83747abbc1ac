"""A per-peer limit on failed authentication attempts: one small token bucket per peer
host, refilled at a steady rate.

A token has 256 random bits, so the limit is not what keeps a guesser out; it bounds
what a peer that keeps presenting bad tokens costs the coordinator (a hash, a log line,
a metric each), and the rate at which anyone can test guesses at all. A peer whose
bucket is empty is refused RESOURCE_EXHAUSTED before its token is looked at, valid or
not: were a good token still admitted, the refusal would tell a guesser when it guessed
right. Peers behind one NAT share a bucket; the burst is sized so that a client with a
stale token and its retries do not lock its neighbours out.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_PEERS = 10_000
"""Peers remembered at once; the least recently seen is forgotten first (a full bucket)."""


def peer_host(peer: str) -> str:
    """grpc's peer string ("ipv4:10.0.0.1:5555", "ipv6:[::1]:5555") without its port."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


class FailureLimiter:
    """Each peer may fail `burst` times at once, then once every 1/`per_s` seconds."""

    def __init__(
        self, burst: int, per_s: float, max_peers: int = MAX_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.burst = float(burst)
        self.per_s = per_s
        self.max_peers = max_peers
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, peer: str) -> float:
        entry = self._buckets.get(peer)
        if entry is None:
            return self.burst
        level, at = entry
        return min(self.burst, level + (self.clock() - at) * self.per_s)

    def allowed(self, peer: str) -> bool:
        """Whether the peer may make another attempt now (a failure left in its bucket)."""
        return peer not in self._buckets or self._level(peer) >= 1.0

    def failed(self, peer: str) -> None:
        """Takes one failure out of the peer's bucket."""
        level = max(0.0, self._level(peer) - 1.0)
        self._buckets[peer] = (level, self.clock())
        self._buckets.move_to_end(peer)
        while len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
