"""The process that signs runs no Inductor, g++ or Triton (issue 16): with a sandbox,
the staged decomposition and lowering, an export and a Triton kernel compile run in its
child, as kernel builds and whole-graph compiles already did
(tests/integration/test_sandbox.py).

`_compilers_refused` makes Inductor's compile entry and graph lowering, its C++ builder
and Triton's compile fail and be counted in this process while the jobs run. Without a sandbox
(`test_without_a_sandbox_the_jobs_compile_in_this_process`), the same jobs trip it: that
is what proves it can fail the others. With one, each job succeeds and its artifact
computes what eager does, outputs and gradients.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from localfarm.fakes import InProcessFarm, memory_store
from sdk.backend import FarmBackend, build_request
from sdk.export_codec import encode_export
from tests.targets.test_kernels import SOURCE
from tests.targets.test_kernels import request as kernel_request
from torchfarm.fx import vecisa
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.wire import keys, routing
from torchfarm.wire.codes import JobError
from workers import sandbox
from workers.board import StageBoard
from workers.inprocess import InProcessExecutor
from workers.jobs.export import run_export_job
from workers.jobs.triton import KernelContext, run_kernel_job
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

BWRAP_OK, _ = sandbox.bwrap_works()
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def box() -> Iterator[sandbox.Sandbox]:
    """One worker process's sandbox, its forkserver shared by the module's jobs. The
    vector-ISA probe (Inductor's own test programs, no tenant's input) runs first, as a
    worker runs it at start-up (workers/priming.py), before the compilers are refused."""
    vecisa.picked()
    shared = sandbox.for_worker(WorkerSettings(), "bwrap" if BWRAP_OK else "process")
    yield shared
    shared.close()


@contextlib.contextmanager
def _compilers_refused() -> Iterator[list[str]]:
    """Inductor's compile entry and graph lowering, its C++ builds and Triton's compile,
    refused in this process; yields the list of those that were tried."""
    import triton
    from torch._inductor import compile_fx, cpp_builder, graph

    tried: list[str] = []

    def refuse(what: str):  # noqa: ANN202
        def refused(*args: object, **kwargs: object) -> None:
            tried.append(what)
            raise AssertionError(f"{what} ran in the process that signs")
        return refused

    with (
        mock.patch.object(compile_fx, "compile_fx", refuse("Inductor")),  # decomposition, lowering
        mock.patch.object(graph.GraphLowering, "__init__", refuse("Inductor")),  # AOTInductor too
        mock.patch.object(cpp_builder.CppBuilder, "build", refuse("g++")),
        mock.patch.object(triton, "compile", refuse("Triton")),
    ):
        yield tried


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x))).softmax(-1)


def _train_through(farm: InProcessFarm) -> None:
    """One training step of `_Mlp` compiled on `farm`, against eager's."""
    backend = FarmBackend(farm.sdk_settings(fallback="error"), client=farm.client())
    torch.manual_seed(0)
    model, x = _Mlp(), torch.randn(5, 6)
    eager = _Mlp()
    eager.load_state_dict(model.state_dict())
    try:
        out = torch.compile(model, backend=backend)(x)
        out.square().sum().backward()
    finally:
        torch._dynamo.reset()
    want = eager(x)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, **TOL)
    for got, ref in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, ref.grad, **TOL)


def _farm(box: sandbox.Sandbox | None) -> tuple[InProcessFarm, list[str]]:
    """A farm whose inline worker has `box`, and whose jobs run with the compilers refused
    in this process (not while the SDK loads what came back)."""
    farm = InProcessFarm(sandbox=box)
    farm.register_worker()
    tried: list[str] = []
    run = farm.run_jobs

    def guarded() -> int:
        with _compilers_refused() as seen:
            try:
                return run()
            finally:
                tried.extend(seen)

    farm.run_jobs = guarded
    return farm, tried


