"""Prewarming with a real stack: `sdk.warm` and `torchfarm warm SCRIPT.py`.

After a warm, a fresh process's `sdk.compile` of the same model is all cache hits,
builds no kernel, and matches eager: loss within 1e-5 (abs and rel), gradients within
1e-4, as tests/integration/test_end_to_end.py.

Each test warms a model of its own width (`WIDTHS`), so its first warm is a miss even
on a farm other tests have filled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sdk
from localfarm.stack import free_port
from sdk.errors import ConfigError
from sdk.report import COMPILED, FAILED, HIT, JOINED
from tests.conftest import ROOT, run_python

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

TORCHFARM = [sys.executable, "-m", "cli"]

_BASE = 24 + os.getpid() % 16 * 2
WIDTHS = {"module": _BASE, "inference": _BASE + 1, "script": _BASE + 3}
"""Distinct per test and per run: a key never seen by the farm before."""

MODEL_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):
        # BatchNorm: a forward in training mode changes its buffers. (No dropout: the
        # compiled graph draws other random numbers than eager, so outputs would differ.)
        def __init__(self, width):
            super().__init__()
            self.fc1 = nn.Linear(16, width)
            self.bn = nn.BatchNorm1d(width)
            self.fc2 = nn.Linear(width, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.bn(self.fc1(x))))

    def make(width, seed=0):
        torch.manual_seed(seed)
        return Net(width), (torch.randn(8, 16, generator=torch.Generator().manual_seed(seed)),)
    """
)
_ns: dict = {}
exec(compile(MODEL_SOURCE, "<test_warm model>", "exec"), _ns)
make = _ns["make"]

FRESH_PROCESS = MODEL_SOURCE + textwrap.dedent(
    """
    import copy, json, sys
    import sdk
    from sdk import report
    from torchfarm.fx.hooks import count_kernel_builds

    width, training = int(sys.argv[1]), sys.argv[2] == "train"
    model, inputs = make(width)
    if not training:
        model.eval()
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    with report.collect() as graphs, count_kernel_builds() as builds, torch.set_grad_enabled(training):
        out = sdk.compile(model, fallback="error")(*inputs)
    torch.manual_seed(1)
    with torch.set_grad_enabled(training):
        ref = eager(*inputs)
    result = {"outcomes": [g.outcome for g in graphs], "builds": builds.count}
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if training:
        out.pow(2).mean().backward()
        ref.pow(2).mean().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(model.bn.running_mean, eager.bn.running_mean, atol=1e-5, rtol=1e-5)
    print(json.dumps(result))
    """
)


