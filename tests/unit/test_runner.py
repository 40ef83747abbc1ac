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
        super().__init__()
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


class _Threads:
    """Spies on CPU-bound checks: the thread each ran in, then the check itself."""

    def __init__(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch
        self.ran: dict[str, int] = {}

    def spy(self, module, name: str) -> None:
        original = getattr(module, name)

        def spied(*args, **kwargs):
            self.ran[name] = threading.get_ident()
            return original(*args, **kwargs)

        self.monkeypatch.setattr(module, name, spied)

    def off(self, call) -> tuple[int, BaseException | None]:
        """The event loop's thread, and what `call()` (a coroutine) raised."""
        async def main() -> tuple[int, BaseException | None]:
            try:
                await call()
            except Exception as e:  # the checks' outcome is not what this tests
                return threading.get_ident(), e
            return threading.get_ident(), None

        return asyncio.run(main())


def test_a_submits_validation_and_key_run_off_the_event_loop(monkeypatch):
    """A graph's validation is pure Python and may take a while: on the loop, it would
    stall every other tenant's calls."""
    from torchfarm.graph import graphcheck
    from torchfarm.wire import keys, options

    spies = _Threads(monkeypatch)
    spies.spy(graphcheck, "validate_graph")
    spies.spy(options, "check_options")
    spies.spy(keys, "compute_key")
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher())
    loop, _ = spies.off(lambda: farm.submit(relu_request(), 0))
    assert set(spies.ran) == {"validate_graph", "check_options", "compute_key"}
    assert loop not in spies.ran.values()


def test_a_refused_graph_is_refused_as_before_off_the_loop():
    from services.coordinator.errors import InvalidRequest
    from torchfarm.wire.codes import Reason

    request = relu_request()
    request.graph.nodes[1].target = "os.system"
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher())
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(farm.submit(request, 0))
    assert refused.value.reason == Reason.DISALLOWED_OP


def test_an_uploads_and_a_kernels_checks_run_off_the_event_loop(monkeypatch):
    from services.coordinator import precompiled
    from services.coordinator.triton_rpc import KernelService
    from torchfarm.kernels import triton_check
    from torchfarm.v1 import farm_pb2

    spies = _Threads(monkeypatch)
    spies.spy(precompiled, "check_upload")
    spies.spy(triton_check, "check_kernel_source")
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher())
    loop, _ = spies.off(lambda: farm.put_precompiled(farm_pb2.PrecompiledUpload(manifest=b"{}")))
    kernels = KernelService(farm, farm.runner)
    request = farm_pb2.KernelRequest(source="@triton.jit\ndef k(x):\n    pass\n", name="k",
                                     target=farm_pb2.Target(device="cuda", arch="sm_90"))
    spies.off(lambda: kernels.compile(request, 0))
    assert set(spies.ran) == {"check_upload", "check_kernel_source"}
    assert loop not in spies.ran.values()


def test_one_tenants_checks_leave_a_thread_for_the_others():
    """A tenant streaming large graphs holds at most all but one check thread: another
    tenant's Submit is checked at once, not behind its queue."""
    release = threading.Event()

    def slow() -> str:
        release.wait(30)
        return "a"

    async def main() -> str:
        runner = Runner()
        flood = [asyncio.ensure_future(runner.compute(slow, tenant="team-a")) for _ in range(4)]
        await asyncio.sleep(0.05)  # the flood reaches the threads first
        try:
            return await asyncio.wait_for(runner.compute(str.upper, "b", tenant="team-b"), 10)
        finally:
            release.set()
            assert await asyncio.gather(*flood) == ["a"] * 4

    assert asyncio.run(main()) == "B"


def test_the_open_farms_one_tenant_uses_every_check_thread():
    both = threading.Barrier(2, timeout=10)

    async def main() -> list[int]:
        runner = Runner()
        return await asyncio.gather(*(runner.compute(both.wait) for _ in range(2)))

    assert sorted(asyncio.run(main())) == [0, 1]


def test_the_farm_checks_a_submit_in_its_tenants_share(monkeypatch):
    seen: list[str] = []
    farm = Farm(CoordinatorSettings(), memory_store(), InlineDispatcher())
    compute = farm.runner.compute

    async def spied(fn, *args, tenant=""):
        seen.append(tenant)
        return await compute(fn, *args, tenant=tenant)

    monkeypatch.setattr(farm.runner, "compute", spied)
    from services.coordinator.errors import NoWorker
    from torchfarm.trust.tokens import Tenant

    with pytest.raises(NoWorker):  # checked, then found no worker: this farm has none
        asyncio.run(farm.submit(relu_request(), 0, Tenant(name="alice", namespace="team-a")))
    assert seen == ["team-a"]
