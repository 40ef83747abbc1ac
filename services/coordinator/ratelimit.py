"""A limit on failed authentication attempts: one small token bucket per key (a
client address, a tenant name a token claims), refilled at a steady rate.

A token has 256 random bits, so the limit is not what keeps a guesser out; it bounds
what a client that keeps presenting bad tokens costs the coordinator (a log line and a
metric each; throttled ones log nothing), and the rate at which anyone can test guesses
at all. Only failures drain a bucket, and only calls that fail to authenticate are
refused when it is empty: a call whose token verifies is admitted at once, so no one's
bad tokens lock a valid tenant out (auth.py). That a right guess is admitted while its
bucket is empty tells a guesser nothing it could use: it would have to guess right.
Clients behind one NAT share an address's bucket; behind a trusted proxy the address
is the client's the proxy forwards (proxies.py).

The same buckets serve as a plain per-tenant call rate (`take`), where a call costs the
coordinator more than its request does (farm.py's ExplainPrecompiledMiss).
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

    def take(self, peer: str) -> bool:
        """Takes one attempt out of the peer's bucket if one is left: whether it did. As a
        plain call rate, each call takes one (farm.py's ExplainPrecompiledMiss)."""
        if not self.allowed(peer):
            return False
        self.failed(peer)
        return True

    def failed(self, peer: str) -> None:
        """Takes one failure out of the peer's bucket."""
        level = max(0.0, self._level(peer) - 1.0)
        self._buckets[peer] = (level, self.clock())
        self._buckets.move_to_end(peer)
        while len(self._buckets) > self.max_peers:
            self._buckets.popitem(last=False)
