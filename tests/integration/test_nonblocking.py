"""`sdk.compile(..., wait=False)` and compile progress, with real parts: redis-server, the
gRPC coordinator and a Celery worker.

The worker runs with the `TORCHFARM_TEST_DELAY_S` hook (workers/settings.py): each
compile sleeps DELAY_S in its "compile" stage, so a compile is still in flight when the
first training step ends, without making anything here a timing test.

Numerics against an eager twin stepped identically (same weights, data and SGD): loss
within 1e-5 absolute (plus 1e-5 relative), gradients within 1e-4 absolute or relative,
as in test_end_to_end.py; Inductor reorders float32 reductions.
"""

from __future__ import annotations

import copy
import json
import logging
import textwrap

import pytest
import torch

import sdk
from examples.models import TINY_GPT, make_gpt, make_mlp
from localfarm.stack import LocalStack, free_port
from sdk.nonblocking import COMPILED, COMPILING, EAGER, swapper_of
from tests.conftest import run_python
from torchfarm.storage.store import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

DELAY_S = 8.0
"""How long the worker sleeps in each compile."""


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory):
    """A stack of its own whose worker sleeps DELAY_S in every compile."""
    workdir = tmp_path_factory.mktemp("slow-stack")
    with LocalStack(
        workers=1, workdir=workdir, extra_env={"TORCHFARM_TEST_DELAY_S": str(DELAY_S)}, warmup=False
    ) as s:
        yield s


@pytest.fixture
def farm(slow_stack, monkeypatch):
    monkeypatch.setenv("TORCHFARM_TRUSTED_KEYS_FILE", str(slow_stack.trusted_keys_file))
    torch._dynamo.reset()
    yield slow_stack
    torch._dynamo.reset()


def sgd_step(model, opt, inputs):
    opt.zero_grad(set_to_none=True)
    loss = model(*inputs)
    loss = loss if loss.dim() == 0 else loss.pow(2).mean()
    loss.backward()
    grads = [p.grad.detach().clone() for p in opt.param_groups[0]["params"]]
    opt.step()
    return loss.detach(), grads


def assert_close_step(got, ref):
    (loss, grads), (ref_loss, ref_grads) = got, ref
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads, strict=False):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_training_runs_eagerly_then_swaps_and_matches_eager(farm, client_cache_dir):
    model, inputs = make_gpt(TINY_GPT, batch=4)
    twin = copy.deepcopy(model)
    compiled = sdk.compile(model, remote=farm.address, fallback="error", wait=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.5)

    assert_close_step(sgd_step(compiled, opt, inputs), sgd_step(twin, twin_opt, inputs))
    slots = swapper_of(compiled).graphs
    assert slots and all(s.key for s in slots)
    # Step 1 returned while the farm was still compiling: it ran the eager graph.
    assert [s.state for s in slots] == [COMPILING] * len(slots)
    store = farm.store()
    assert all((store.get_job(s.key) is None or store.get_job(s.key).state != JobState.SUCCEEDED)
               for s in slots)
    assert_close_step(sgd_step(compiled, opt, inputs), sgd_step(twin, twin_opt, inputs))

    assert sdk.wait_ready(compiled, timeout=600)
    assert all(store.get_job(s.key).state == JobState.SUCCEEDED for s in slots)
    eager_before = [s.eager_calls for s in slots]
    for _ in range(3):
        assert_close_step(sgd_step(compiled, opt, inputs), sgd_step(twin, twin_opt, inputs))
    assert [s.state for s in slots] == [COMPILED] * len(slots), [s.error for s in slots]
    assert [s.eager_calls for s in slots] == eager_before  # no eager run after the swap
    assert [s.compiled_calls for s in slots] == [3] * len(slots)
    assert all(s.swapped_at_call == 3 for s in slots)


def test_farm_down_keeps_training_eagerly_with_one_warning(client_cache_dir, caplog, monkeypatch):
    monkeypatch.setenv("TORCHFARM_CONNECT_TIMEOUT_S", "1")
    remote = f"grpc://127.0.0.1:{free_port()}"
    monkeypatch.setenv("TORCHFARM_TRUST_UNSIGNED", remote)  # trusted, so the SDK calls it
    torch._dynamo.reset()
    model, inputs = make_mlp()
    twin = copy.deepcopy(model)
    compiled = sdk.compile(model, remote=remote, wait=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    assert_close_step(sgd_step(compiled, opt, inputs), sgd_step(twin, twin_opt, inputs))
    assert sdk.wait_ready(compiled, timeout=120)
    for _ in range(2):
        assert_close_step(sgd_step(compiled, opt, inputs), sgd_step(twin, twin_opt, inputs))
    slots = swapper_of(compiled).graphs
    assert [s.state for s in slots] == [EAGER] * len(slots)
    assert all(isinstance(s.error, sdk.FarmUnavailable) for s in slots)
    assert [s.eager_calls for s in slots] == [3] * len(slots)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("sdk")
                and "without a signature check" not in r.getMessage()]  # TRUST_UNSIGNED's own, said once
    assert len(warnings) == 1 and "keeps running eagerly" in warnings[0].getMessage(), warnings
    torch._dynamo.reset()


def test_progress_lines_for_a_slow_compile(farm, client_cache_dir, caplog, monkeypatch):
    monkeypatch.setenv("TORCHFARM_PROGRESS_EVERY_S", "1")
    caplog.set_level(logging.INFO, logger="sdk")
    model, inputs = make_mlp(batch=17)  # a batch size of its own: a miss, not a hit
    sdk.compile(model, remote=farm.address, fallback="error")(*inputs).sum().backward()
    lines = [r.getMessage() for r in caplog.records if r.name == "sdk.progress"]
    during = [l for l in lines if "graph 1 of 1 so far: " in l]
    assert len(during) >= 2, lines
    assert any("so far: compile, " in l for l in during), lines
    assert "graph 1: ready after" in lines[-1]


def test_no_progress_above_info(farm, client_cache_dir, caplog, capfd):
    caplog.set_level(logging.WARNING, logger="sdk")
    model, inputs = make_mlp(batch=18)
    sdk.compile(model, remote=farm.address, fallback="error")(*inputs).sum().backward()
    assert [r for r in caplog.records if r.name.startswith("sdk")] == []
    assert "torchfarm" not in capfd.readouterr().err


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import sdk
    from sdk.nonblocking import swapper_of
    from examples.models import make_mlp
    model, inputs = make_mlp(batch=19)
    compiled = sdk.compile(model, remote=sys.argv[1], fallback="error", wait=False)
    compiled(*inputs).sum().backward()
    slots = swapper_of(compiled).graphs
    print(json.dumps({"keys": [s.key for s in slots], "states": [s.state for s in slots]}))
    """
)


def test_process_exits_with_a_compile_in_flight(farm, tmp_path):
    proc = run_python(
        f"import sys; sys.argv = ['x', {farm.address!r}]\n" + EXIT_SCRIPT,
        {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["states"] and set(out["states"]) == {COMPILING}
    # The process ended before its compile did: exiting did not wait for the farm.
    store = farm.store()
    assert all(store.get_job(k).state != JobState.SUCCEEDED for k in out["keys"])
