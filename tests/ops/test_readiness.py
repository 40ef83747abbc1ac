"""Readiness follows Redis: a real coordinator over a real redis-server reports
NOT_SERVING on its plaintext health port once Redis stops, and SERVING once it is back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from localfarm.fakes import InlineDispatcher
from localfarm.stack import free_port, start_redis_server
from services.coordinator import readiness
from services.coordinator.server import SERVICE_NAME, serve
from services.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status


async def _until(address: str, want: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await _status(address, SERVICE_NAME)
        if got == want:
            return
        assert time.monotonic() < deadline, f"health stayed {got}, wanted {want}"
        await asyncio.sleep(0.1)


def test_readiness_fails_while_redis_is_down_and_recovers(tmp_path):
    redis_port = free_port()
    (tmp_path / "redis").mkdir()
    redis = start_redis_server(redis_port, tmp_path / "redis")
    url = f"redis://127.0.0.1:{redis_port}/1"
    health_port = free_port()
    settings = CoordinatorSettings(
        listen=f"127.0.0.1:{free_port()}", cache_url=url, broker_url=url,
        health_port=health_port, health_check_s=0.2, grace_s=0.5,
    )
    probe = f"127.0.0.1:{health_port}"

    async def scenario() -> None:
        nonlocal redis
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, stop, dispatcher=InlineDispatcher()))
        try:
            await _until(probe, SERVING)
            assert await _status(probe, "") == SERVING
            # What compose's healthcheck runs: exit status 0 while serving.
            assert await asyncio.to_thread(readiness.probe, probe) == 0
            redis.terminate()
            redis.wait(10)
            await _until(probe, NOT_SERVING)
            assert await _status(probe, "") == NOT_SERVING
            assert await asyncio.to_thread(readiness.probe, probe) == 1
            redis = await asyncio.to_thread(start_redis_server, redis_port, tmp_path / "redis")
            await _until(probe, SERVING)
        finally:
            stop.set()
            await server

    try:
        asyncio.run(scenario())
    finally:
        redis.terminate()
        redis.wait(10)
