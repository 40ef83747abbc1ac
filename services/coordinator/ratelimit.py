"""Limits one coordinator process keeps per key: token buckets, and the long calls a
tenant holds open.

`TokenBuckets`: one small bucket per key, refilled at a steady rate.
- **Failed authentication attempts**, per client address and per tenant name a token
  claims (auth.py). A token has 256 random bits, so the limit is not what keeps a
  guesser out; it bounds what a client that keeps presenting bad tokens costs the
  coordinator (a log line and a metric each; throttled ones log nothing), and the rate
  at which anyone can test guesses at all. Only failures drain a bucket, and only calls
  that fail to authenticate are refused when it is empty: a call whose token verifies
  is admitted at once, so no one's bad tokens lock a valid tenant out. That a right
  guess is admitted while its bucket is empty tells a guesser nothing it could use: it
  would have to guess right. Clients behind one NAT share an address's bucket; behind a
  trusted proxy the address is the client's the proxy forwards (proxies.py).
- **A plain per-tenant call rate** (`take`), where a call costs the coordinator more
  than its request does (farm.py's ExplainPrecompiledMiss).

`TenantSlots`: Watch streams, kernel waits and FetchArtifact streams one tenant holds
open (farm.py).
"""
from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from services.coordinator import metrics
from services.coordinator.errors import TenantQueueFull
from torchfarm.trust.tokens import Tenant
from torchfarm.wire.codes import Reason

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


class TokenBuckets:
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


class TenantSlots:
    """Long calls of `what` one tenant holds open in this process, up to `limit` (0: no
    cap); past it, TenantQueueFull with `reason`. Each held call costs memory (a stalled
    fetch keeps a few chunks), so a tenant past its cap is refused, not queued."""

    def __init__(self, limit: int, what: str, reason: Reason):
        self.limit = limit
        self.what = what
        self.reason = reason
        self.held: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, tenant: Tenant) -> AsyncIterator[None]:
        held = self.held.get(tenant.name, 0)
        if self.limit and held >= self.limit:
            metrics.QUOTA_REFUSALS.inc()
            who = f"tenant {tenant.name!r}" if tenant.name else "this farm's (open) tenant"
            raise TenantQueueFull(
                f"{who} has {held} {self.what} open on this coordinator, the most it allows per "
                f"tenant ({self.limit}); retry when some end", self.reason,
            )
        self.held[tenant.name] = held + 1
        try:
            yield
        finally:
            left = self.held[tenant.name] - 1
            if left:
                self.held[tenant.name] = left
            else:
                del self.held[tenant.name]
