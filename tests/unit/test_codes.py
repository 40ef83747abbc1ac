"""The typed contract of failures and stages (torchfarm/wire/codes.py): the Python enums
match farm.proto's, every member has its table entry, and no code or reason is a
string literal any more where the workers and the coordinator raise them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchfarm.v1 import farm_pb2
from torchfarm.wire import codes
from torchfarm.wire.codes import JOB_ERRORS, REASONS, JobError, Reason, Rejection, Stage

ROOT = Path(__file__).resolve().parents[2]

ENUMS = [
    (JobError, farm_pb2.JobError.Code, "CODE_UNSPECIFIED"),
    (Reason, farm_pb2.Failure.Reason, "REASON_UNSPECIFIED"),
    (Stage, farm_pb2.Stage.Name, "NAME_UNSPECIFIED"),
    (Rejection, farm_pb2.ArtifactRejection.Reason, "REASON_UNSPECIFIED"),
]


@pytest.mark.parametrize(("kind", "proto", "unspecified"), ENUMS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_proto_value_has_a_member_and_back(kind, proto, unspecified):
    wire = {v.name: v.number for v in proto.DESCRIPTOR.values if v.name != unspecified}
    assert {m.name: m.number for m in kind} == wire
    assert proto.Value(unspecified) == 0


def test_every_job_error_has_its_table_entry_and_back():
    assert set(JOB_ERRORS) == set(JobError)


def test_every_reason_has_its_table_entry_and_back():
    assert set(REASONS) == set(Reason)


def test_members_are_the_names_records_carry():
    assert JobError.COMPILE_ERROR == "COMPILE_ERROR" and Reason.NO_WORKER == "NO_WORKER"
    assert Stage.LOWERING == "lowering" and "lowering" in frozenset({Stage.LOWERING})
    assert codes.number(Stage, "kernels") == farm_pb2.Stage.KERNELS
    assert codes.number(JobError, "CANCELLED") == 0  # a name this build does not know


def test_a_status_is_retried_for_every_reason_or_for_none():
    """The channel retries by status, not reason: one status cannot mean both."""
    retried = {i.status for i in REASONS.values() if i.retryable}
    not_retried = {i.status for i in REASONS.values() if not i.retryable}
    assert retried and not retried & not_retried
    assert codes.RETRYABLE_STATUSES == tuple(sorted(retried))


def test_no_worker_and_backend_down_have_distinct_statuses():
    no_worker, down = REASONS[Reason.NO_WORKER], REASONS[Reason.BACKEND_UNAVAILABLE]
    assert no_worker.status != down.status
    assert down.retryable and not no_worker.retryable


def test_job_failed_refuses_a_string_code():
    from workers.runtime import JobFailed

    with pytest.raises(TypeError, match="JobError"):
        JobFailed("COMPILE_ERROR", "boom")  # type: ignore[arg-type]
    assert JobFailed(JobError.COMPILE_ERROR, "boom").code is JobError.COMPILE_ERROR


def test_coordinator_errors_refuse_a_string_reason():
    from services.coordinator.errors import InvalidRequest

    with pytest.raises(TypeError, match="Reason"):
        InvalidRequest("bad", "UNKNOWN_TARGET")  # type: ignore[arg-type]
    assert InvalidRequest("bad", Reason.UNKNOWN_TARGET).reason is Reason.UNKNOWN_TARGET


# Calls whose code (the first argument past `skip`, or the keyword) is part of the contract.
_CODE_ARGUMENT = {
    "JobFailed": 0, "fail_job": 2, "fail_kernel_job": 2, "record_failure": 2,
    "InvalidRequest": 1, "RequestTooLarge": 1, "TenantQueueFull": 1, "NoWorker": 1,
    "NotFound": 1, "ArtifactCorrupt": 1, "KernelFailed": 1, "BackendUnavailable": 1,
    "CoordinatorError": 1,
    "SignatureError": 0, "rejected": 0, "FarmError": 1, "FarmUnavailable": 1, "JobLost": 1,
    "Unauthenticated": 1, "GraphRejected": 1, "QuotaExceeded": 1, "RemoteCompileError": 1,
    "ArtifactRejected": 1, "KernelRejected": 1, "FarmBug": 2,
}


def _literal_codes(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", getattr(node.func, "attr", ""))
        if name not in _CODE_ARGUMENT:
            continue
        args = list(node.args[_CODE_ARGUMENT[name] : _CODE_ARGUMENT[name] + 1])
        args += [k.value for k in node.keywords if k.arg in ("code", "reason")]
        found += [
            f"{path.relative_to(root)}:{node.lineno}: {name}({a.value!r})"
            for a in args
            if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
    return found


def test_no_side_raises_a_string_literal_code():
    paths = [p for d in ("workers", "services", "sdk") for p in sorted((ROOT / d).rglob("*.py"))]
    paths.append(ROOT / "torchfarm" / "trust" / "signing.py")
    assert len(paths) > 40
    assert [hit for p in paths for hit in _literal_codes(p)] == []


def test_the_scan_finds_a_literal_code(tmp_path):
    """The scan above cannot pass by seeing nothing."""
    probe = tmp_path / "probe.py"
    probe.write_text('raise JobFailed("COMPILE_ERROR", "x")\nraise NoWorker("m", reason="NO_WORKER")\n')
    assert len(_literal_codes(probe, tmp_path)) == 2
