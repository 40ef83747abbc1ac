"""The coordinator's blocking calls (services/coordinator/runner.py): off the event loop,
a backend's failure as BackendUnavailable, one runner shared by every service."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from kombu.exceptions import OperationalError

from localfarm.fakes import InlineDispatcher, InProcessFarm, memory_store
from services.coordinator.errors import BackendUnavailable
from services.coordinator.farm import Farm
from services.coordinator.runner import Runner
from services.coordinator.servicer import CompileFarmServicer
from services.coordinator.settings import CoordinatorSettings
from tests.requests import relu_request


def test_a_call_runs_off_the_event_loops_thread():
    async def main() -> tuple[int, int]:
        return threading.get_ident(), await Runner().run(threading.get_ident)

    loop_thread, call_thread = asyncio.run(main())
    assert call_thread != loop_thread


@pytest.mark.parametrize("error", [redis.ConnectionError("redis down"), OperationalError("broker down"),
                                   ConnectionRefusedError("refused")])
def test_a_backends_failure_is_backend_unavailable(error):
    def fails() -> None:
        raise error

    with pytest.raises(BackendUnavailable, match="farm backend unavailable") as raised:
        asyncio.run(Runner().run(fails))
    assert raised.value.__cause__ is error


def test_any_other_error_is_left_as_it_is():
    def fails() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        asyncio.run(Runner().run(fails))


class _Counting(Runner):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, fn, *args):
        self.calls.append(getattr(fn, "__name__", repr(fn)))
        return await super().run(fn, *args)


def test_the_farm_runs_its_store_calls_on_the_runner_it_is_given():
    runner = _Counting()
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher(), runner=runner)
    assert farm.runner is runner
    asyncio.run(farm.status())
    assert runner.calls


def test_the_servicer_shares_the_farms_runner_with_its_services():
    runner = _Counting()
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher(), runner=runner)
    servicer = CompileFarmServicer(farm, farm.settings)
    assert servicer.kernels.runner is runner and servicer.cache.runner is runner


def test_a_store_outage_reaches_the_client_as_unavailable(monkeypatch):
    """Through the servicer: a Redis that fails mid-submit is UNAVAILABLE (retried),
    not INTERNAL."""
    from sdk.errors import FarmUnavailable

    farm = InProcessFarm()

    def down(*args, **kwargs):
        raise redis.ConnectionError("connection refused")

    monkeypatch.setattr(farm.store, "tenant", down)
    with pytest.raises(FarmUnavailable, match="connection refused") as raised:
        farm.client(run_jobs=False).submit(relu_request())
    assert raised.value.code == "BACKEND_UNAVAILABLE"
