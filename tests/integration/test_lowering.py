"""The staged compile's decomposition and lowering jobs (workers/jobs/lower.py) against a
real redis-server, with real compiles of a small training graph: the graph job
decomposes and sends the lowering; the lowering job lowers from the stored graphs and
fans out; and the two ways a lowering decomposes in place instead: its decomposition
left the cache, or the graph job could not decompose apart.

Stage jobs are not run by Celery here: `WorkerContext.send` records what would be sent
(tests/integration/test_pipeline.py runs the whole pipeline on real workers).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sdk.backend import build_request
from torchfarm.fx.encode import encode_graph
from torchfarm.fx.fingerprint import local_fingerprint
from torchfarm.storage.store import JobState
from torchfarm.wire import keys, routing
from workers.board import StageBoard
from workers.jobs.graph import run_job
from workers.jobs.lower import run_lowering
from workers.jobs.sending import stage_queue
from workers.runtime import WorkerContext
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

@pytest.fixture(scope="module")
def inductor_dir(tmp_path_factory):
    """One Inductor cache for the module, as a worker process has."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path_factory.mktemp("inductor"))):
        yield


@pytest.fixture
def sent():
    return []


@pytest.fixture
def ctx(store, sent, inductor_dir):
    return WorkerContext(
        settings=WorkerSettings(kernel_batch=4),
        store=store,
        fingerprint=local_fingerprint(),
        name="w-decompose",
        send=lambda task, args, queue: sent.append((task, args, queue)),
    )


