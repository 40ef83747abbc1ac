"""Dynamic shapes on the farm, with a real stack: redis-server, coordinator, Celery worker.

- The key leaves symbols' hints out: the same dynamic graph captured at another batch
  size, in a fresh process, is a cache hit.
- A guard Inductor adds while it compiles (here `need_use_acc_helper`'s reduction-size
  bound in the C++ backend) travels in the manifest and joins Dynamo's guards, so the
  farm recompiles exactly where torch.compile does; the shared artifact is not used at
  sizes where its guard is false.
- Automatic dynamic shapes (no `dynamic=`) recompile as torch.compile does.

Numerics against eager: outputs within 1e-5 (absolute and relative), gradients within
1e-4, as in test_end_to_end.py.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters

import sdk
from tests.conftest import run_python

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

KEY = re.compile(r"key=([0-9a-f]{12})")

BATCH_SCRIPT = textwrap.dedent(
    """
    import copy, json, logging, sys
    import torch
    import sdk
    from torchfarm.fx.hooks import count_kernel_builds
    records = []
    class Keep(logging.Handler):
        def emit(self, r):
            if r.name == "sdk.backend":
                records.append(r.getMessage())
    logging.getLogger("sdk").addHandler(Keep()); logging.getLogger("sdk").setLevel(logging.INFO)
    remote, batch = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    x = torch.randn(batch, 16)
    with count_kernel_builds() as builds:
        compiled = sdk.compile(model, remote=remote, fallback="error", dynamic=True)
        out = compiled(x)
        out.pow(2).mean().backward()
    ref = eager(x)
    ref.pow(2).mean().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    print(json.dumps({"builds": builds.count, "log": records}))
    """
)


def _run_batch(stack, cache_dir, batch):
    proc = run_python(
        f"import sys; sys.argv = ['x', {stack.address!r}, '{batch}']\n" + BATCH_SCRIPT,
        {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    farm = [l for l in result["log"] if KEY.search(l)]
    assert len(farm) == 1, result["log"]  # one graph, compiled on the farm
    result["key"] = KEY.search(farm[0]).group(1)
    result["line"] = farm[0]
    return result


def test_same_dynamic_graph_at_another_batch_is_a_hit(stack, tmp_path):
    first = _run_batch(stack, tmp_path / "a", batch=4)
    second = _run_batch(stack, tmp_path / "b", batch=8)
    assert second["key"] == first["key"]
    assert " hit " in second["line"], second["line"]
    assert second["builds"] == 0


def _summed_matmul(x, w):
    # The reduction's length is w's dynamic second size: the C++ backend picks its
    # accumulation scheme from the size hint and guards `size <= 4096` on it.
    return (torch.relu(x @ w) * 2).sum(dim=-1)


def _graphs_and_outputs(compiled, calls):
    torch._dynamo.reset()
    counters.clear()
    outs = [compiled(*args) for args in calls]
    return counters["stats"]["unique_graphs"], outs


def test_inductor_guard_travels_and_is_respected(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    calls = [(x, torch.randn(8, n)) for n in (16, 32, 5000, 6000)]
    local_graphs, _ = _graphs_and_outputs(torch.compile(_summed_matmul, dynamic=True), calls)
    farm_graphs, outs = _graphs_and_outputs(
        sdk.compile(_summed_matmul, remote=stack.address, fallback="error", dynamic=True), calls
    )
    torch._dynamo.reset()
    assert local_graphs == 2  # torch.compile recompiles once the sum is longer than 4096
    assert farm_graphs == local_graphs
    for out, args in zip(outs, calls, strict=False):
        torch.testing.assert_close(out, _summed_matmul(*args), atol=1e-4, rtol=1e-5)
    msgs = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    assert not any("compiles locally" in m for m in msgs), msgs
    respecialized = [m for m in msgs if "false at these sizes" in m]
    assert len(respecialized) == 1 and "<= 4096" in respecialized[0], msgs
    keys = [KEY.search(m).group(1) for m in msgs if "graph" in m and " | " in m]
    assert len(keys) == 2 and keys[0] != keys[1], msgs


class SeqModel(torch.nn.Module):
    """Attention-like mixing over the sequence, so the sequence length is in the math."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.proj(x)
        mix = torch.softmax(h @ h.transpose(1, 2) / 4.0, dim=-1)
        return self.norm(mix @ h)


