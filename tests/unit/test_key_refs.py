"""A key a client names (GetJob, Watch, FetchArtifact, ExplainMiss) is checked before any
Redis round trip: a request of tens of MiB once became a Redis key name and, for Watch, a
pub/sub channel the coordinator subscribed to before finding no job."""

from __future__ import annotations

import asyncio

import pytest

from localfarm.fakes import InProcessFarm
from services.coordinator.errors import InvalidRequest, NotFound


async def _drain(stream) -> None:
    async for _ in stream:
        pass


@pytest.mark.parametrize("key", ["a" * (1 << 20), "alice:" + "0" * 64, "../" + "0" * 64, ""])
def test_a_key_no_entry_can_have_is_refused_before_redis(key):
    farm = InProcessFarm().farm
    for call in (farm.job(key), farm.explain(key), _drain(farm.watch(key)), _drain(farm.fetch(key))):
        with pytest.raises(InvalidRequest, match="not a key"):
            asyncio.run(call)


def test_a_well_formed_key_is_looked_up():
    farm = InProcessFarm().farm
    for key in ("0" * 64, "pc1-" + "f" * 64):
        with pytest.raises(NotFound):
            asyncio.run(farm.job(key))