def _mlp_request(width: int):
    """A training graph of an MLP `width` wide: each width is a new key."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 10))
    x = torch.randn(4, 64)
    captured = {}

    def backend(gm, example_inputs):
        captured["graph"] = encode_graph(gm, example_inputs)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(x)
    return build_request(captured["graph"], local_fingerprint(), "", {}, f"mlp {width}")


def _submit(store, request, namespace: str = "") -> tuple[str, str]:
    """Queues `request` as the coordinator would; its key and exact target."""
    key = keys.compute_key(request, namespace)
    view = store.tenant(namespace)
    view.put_request(key, request.SerializeToString(), 600)
    view.create_job(key, routing.queue_for(request.target), "test", 600)
    return key, str(routing.target_of(request.target))


def _fields(store, key):
    return StageBoard(store).job_fields(key)


def test_the_graph_job_decomposes_and_the_lowering_job_lowers_from_it(ctx, store, sent):
    key, target = _submit(store, _mlp_request(48))
    run_job(key, ctx)
    assert _fields(store, key)["decomposed"] == "separately"
    assert store.get_job(key).stage == "lowering"
    assert sent == [(routing.LOWER_TASK, [key, "", target], stage_queue(target, ctx))]
    stored = StageBoard(store).get_decomposition(key)
    assert stored is not None and b"backward" in stored

    sent.clear()
    lowering = dataclasses.replace(ctx, name="w-lower")
    run_lowering(key, lowering, "", target)
    job = store.get_job(key)
    assert job.state == JobState.RUNNING and job.stage == "kernels"
    assert [(s["stage"], s["worker"]) for s in job.stages] == [
        ("decompose", "w-decompose"), ("lower", "w-lower"),
    ]
    assert job.stages[0]["seconds"] > 0 and job.kernels_total > 0
    assert {task for task, _, _ in sent} == {routing.BUILD_KERNELS_TASK}
    assert _fields(store, key)["lower_attempts"] == "1"


def test_a_graph_captured_under_no_grad_is_decomposed_for_inference(ctx, store, sent):
    """Grad mode is not in the graph: the worker compiles under the request's, as a local
    compile under `torch.no_grad()` would (one forward graph, nothing saved)."""
    request = _mlp_request(44)
    request.options.no_grad = True
    key, _ = _submit(store, request)
    run_job(key, ctx)
    stored = StageBoard(store).get_decomposition(key)
    assert stored is not None and b"backward" not in stored
    assert json.loads(stored[b"head"])["kind"] == "inference"


def test_a_lowering_whose_decomposition_left_the_cache_decomposes_itself(ctx, store, sent):
    key, target = _submit(store, _mlp_request(40))
    run_job(key, ctx)
    store.r.delete(*store.r.keys("tf:decomp:*"))
    run_lowering(key, dataclasses.replace(ctx, name="w-lower"), "", target)
    job = store.get_job(key)
    assert job.stage == "kernels" and job.kernels_total > 0
    # The lowering timed its own AOTAutograd as the decompose stage.
    assert [(s["stage"], s["worker"]) for s in job.stages] == [
        ("decompose", "w-lower"), ("lower", "w-lower"),
    ]


def test_a_graph_traced_from_the_workers_own_cache_is_lowered_in_its_graph_job(ctx, store, sent):
    # The first compile of this graph fills the worker's AOTAutograd cache; the same
    # graph in another namespace is a new key, and its decomposition has nothing to
    # trace, so the graph job lowers it itself and no lowering job is sent.
    request = _mlp_request(56)
    key, target = _submit(store, request)
    run_job(key, ctx)
    run_lowering(key, ctx, "", target)
    sent.clear()

    other, _ = _submit(store, request, "alice")
    alice = store.tenant("alice")
    run_job(other, ctx, "alice")
    fields = StageBoard(alice).job_fields(other)
    assert fields["decomposed"].startswith("in the lowering: AOTAutograd traced nothing")
    assert routing.LOWER_TASK not in {task for task, _, _ in sent}
    assert alice.get_job(other).stage in ("kernels", "assembling")


def _flex_lse_request():
    """An inference graph Inductor cannot lower on CPU (FlexAttention's `return_lse`),
    whose subgraphs keep it from decomposing apart."""
    from torch.nn.attention.flex_attention import flex_attention

    captured = {}

    def backend(gm, example_inputs):
        captured["graph"] = encode_graph(gm, example_inputs)
        return gm.forward

    def attend(q, k, v):
        return flex_attention(q, k, v, return_lse=True)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(attend, backend=backend)(*(torch.randn(1, 2, 128, 16) for _ in range(3)))
    request = build_request(captured["graph"], local_fingerprint(), "", {}, "flex lse")
    request.options.no_grad = True
    return request


@pytest.mark.timeout(300)
def test_a_graph_that_cannot_decompose_apart_fails_with_its_compile_error(ctx, store, sent):
    """The graph job lowers such a graph itself, and the lowering fails in Inductor: the
    job fails with Inductor's error. The lowering once ran inside the handler of the
    decomposition's refusal, which every later error then carried as its context; read
    as the lowering's own refusal, it lowered again and failed as a fault of the
    worker's, "NotDecomposable", hiding the compile error."""
    key, _ = _submit(store, _flex_lse_request())
    run_job(key, ctx)
    job = store.get_job(key)
    assert job.state == JobState.FAILED and job.error_code == "COMPILE_ERROR"
    assert "return_lse" in job.message and "unexpectedly" not in job.message, job.message


@pytest.mark.timeout(300)
def test_a_lowering_that_decomposes_itself_fails_with_its_compile_error(ctx, store, monkeypatch):
    """The same where a lowering's stored decomposition does not fit and it decomposes
    the graph itself: that lowering's failure is the job's, not the first refusal."""
    from workers.aot_seam import NotDecomposable
    from workers.inprocess import InProcessExecutor
    from workers.job import JobFailed, Prepared
    from workers.jobs.lower import lower

    real = InProcessExecutor.lower

    def nothing_fits(self, job, on_kernel, dec):
        if dec is not None:
            raise NotDecomposable("decomposed for training")
        return real(self, job, on_kernel, dec)

    monkeypatch.setattr(InProcessExecutor, "lower", nothing_fits)
    request = _flex_lse_request()
    key, target = _submit(store, request)
    with pytest.raises(JobFailed) as failed:
        lower(key, ctx, Prepared(request, None, {}, 0.0, 0.0), target, dec=object())
    assert failed.value.code.name == "COMPILE_ERROR" and "return_lse" in str(failed.value)
