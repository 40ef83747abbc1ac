"""The worker's job path around the compile, against the in-memory store, with the
compile itself replaced: namespaces, signing, the artifact size limit, the option
allow-list, and a time limit that Inductor wrapped in its own exception."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from localfarm.memory_store import memory_store
from tests.requests import relu_request
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.trust.signing import Signer, TrustedKeys
from torchfarm.wire import keys
from workers import fakepg, inprocess, runtime
from workers.compiler import CompileFailed, CompileResult, Kernel
from workers.jobs.graph import run_job
from workers.runtime import WorkerContext
from workers.settings import WorkerSettings


@pytest.fixture
def store():
    """The store in memory (localfarm/memory_store.py): these tests are about
    the logic around Redis, which runs there unchanged, Lua scripts included."""
    return memory_store()


class FakeTimeLimit(Exception):
    pass


@pytest.fixture
def ctx(store, monkeypatch):
    monkeypatch.setattr(fakepg, "decoded", lambda graph: _Decoded())
    monkeypatch.setattr(runtime, "check_build", lambda request, local: None)
    return WorkerContext(
        settings=WorkerSettings(max_artifact_bytes=1000),
        store=store,
        fingerprint=local_fingerprint(),
        name="w-test",
        signer=Signer.generate(),
        timeout_errors=(FakeTimeLimit,),
    )


class _Decoded:
    gm = None
    example_inputs: list = []
    fake_mode = None
    shape_env = ShapeEnv()  # a static graph's: the compile adds no shape guards
    symbols: dict = {}


def _submit(store, namespace: str, **changes) -> str:
    request = relu_request(**changes)
    key = keys.compute_key(request, namespace)
    view = store.tenant(namespace)
    view.put_request(key, request.SerializeToString(), 60)
    view.create_job(key, "cpu", "test", 60)
    return key


def _compile_returning(payload: bytes):
    def compile_graph(*args, **kwargs):
        kernel = Kernel(name="k", kind="cpp", source=b"src", binary=b"bin")
        return CompileResult(payload=payload, kernels=[kernel], timings={"compile": 0.1})

    return compile_graph


def test_signed_artifact_in_the_tenants_namespace(ctx, store, monkeypatch):
    monkeypatch.setattr(inprocess, "compile_graph", _compile_returning(b"payload"))
    key = _submit(store, "alice")
    run_job(key, ctx, "alice")
    alice = store.tenant("alice")
    assert alice.get_job(key).state == JobState.SUCCEEDED
    assert store.get_manifest(key) is None  # not in the unnamed namespace
    manifest = alice.get_manifest(key)
    assert manifest.tenant == "alice"
    TrustedKeys.parse(ctx.signer.trusted_entry()).verify(
        manifest, key=key, tenant="alice", fingerprint=ctx.fingerprint.to_dict()
    )


def test_a_key_from_another_namespace_is_refused(ctx, store, monkeypatch):
    monkeypatch.setattr(inprocess, "compile_graph", _compile_returning(b"payload"))
    key = _submit(store, "alice")
    bob = store.tenant("bob")
    bob.create_job(key, "cpu", "test", 60)
    bob.put_request(key, store.tenant("alice").get_request(key), 60)  # Alice's request under Bob
    run_job(key, ctx, "bob")
    assert bob.get_job(key).error_code == "MALFORMED_REQUEST"


def test_artifact_over_the_limit_fails_artifact_too_large(ctx, store, monkeypatch):
    monkeypatch.setattr(inprocess, "compile_graph", _compile_returning(b"x" * 2000))
    key = _submit(store, "")
    run_job(key, ctx)
    record = store.get_job(key)
    assert (record.state, record.error_code) == (JobState.FAILED, "ARTIFACT_TOO_LARGE")
    assert "2000" in record.message or "2006" in record.message
    assert store.get_manifest(key) is None


def test_disallowed_option_never_reaches_the_compiler(ctx, store, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("compiled")

    monkeypatch.setattr(inprocess, "compile_graph", boom)
    key = _submit(store, "", options={"cpp.cxx": '[null, "/bin/sh"]'})
    run_job(key, ctx)
    assert store.get_job(key).error_code == "OPTION_NOT_ALLOWED"


def test_a_failure_after_the_time_limit_fired_is_compile_timeout(ctx, store, monkeypatch):
    """A compile that failed with no chain back to the limit, after the limit fired in
    this task (seen: "TypeError: 'NoneType' object is not callable" 11 s after a 1 s
    limit, as if torch had caught the limit's exception where it landed)."""
    def swallowed(*a, **k):
        raise CompileFailed("TypeError: 'NoneType' object is not callable")

    monkeypatch.setattr(inprocess, "compile_graph", swallowed)
    key = _submit(store, "")
    run_job(key, ctx)
    assert store.get_job(key).error_code == "COMPILE_ERROR"  # the limit did not fire
    timed_out = dataclasses.replace(ctx, timed_out=lambda: True)
    key = _submit(store, "", dtype="float64")
    run_job(key, timed_out)
    assert store.get_job(key).error_code == "COMPILE_TIMEOUT"


def test_time_limit_wrapped_by_inductor_is_compile_timeout(ctx, store, monkeypatch):
    def wrapped(*a, **k):
        # Celery's exception, wrapped by Inductor's, wrapped by compile_graph's.
        try:
            try:
                raise FakeTimeLimit()
            except FakeTimeLimit as inner:
                raise RuntimeError("InductorError: lowering failed") from inner
        except RuntimeError as inductor:
            raise CompileFailed("RuntimeError: InductorError") from inductor

    monkeypatch.setattr(inprocess, "compile_graph", wrapped)
    key = _submit(store, "")
    run_job(key, ctx)
    assert store.get_job(key).error_code == "COMPILE_TIMEOUT"


def test_a_fault_of_the_worker_itself_fails_the_job_at_once(ctx, store, monkeypatch):
    """An exception no step expected (a bug, a RecursionError on a deep record) once
    left the job RUNNING: its client waited until the coordinator found it stale
    (stale_job_s, 16 minutes), then every retry did the same."""
    def bug(request, local):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(runtime, "check_build", bug)
    key = _submit(store, "")
    run_job(key, ctx)
    record = store.get_job(key)
    assert (record.state, record.error_code) == (JobState.FAILED, "WORKER_FAULT")  # not the graph's COMPILE_ERROR
    assert "the worker failed unexpectedly" in record.message and "RecursionError" in record.message


def test_the_task_runners_own_exceptions_leave_the_delivery_as_they_are(ctx, store, monkeypatch):
    """Its time limit (failed by the task layer) and a lost connection (which it runs
    again) are the runner's to handle, not a job failure."""
    def limit(request, local):
        raise FakeTimeLimit()

    monkeypatch.setattr(runtime, "check_build", limit)
    key = _submit(store, "")
    with pytest.raises(FakeTimeLimit):
        run_job(key, ctx)
    assert store.get_job(key).state == JobState.RUNNING


def test_a_long_failure_is_logged_with_its_start_and_its_end(store, caplog):
    """A refusal names the op at its start, a compile error its cause at its end: the
    worker's log line kept the last 500 characters only, and lost the op's name."""
    message = "op 'torch.ops.vision.roi_align' is refused: " + "x" * 2000 + " RuntimeError: the cause"
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        runtime.record_failure("k" * 64, store, runtime.JobError.INVALID_GRAPH, message, 60)
    logged = caplog.records[-1].getMessage()
    assert "roi_align" in logged and logged.endswith("the cause") and len(logged) < 1200