def _train(compiled, model, inputs):
    losses, grads = [], []
    for x in inputs:
        model.zero_grad()
        x = x.clone().requires_grad_()
        loss = compiled(x).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([x.grad] + [p.grad.clone() for p in model.parameters()])
    return losses, grads


def test_automatic_dynamic_recompiles_on_the_farm_as_torch_compile(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    torch.manual_seed(0)
    model = SeqModel()
    inputs = [torch.randn(2, n, 16) for n in (8, 12, 16)]
    local = copy.deepcopy(model)
    eager = copy.deepcopy(model)

    torch._dynamo.reset()
    counters.clear()
    _train(torch.compile(local), local, inputs)
    local_graphs = counters["stats"]["unique_graphs"]

    torch._dynamo.reset()
    counters.clear()
    got = _train(sdk.compile(model, remote=stack.address, fallback="error"), model, inputs)
    farm_graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()

    # Seq 8 compiles static; 12 recompiles with a dynamic sequence length; 16 reuses it.
    assert local_graphs == 2
    assert farm_graphs == local_graphs
    ref = _train(eager, eager, inputs)
    for loss, ref_loss in zip(got[0], ref[0], strict=False):
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for grads, ref_grads in zip(got[1], ref[1], strict=False):
        for g, r in zip(grads, ref_grads, strict=False):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    msgs = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    farm = [m for m in msgs if KEY.search(m)]
    assert len(farm) == 2 and not any("compiles locally" in m for m in msgs), msgs


def test_float_module_attribute_with_dynamic_true(stack, client_cache_dir, caplog):
    """LayerNorm's `eps` under `dynamic=True` (issue 18, item 2): Dynamo passes it as a
    0-d tensor read with `.item()`; sent as such, the worker's fake propagation stopped
    on an unhinted float (`GuardOnDataDependentSymNode ... zuf0`). It is specialized as
    local torch.compile specializes it: one graph for every batch size."""
    caplog.set_level(logging.INFO, logger="sdk")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )
    calls = [(torch.randn(n, 8),) for n in (4, 7, 16, 33)]
    local_graphs, _ = _graphs_and_outputs(torch.compile(model, dynamic=True), calls)
    farm_graphs, outs = _graphs_and_outputs(
        sdk.compile(model, remote=stack.address, fallback="error", dynamic=True), calls
    )
    torch._dynamo.reset()
    assert local_graphs == 1
    assert farm_graphs == local_graphs
    for out, (x,) in zip(outs, calls, strict=False):
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    msgs = [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]
    assert not any("compiles locally" in m for m in msgs), msgs


def _upsampled(x):
    return torch.nn.functional.interpolate(x, scale_factor=1.5, mode="linear").sum(-1)


def test_a_guard_over_a_float_scale_travels(stack, client_cache_dir, caplog):
    """`interpolate(scale_factor=1.5)` under dynamic shapes: the compile guards on
    `TruncToInt(1.5*ToFloat(s))`, which the wire form once lacked, so the farm compiled
    the graph, refused to ship it (UNSHIPPABLE_GUARD), and it compiled again locally."""
    caplog.set_level(logging.INFO, logger="sdk")
    calls = [(torch.randn(2, 2, n),) for n in (8, 12)]
    local_graphs, _ = _graphs_and_outputs(torch.compile(_upsampled, dynamic=True), calls)
    farm_graphs, outs = _graphs_and_outputs(sdk.compile(_upsampled, remote=stack.address, fallback="error",
                                                        dynamic=True), calls)
    torch._dynamo.reset()
    assert farm_graphs == local_graphs
    for out, args in zip(outs, calls, strict=True):
        torch.testing.assert_close(out, _upsampled(*args))
