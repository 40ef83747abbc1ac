"""In-flight state lives apart from the artifact cache (issue 16, item 5).

The cache Redis may evict (`allkeys-lru`): one tenant's flood of large blobs must cost
other tenants cached artifacts at worst, never a job in flight. The job record, its
request, claims, quotas and registrations live in the state Redis
(`TORCHFARM_STATE_URL`), which evicts nothing, and the coordinator refuses a state
Redis that could.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
import redis

from localfarm.stack import LocalStack, free_port, start_redis_server
from sdk.client import FarmClient
from sdk.settings import SDKSettings
from services.coordinator import server
from services.coordinator.settings import CoordinatorSettings
from tests.requests import relu_request
from torchfarm.settings import from_env
from torchfarm.storage.store import Store
from torchfarm.v1 import farm_pb2

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CACHE_MAXMEMORY = 4 * 1024 * 1024
FLOOD_BLOB = 512 * 1024
FLOOD_BLOBS = 48
"""Six times the cache's memory: LRU sampling leaves nothing old in it."""


@pytest.fixture
def two_redis(tmp_path):
    """A state Redis (noeviction, the default) and a small `allkeys-lru` cache Redis."""
    procs = []
    urls = []
    for name in ("state", "cache"):
        port = free_port()
        workdir = tmp_path / name
        workdir.mkdir()
        procs.append(start_redis_server(port, workdir))
        urls.append(f"redis://127.0.0.1:{port}")
    cache = redis.Redis.from_url(urls[1])
    cache.config_set("maxmemory", CACHE_MAXMEMORY)
    cache.config_set("maxmemory-policy", "allkeys-lru")
    yield urls[0], urls[1]
    for p in procs:
        p.terminate()
        p.wait(10)


def _request_for_this_machine(label: str) -> farm_pb2.CompileRequest:
    from torchfarm.fx.fingerprint import local_fingerprint

    fp = local_fingerprint().to_dict()
    req = relu_request(isa=fp["isa"], label=label)
    req.target.compiler = fp["compiler"]
    req.build.CopyFrom(farm_pb2.Build(**{
        k: fp[k] for k in ("torch_version", "torch_git", "triton_version", "python", "platform")
    }))
    return req


def _flood(cache_url: str) -> None:
    """Another tenant's large artifacts, written as a worker writes blobs."""
    blobs = Store.from_url(cache_url + "/1").tenant("mallory")
    for _ in range(FLOOD_BLOBS):
        data = os.urandom(FLOOD_BLOB)
        blobs.put_blob("sha256:" + hashlib.sha256(data).hexdigest(), data)


@pytest.mark.slow
def test_a_job_in_flight_survives_an_eviction_flood_of_the_cache(two_redis, tmp_path):
    state_url, cache_url = two_redis
    req = _request_for_this_machine("survivor")
    target = f"cpu:{req.target.isa}"
    env = {
        "TORCHFARM_BROKER_URL": state_url + "/0",
        "TORCHFARM_STATE_URL": state_url + "/1",
        "TORCHFARM_CACHE_URL": cache_url + "/1",
        "TORCHFARM_KNOWN_TARGETS": target,  # queue it before any worker runs
        "TORCHFARM_PIPELINE": "whole",
    }
    stack = LocalStack(workers=1, workdir=tmp_path / "stack", tenants=("alice", "mallory"),
                       warmup=False, extra_env=env, publish_key=False)
    try:
        stack.start_coordinator()
        settings = SDKSettings(
            token=stack.tokens["alice"], trusted_keys_file=str(stack.trusted_keys_file),
            connect_timeout_s=30, compile_timeout_s=300,
        )
        client = FarmClient(stack.address, settings)
        reply = client.submit(req)
        assert not reply.cache_hit
        _flood(cache_url)  # while alice's job waits in its queue
        stack.start_worker(0)
        done = client.wait(reply.key)
        assert done.state == farm_pb2.SUCCEEDED
        manifest, blobs = client.fetch(reply.key)
        assert manifest and blobs
        client.close()
    finally:
        stack.stop()


def _serve_once(env: dict[str, str]) -> None:
    settings = from_env(CoordinatorSettings, env={"TORCHFARM_LISTEN": f"127.0.0.1:{free_port()}", **env})

    async def run() -> None:
        stop = asyncio.Event()
        stop.set()  # serve starts, then stops at once: only its start-up checks matter
        await server.serve(settings, stop)

    asyncio.run(run())


def test_the_coordinator_refuses_a_state_redis_that_may_evict(two_redis):
    state_url, cache_url = two_redis
    with pytest.raises(RuntimeError, match="maxmemory-policy"):
        _serve_once({"TORCHFARM_STATE_URL": cache_url + "/1", "TORCHFARM_CACHE_URL": cache_url + "/1"})


def test_the_coordinator_starts_on_a_noeviction_state_and_an_evicting_cache(two_redis):
    state_url, cache_url = two_redis
    _serve_once({"TORCHFARM_STATE_URL": state_url + "/1", "TORCHFARM_CACHE_URL": cache_url + "/1"})