def test_a_staged_training_compile_lowers_in_the_sandbox(box, tmp_path, monkeypatch, caplog):
    """Decomposed in one child, lowered from that decomposition in another, the forward
    graph's kernels streamed out to be built while the backward graph still lowers.

    This small model's backward graph lowers in a few hundred milliseconds after the
    forward graph's specs come out, so the parent reads the stream every 10 ms, not every
    `WATCH_S`: a 200 ms tick could miss that window (it did once, in CI)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(sandbox.process, "WATCH_S", 0.01)
    caplog.set_level(logging.INFO, logger="workers")
    farm, tried = _farm(box)
    _train_through(farm)
    assert tried == []
    ran = [t.name for t in farm.dispatcher.ran]
    assert routing.LOWER_TASK in ran and routing.ASSEMBLE_TASK in ran, ran
    jobs = farm.store.recent_jobs()
    assert jobs and all(j.state == JobState.SUCCEEDED for j in jobs), [j.message for j in jobs]
    for job in jobs:
        assert StageBoard(farm.store).job_fields(job.key)["decomposed"] == "separately"
    assert "decomposition was not used" not in caplog.text
    streamed = [int(m) for m in re.findall(r"(\d+) sent while lowering", caplog.text)]
    assert streamed and max(streamed) > 0, caplog.text[-3000:]


def _export_job(ctx, model: torch.nn.Module, x: torch.Tensor) -> str:
    graph, spec = encode_export(torch.export.export(model, (x,)))
    request = build_request(graph, local_fingerprint(), "", {}, "export")
    request.export.CopyFrom(spec)
    key = keys.compute_key(request, "")
    ctx.store.put_request(key, request.SerializeToString(), 600)
    ctx.store.create_job(key, "cpu", "test", 600)
    return key


def test_an_export_builds_its_package_in_the_sandbox(box, tmp_path):
    farm = InProcessFarm(sandbox=box)
    torch.manual_seed(0)
    model, x = _Mlp().eval(), torch.randn(5, 6)
    key = _export_job(farm.context, model, x)
    with _compilers_refused() as tried:
        run_export_job(key, farm.context)
    assert tried == []
    job = farm.store.get_job(key)
    assert job.state == JobState.SUCCEEDED, job.message
    manifest = farm.store.get_manifest(key)
    path = tmp_path / "model.pt2"
    path.write_bytes(farm.store.get_blob(manifest.payload.digest))
    runner = torch._inductor.aoti_load_package(str(path))
    with torch.no_grad():
        torch.testing.assert_close(runner(x), model(x), **TOL)


def _kernel_job(store, target: str = "cuda:sm_90", **changes) -> str:
    request = kernel_request(target=target, **changes)
    key = keys.compute_kernel_key(request, "")
    store.put_kernel_request(key, request.SerializeToString(), 600)
    store.create_job(key, target, "test", 600)
    return key


def _kernel_ctx(box: sandbox.Sandbox | None):
    import importlib.metadata

    return KernelContext(
        store=memory_store(), name="k0", targets=frozenset({"cuda:sm_90"}),
        triton_version=importlib.metadata.version("triton"),
        executor=sandbox.SandboxExecutor(box, 64 << 20) if box is not None else InProcessExecutor(),
    )


def test_a_triton_kernel_compiles_in_the_sandbox(box):
    from torchfarm.kernels import elf

    ctx = _kernel_ctx(box)
    key = _kernel_job(ctx.store)
    with _compilers_refused() as tried:
        run_kernel_job(key, ctx)
    assert tried == []
    job = ctx.store.get_job(key)
    assert job.state == JobState.SUCCEEDED, job.message
    manifest = ctx.store.get_kernel(key)
    binary = ctx.store.get_blob(manifest.kernels[0].binary.digest)
    elf.check_binary(binary, "cuda", "sm_90")
    assert manifest.kernels[0].kind == "cubin" and json.loads(ctx.store.get_blob(manifest.payload.digest))


def test_a_triton_kernel_the_child_refuses_fails_as_invalid(box):
    """A name the worker resolves outside triton.language: refused in the child, told as
    the unsandboxed worker tells it."""
    source = SOURCE.replace("    pid = tl.program_id(0)\n", "    pid = triton.runtime.driver\n")
    ctx = _kernel_ctx(box)
    key = _kernel_job(ctx.store, source=source)
    run_kernel_job(key, ctx)
    job = ctx.store.get_job(key)
    assert job.state == JobState.FAILED and job.error_code == JobError.INVALID_KERNEL, job.message
    assert "outside triton.language" in job.message or "not something a kernel may use" in job.message


def test_without_a_sandbox_the_jobs_compile_in_this_process(tmp_path, monkeypatch):
    """TORCHFARM_SANDBOX=off (the tree before this change, for these three jobs): each
    job trips the refusal, so the tests above can fail."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    farm, tried = _farm(None)
    with pytest.raises(BackendCompilerFailed, match="Inductor ran in the process that signs"):
        _train_through(farm)
    assert "Inductor" in tried
    torch._dynamo.reset()

    farm = InProcessFarm()
    key = _export_job(farm.context, _Mlp().eval(), torch.randn(5, 6))
    with _compilers_refused() as seen:
        run_export_job(key, farm.context)
    assert seen and farm.store.get_job(key).state == JobState.FAILED

    ctx = _kernel_ctx(None)
    key = _kernel_job(ctx.store)
    with _compilers_refused() as seen:
        run_kernel_job(key, ctx)
    assert seen == ["Triton"] and ctx.store.get_job(key).state == JobState.FAILED


