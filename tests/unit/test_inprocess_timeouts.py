"""A time limit that fires inside a staged compile fails the job COMPILE_TIMEOUT.

Inside a lowering or a decomposition, Celery's soft limit lands wherever the compile
is; torch may catch it in a type-check, and the step then gives up for another path
(`NotDecomposable`, `NeedsWholeGraph`). Taken at its word, the job went on with that
path, past its limit, instead of failing as a compile that ran out of time."""

from __future__ import annotations

import copy

import pytest
import torch

from examples.models import make_mlp
from torchfarm.fx.encode import encode_graph
from torchfarm.v1 import farm_pb2
from torchfarm.wire.codes import JobError
from workers.aot_seam import Decomposition, NotDecomposable
from workers.compiler import NeedsWholeGraph
from workers.inprocess import InProcessExecutor
from workers.job import JobFailed, Prepared


class LimitFired(Exception):
    """Stands for the task runner's time-limit exception."""


def _job(model, inputs) -> Prepared:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(encode_graph(gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*inputs)
    request = farm_pb2.CompileRequest(graph=graphs[0], options=farm_pb2.CompileOptions())
    return Prepared(request, None, {}, 0.0, 0.0)


@pytest.fixture
def fresh_inductor(tmp_path):
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(tmp_path)):
        yield


def _training_decomposition(model, x) -> Decomposition:
    return InProcessExecutor().decompose(_job(model, (x,)))


@pytest.mark.parametrize("fired", [False, True])
def test_a_lowering_that_gives_up_for_another_path_after_the_limit_fails_compile_timeout(fired, fresh_inductor):
    model, (x,) = make_mlp(batch=4)
    dec = _training_decomposition(model, x)
    # Decomposed for training, lowered for inference: the lowering gives up for the
    # whole-graph path (NotDecomposable), as it would on a time limit caught inside.
    inference = _job(copy.deepcopy(model).requires_grad_(False), (x,))
    executor = InProcessExecutor(timed_out=lambda: fired)
    if fired:
        with pytest.raises(JobFailed) as failed:
            executor.lower(inference, lambda spec: None, dec)
        assert failed.value.code == JobError.COMPILE_TIMEOUT
        assert isinstance(failed.value.__cause__, NotDecomposable)
    else:
        with pytest.raises(NotDecomposable, match="decomposed for training"):
            executor.lower(inference, lambda spec: None, dec)


@pytest.mark.parametrize("fired", [False, True])
def test_a_decomposition_that_gives_up_after_the_limit_fails_compile_timeout(fired, fresh_inductor):
    from torch._functorch import config as functorch_config

    model, (x,) = make_mlp(batch=4)
    job = _job(model, (x,))
    with functorch_config.patch(enable_autograd_cache=True), torch._inductor.config.patch(fx_graph_cache=True):
        InProcessExecutor().compile_whole(job)
        # The same graph again: AOTAutograd's cache answers, nothing is traced, and the
        # decomposition gives up (NotDecomposable).
        executor = InProcessExecutor(timed_out=lambda: fired)
        if fired:
            with pytest.raises(JobFailed) as failed:
                executor.decompose(job.redecoded())
            assert failed.value.code == JobError.COMPILE_TIMEOUT
        else:
            with pytest.raises(NotDecomposable, match="traced nothing"):
                executor.decompose(job.redecoded())


def test_the_limit_in_the_chain_of_causes_counts_as_running_out():
    executor = InProcessExecutor(timeout_errors=(LimitFired,))
    try:
        try:
            raise LimitFired
        except LimitFired as e:
            raise NeedsWholeGraph("the compile called 1 kernels") from e
    except NeedsWholeGraph as e:
        assert executor.ran_out(e)
    assert not executor.ran_out(NeedsWholeGraph("the compile called 1 kernels"))
