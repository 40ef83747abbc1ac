"""The farm's store in memory: `torchfarm.storage.store.Store` over fakeredis, Lua included.

The store's keys, pipelines and the staged compile's Lua scripts (workers/board.py) run
unchanged against fakeredis, whose scripts run in an embedded Lua (`lupa`). Clients made
on one `fakeredis.FakeServer` share its data, as clients of one redis-server do.

fakeredis has no INFO command: `cache_bytes` counts the bytes of the string values
instead of what Redis reports for its whole memory.
"""

from __future__ import annotations

import fakeredis

from torchfarm.storage.store import Store


class MemoryStore(Store):
    """A `Store` whose Redis is fakeredis, in this process. Tenant views stay in memory."""

    @classmethod
    def create(cls, prefix: str = "tf", server: fakeredis.FakeServer | None = None) -> MemoryStore:
        """A store on `server` (a new, empty one by default)."""
        return cls(fakeredis.FakeRedis(server=server or fakeredis.FakeServer()), prefix)

    def tenant(self, namespace: str) -> MemoryStore:
        return MemoryStore(self.r, self.prefix, namespace, self.blobs, self.c)

    def cache_memory(self) -> tuple[int, int]:
        """What `cache_bytes` counts, and no maxmemory: fakeredis never evicts."""
        return self.cache_bytes(), 0

    def cache_bytes(self) -> int:
        total = 0
        for name in self.c.scan_iter(count=1000):
            if self.c.type(name) == b"string":
                total += int(self.c.strlen(name))
        return total


def memory_store(prefix: str = "tf") -> MemoryStore:
    """An empty in-memory store, as `Store.from_url` gives one on a real Redis."""
    return MemoryStore.create(prefix)