@contextlib.contextmanager
def _traces_refused() -> Iterator[list[str]]:
    """`_compilers_refused`, and AOTAutograd's trace of a graph (`aot_seam.traced_graphs`,
    the DTensor rank check's) refused in this process too."""
    from workers import aot_seam

    with _compilers_refused() as tried:
        def refused(*args: object, **kwargs: object) -> None:
            tried.append("AOTAutograd")
            raise AssertionError("AOTAutograd traced a tenant's graph in the process that signs")

        with mock.patch.object(aot_seam, "traced_graphs", refused):
            yield tried


def _dtensor_job(ctx, graph) -> str:
    request = build_request(graph, local_fingerprint(), "", {}, "dtensor")
    key = keys.compute_key(request, "")
    ctx.store.put_request(key, request.SerializeToString(), 600)
    ctx.store.create_job(key, "cpu", "test", 600)
    return key


def test_the_dtensor_rank_check_traces_in_the_sandbox(box):
    """Issue 40: the graph job's rank check traced every sharing rank's graph in the
    process that signs. With a sandbox, a graph that differs between ranks fails the job
    RANK_SPECIFIC as before, and one the same at every rank passes the check, this
    process tracing nothing."""
    from tests.unit.test_dtensor_format import capture_tp
    from tests.unit.test_rank_shared import _job, capture_vocab_parallel
    from workers import ranks
    from workers.jobs.graph import run_job

    farm = InProcessFarm(sandbox=box)
    key = _dtensor_job(farm.context, capture_vocab_parallel(0))
    shared = capture_tp(0)
    with _traces_refused() as tried:
        run_job(key, farm.context)
        ranks.check_shared(_job(shared), sandbox.SandboxExecutor(box, 64 << 20))
    job = farm.store.get_job(key)
    assert (job.state, job.error_code) == (JobState.FAILED, "RANK_SPECIFIC"), job.message
    assert "rank 1's compile" in job.message
    assert tried == []


def test_without_a_sandbox_the_rank_check_traces_in_this_process():
    """What proves `_traces_refused` can fail the test above."""
    from tests.unit.test_dtensor_format import capture_tp
    from tests.unit.test_rank_shared import _job
    from workers import ranks

    with _traces_refused() as tried, pytest.raises(AssertionError, match="process that signs"):
        ranks.check_shared(_job(capture_tp(0)), InProcessExecutor())
    assert tried == ["AOTAutograd"]
