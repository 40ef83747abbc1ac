"""What a coordinator refusal becomes on the wire and in the SDK, through the real
servicer and the real client channel (its retry policy included), on a loopback port
in this process: the farm behind the servicer is a stub that raises what it is told.

- "No worker serves this target" and "the backend is down" answer different statuses,
  and the channel retries only the second.
- An unexpected exception (INTERNAL) reaches the user as FarmBug naming the key.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import grpc
import pytest

from sdk import client as sdk_client
from sdk.errors import FarmBug, FarmUnavailable, NoWorker, QuotaExceeded, RemoteCompileError
from sdk.settings import SDKSettings
from services.coordinator import errors
from services.coordinator.runner import Runner
from services.coordinator.servicer import CompileFarmServicer, status_of
from services.coordinator.settings import CoordinatorSettings
from torchfarm.v1 import farm_pb2, farm_pb2_grpc
from torchfarm.wire.codes import RETRYABLE_STATUSES, Reason

KEY = "ab" * 32


class RaisingFarm:
    """Answers every Submit by raising `error`, counting the calls that reach it."""

    def __init__(self) -> None:
        self.error: BaseException = RuntimeError("unset")
        self.calls = 0
        self.runner = Runner()  # what the servicer hands its kernel and cache services
        self.settings = CoordinatorSettings()  # what its cache service reads its cap from

    async def submit(self, request, size, tenant):
        self.calls += 1
        raise self.error


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[RaisingFarm, str]]:
    farm = RaisingFarm()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict = {}

    async def main() -> None:
        server = grpc.aio.server()
        farm_pb2_grpc.add_CompileFarmServicer_to_server(
            CompileFarmServicer(farm, CoordinatorSettings()), server  # type: ignore[arg-type]
        )
        holder["port"] = server.add_insecure_port("127.0.0.1:0")
        holder["stop"] = asyncio.Event()
        await server.start()
        ready.set()
        await holder["stop"].wait()
        await server.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(20)
    yield farm, f"grpc://127.0.0.1:{holder['port']}"
    loop.call_soon_threadsafe(holder["stop"].set)
    thread.join(20)


def _submit(served, error: BaseException) -> tuple[BaseException, int]:
    farm, remote = served
    farm.error, farm.calls = error, 0
    client = sdk_client.FarmClient(remote, SDKSettings(remote=remote, rpc_timeout_s=20))
    try:
        with pytest.raises(Exception) as e:
            client.submit(farm_pb2.CompileRequest(), KEY)
    finally:
        client.close()
    return e.value, farm.calls


def test_the_channel_retries_exactly_the_retryable_statuses():
    config = json.loads(sdk_client._SERVICE_CONFIG)
    retried = config["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"]
    assert tuple(retried) == RETRYABLE_STATUSES == ("UNAVAILABLE",)
    assert status_of(errors.NoWorker.reason).name not in retried
    assert status_of(errors.BackendUnavailable.reason).name in retried


def test_no_worker_is_failed_precondition_and_not_retried(served):
    error, calls = _submit(served, errors.NoWorker("no live worker compiles graphs for cpu:avx512"))
    assert isinstance(error, NoWorker) and error.code == Reason.NO_WORKER
    assert isinstance(error.__cause__, grpc.RpcError)
    assert error.__cause__.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert calls == 1


def test_backend_down_is_unavailable_and_retried(served):
    error, calls = _submit(served, errors.BackendUnavailable("farm backend unavailable: redis"))
    assert type(error) is FarmUnavailable and error.code == Reason.BACKEND_UNAVAILABLE
    assert error.__cause__.code() == grpc.StatusCode.UNAVAILABLE
    assert calls == 4  # the retry policy's maxAttempts


def test_internal_reaches_the_user_as_a_farm_bug_naming_the_key(served):
    error, calls = _submit(served, KeyError("a bug in the coordinator"))
    assert isinstance(error, FarmBug) and not isinstance(error, FarmUnavailable)
    assert error.__cause__.code() == grpc.StatusCode.INTERNAL
    assert KEY in str(error) and "report" in str(error) and error.key == KEY
    assert error.fallback and calls == 1


def test_a_failed_kernel_job_is_not_retried(served):
    error, calls = _submit(served, errors.KernelFailed("WRONG_TARGET: this worker compiles ..."))
    assert isinstance(error, RemoteCompileError) and not error.retryable
    assert error.__cause__.code() == grpc.StatusCode.ABORTED and calls == 1


@pytest.mark.parametrize(
    "reason", [Reason.STORAGE_QUOTA, Reason.UPLOAD_RATE, Reason.TENANT_QUEUE_FULL, Reason.EXPLAIN_RATE],
)
def test_a_tenants_quota_or_rate_is_quota_exceeded_not_too_large(served, reason):
    error, calls = _submit(served, errors.StorageFull("over the quota", reason))
    assert isinstance(error, QuotaExceeded) and error.code == reason and calls == 1


def test_each_coordinator_error_answers_the_status_its_tree_names():
    """services/coordinator/errors.py draws these; the table must agree."""
    S = grpc.StatusCode
    expected = {
        errors.CoordinatorError: S.INTERNAL, errors.InvalidRequest: S.INVALID_ARGUMENT,
        errors.RequestTooLarge: S.RESOURCE_EXHAUSTED, errors.TenantQueueFull: S.RESOURCE_EXHAUSTED,
        errors.NoWorker: S.FAILED_PRECONDITION, errors.NotFound: S.NOT_FOUND,
        errors.ArtifactCorrupt: S.DATA_LOSS, errors.KernelFailed: S.ABORTED,
        errors.BackendUnavailable: S.UNAVAILABLE, errors.StorageFull: S.RESOURCE_EXHAUSTED,
    }
    tree = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.CoordinatorError)}
    assert set(expected) == tree
    assert {kind: status_of(kind.reason) for kind in tree} == expected


def test_job_status_carries_code_and_stage_by_name_and_by_value():
    from services.coordinator.servicer import job_status
    from torchfarm.storage.store import JobRecord, JobState

    failed = job_status(JobRecord(KEY, JobState.FAILED, stage="compile", error_code="COMPILE_ERROR"))
    assert (failed.error_code, failed.error) == ("COMPILE_ERROR", farm_pb2.JobError.COMPILE_ERROR)
    assert (failed.stage, failed.stage_id) == ("compile", farm_pb2.Stage.COMPILE)
    # A name this build does not know keeps its string and reads UNSPECIFIED.
    odd = job_status(JobRecord(KEY, JobState.FAILED, stage="later", error_code="CANCELLED"))
    assert (odd.error_code, odd.error, odd.stage, odd.stage_id) == ("CANCELLED", 0, "later", 0)