def fresh_process(stack, width: int, training: bool, cache_dir) -> dict:
    """Compiles the model in a new process, with an empty Inductor cache: how every graph
    was served, how many kernels it built, and (asserted there) that it matches eager."""
    proc = run_python(
        f"import sys; sys.argv = ['x', '{width}', '{'train' if training else 'eval'}']\n" + FRESH_PROCESS,
        {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TORCHFARM_REMOTE": stack.address},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_compiles_for_training_leaves_the_model_alone_and_starts_a_fresh_process_hot(
    stack, client_cache_dir, tmp_path
):
    model, inputs = make(WIDTHS["module"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()

    first = sdk.warm(model, inputs, remote=stack.address, fallback="error")

    assert first.graphs and all(g.outcome in (COMPILED, JOINED) for g in first.graphs), first
    assert all(len(g.key) == 64 and g.kernels > 0 and g.bytes > 0 for g in first.graphs)
    assert all(g.compile_seconds > 0 for g in first.graphs if g.outcome == COMPILED)
    # Nothing of the caller's moved: parameters, BatchNorm's running stats, the RNG.
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    table = str(first)
    assert "OUTCOME" in table and first.graphs[0].key[:12] in table and "compiled" in table

    again = sdk.warm(model, inputs, remote=stack.address, fallback="error")
    assert again.all_hits, again
    assert [g.key for g in again.graphs] == [g.key for g in first.graphs]

    result = fresh_process(stack, WIDTHS["module"], True, tmp_path / "fresh")
    assert result["outcomes"] == [HIT] * len(first.graphs)
    assert result["builds"] == 0


def test_warm_for_inference_fills_the_no_grad_graphs(stack, client_cache_dir, tmp_path):
    model, inputs = make(WIDTHS["inference"])
    model.eval()
    warmed = sdk.warm(model, inputs, remote=stack.address, training=False, fallback="error")
    assert warmed.graphs and warmed.compiled == len(warmed.graphs), warmed

    result = fresh_process(stack, WIDTHS["inference"], False, tmp_path / "fresh")
    assert result["outcomes"] == [HIT] * len(warmed.graphs)
    assert result["builds"] == 0


def test_warm_without_a_farm_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TORCHFARM_REMOTE", raising=False)
    model, inputs = make(8)
    with pytest.raises(ConfigError, match="needs a farm"):
        sdk.warm(model, inputs)


SCRIPT = MODEL_SOURCE + textwrap.dedent(
    """
    import sys
    import sdk

    model, (x,) = make(int(sys.argv[1]))
    compiled = sdk.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = compiled(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} done", flush=True)
    """
)


def _warm_cli(stack, script, *args: str) -> tuple[dict, str]:
    out = subprocess.run(
        [*TORCHFARM, "warm", "--remote", stack.address, *args, str(script), str(WIDTHS["script"])],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout), out.stderr


def test_warm_cli_runs_the_script_for_one_step_and_reports(stack, client_cache_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    report, log = _warm_cli(stack, script, "--json")
    outcomes = [g["outcome"] for g in report["graphs"]]
    assert outcomes and set(outcomes) <= {COMPILED, JOINED}, report
    # Stopped when the model was called for the second time: one step ran.
    assert "step 0 done" in log and "step 1 done" not in log

    report, log = _warm_cli(stack, script, "--json", "--steps", "0")
    assert [g["outcome"] for g in report["graphs"]] == [HIT] * len(outcomes)
    assert "step 2 done" in log  # ran to its end

    table = subprocess.run(
        [*TORCHFARM, "warm", "--remote", stack.address, str(script), str(WIDTHS["script"])],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert table.returncode == 0, table.stderr[-3000:]
    assert "already cached" in table.stdout and "OUTCOME" in table.stdout

    result = fresh_process(stack, WIDTHS["script"], True, tmp_path / "fresh")
    assert result["outcomes"] == [HIT] * len(outcomes)
    assert result["builds"] == 0


def test_warm_cli_fails_when_a_graph_is_not_on_the_farm(tmp_path):
    """A prewarm job that warmed nothing must not pass: the farm is down here. The
    script still runs its step, eagerly (a local compile would fill no cache)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [*TORCHFARM, "warm", "--remote", f"grpc://127.0.0.1:{free_port()}", "--json", str(script), "8"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TORCHFARM_CONNECT_TIMEOUT_S": "1",
             "TORCHFARM_TRUSTED_KEYS": "somekey=" + "A" * 43 + "="},
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert [g["outcome"] for g in json.loads(out.stdout)["graphs"]] == [FAILED]
    assert "1 of 1 graphs are not on the farm" in out.stderr and "did not answer" in out.stderr
    assert "runs eagerly under torchfarm warm" in out.stderr and "step 0 done" in out.stderr


def test_warm_cli_refuses_a_missing_script(stack):
    out = subprocess.run(
        [*TORCHFARM, "warm", "--remote", stack.address, "/nonexistent/train.py"],
        capture_output=True, text=True,
    )
    assert out.returncode == 2 and "no such script" in out.stderr


def test_warm_cli_passes_on_the_script_failure(stack, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise RuntimeError('the script is broken')\n")
    out = subprocess.run(
        [*TORCHFARM, "warm", "--remote", stack.address, str(script)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 1
    assert "the script is broken" in out.stderr and "no graphs were compiled" in out.stdout
