"""Swap machinery of `sdk.compile(..., wait=False)` (sdk/nonblocking.py), with no server:
a Dynamo backend of the test's own stands in for the farm, and its "compiled" callable
is the graph itself behind a gate the test opens.

Torch behaviour pinned here: a forward pre-hook on the `OptimizedModule` that
`torch.compile(module)` returns runs once at the start of every call, outside the
compiled frame (torch/_dynamo/eval_frame.py, `OptimizedModule.__call__` →
`nn.Module.__call__`), which is where the step boundary lives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
import torch

from sdk import nonblocking
from sdk.errors import ConfigError, FarmBug, FarmUnavailable, RemoteCompileError
from sdk.nonblocking import COMPILED, COMPILING, EAGER, READY, Swapper


class TwoGraphs(torch.nn.Module):
    """Two graphs per call: the print is a graph break."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(x).sum()


def compile_with(
    swapper: Swapper, gate: threading.Event, fail: BaseException | None = None,
    before_eager: dict[int, Callable[[], None]] | None = None,
):
    """torch.compile with a backend that hands out slots whose work waits on `gate`;
    an eager run of graph `i` first calls `before_eager[i]`, if the test has put one there."""
    compiled_runs = []
    hooks = before_eager if before_eager is not None else {}

    def backend(gm, example_inputs):
        index = len(swapper.graphs) + 1

        def eager(*args):
            if index in hooks:
                hooks[index]()
            return gm.forward(*args)

        def work():
            gate.wait(60)
            if fail is not None:
                raise fail

            def compiled(*args):
                compiled_runs.append(index)
                return gm.forward(*args)

            return compiled

        return swapper.defer(index, f"key{index}", eager, work)

    return backend, compiled_runs


@pytest.fixture
def model():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield TwoGraphs()
    torch._dynamo.reset()


def test_graphs_run_eagerly_then_switch_together_at_a_call(model):
    swapper, gate = Swapper("TwoGraphs", "local"), threading.Event()
    backend, compiled_runs = compile_with(swapper, gate)
    compiled = nonblocking.attach(torch.compile(model, backend=backend), swapper)
    x = torch.randn(4, 8)
    ref = model(x)

    out = compiled(x)
    torch.testing.assert_close(out, ref)
    assert [s.state for s in swapper.graphs] == [COMPILING, COMPILING]
    assert not nonblocking.wait_ready(compiled, timeout=0.05)

    gate.set()
    assert nonblocking.wait_ready(compiled, timeout=60)
    assert [s.state for s in swapper.graphs] == [READY, READY]  # not before a call starts
    out = compiled(x)
    torch.testing.assert_close(out, ref)
    assert [s.state for s in swapper.graphs] == [COMPILED, COMPILED]
    assert [(s.eager_calls, s.compiled_calls, s.swapped_at_call) for s in swapper.graphs] == [
        (1, 1, 2), (1, 1, 2)
    ]
    assert compiled_runs == [1, 2]


def test_a_graph_ready_mid_call_waits_for_the_next_call(model):
    swapper, gate = Swapper("TwoGraphs", "local"), threading.Event()
    before_eager: dict[int, Callable[[], None]] = {}
    backend, _ = compile_with(swapper, gate, before_eager=before_eager)
    compiled = nonblocking.attach(torch.compile(model, backend=backend), swapper)
    x = torch.randn(4, 8)
    compiled(x)
    # Open the gate from inside the second graph's eager run: the first graph was
    # already run eagerly in this call, and nothing may switch before the call ends.
    states = []

    def open_the_gate():
        gate.set()
        assert nonblocking.wait_ready(compiled, timeout=60)
        states.append([s.state for s in swapper.graphs])

    before_eager[2] = open_the_gate
    compiled(x)
    assert states == [[READY, READY]]
    assert [s.eager_calls for s in swapper.graphs] == [2, 2]
    compiled(x)
    assert [s.state for s in swapper.graphs] == [COMPILED, COMPILED]


def test_background_failure_keeps_eager_with_one_warning(model, caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    swapper, gate = Swapper("TwoGraphs", "local"), threading.Event()
    backend, _ = compile_with(swapper, gate, fail=FarmUnavailable("farm down"))
    compiled = nonblocking.attach(torch.compile(model, backend=backend), swapper)
    x = torch.randn(4, 8)
    compiled(x)
    gate.set()
    assert nonblocking.wait_ready(compiled, timeout=60)
    torch.testing.assert_close(compiled(x), model(x))
    assert [s.state for s in swapper.graphs] == [EAGER, EAGER]
    assert [s.eager_calls for s in swapper.graphs] == [2, 2]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "keeps running eagerly" in warnings[0].getMessage()


def test_a_farm_bug_is_warned_of_for_every_graph_with_its_key(model, caplog):
    """Unlike an outage, a bug in the farm is not said once and then kept quiet."""
    caplog.set_level(logging.INFO, logger="sdk")
    swapper, gate = Swapper("TwoGraphs", "local"), threading.Event()
    backend, _ = compile_with(swapper, gate, fail=FarmBug("submit: the farm failed", "k" * 64))
    compiled = nonblocking.attach(torch.compile(model, backend=backend), swapper)
    x = torch.randn(4, 8)
    compiled(x)
    gate.set()
    assert nonblocking.wait_ready(compiled, timeout=60)
    assert [s.state for s in swapper.graphs] == [EAGER, EAGER]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and all("FarmBug" in w and "k" * 64 in w for w in warnings)


def test_with_fallback_error_the_next_call_raises_once(model):
    swapper, gate = Swapper("TwoGraphs", "error"), threading.Event()
    backend, _ = compile_with(swapper, gate, fail=RemoteCompileError("boom", "COMPILE_ERROR"))
    compiled = nonblocking.attach(torch.compile(model, backend=backend), swapper)
    x = torch.randn(4, 8)
    compiled(x)
    gate.set()
    assert nonblocking.wait_ready(compiled, timeout=60)
    with pytest.raises(RemoteCompileError, match="boom"):
        compiled(x)
    torch.testing.assert_close(compiled(x), model(x))  # raised once; eager after that


def test_compiled_function_gets_a_boundary_too():
    torch._dynamo.reset()
    swapper, gate = Swapper("fn", "local"), threading.Event()
    backend, compiled_runs = compile_with(swapper, gate)
    fn = nonblocking.attach(torch.compile(lambda x: (x * 2).sum(), backend=backend), swapper)
    x = torch.randn(3)
    fn(x)
    gate.set()
    assert nonblocking.wait_ready(fn, timeout=60)
    assert fn(x) == (x * 2).sum()
    assert compiled_runs == [1] and swapper.calls == 2
    torch._dynamo.reset()


def test_wait_ready_refuses_a_model_not_compiled_with_wait_false():
    with pytest.raises(ConfigError, match="wait=False"):
        nonblocking.wait_ready(torch.nn.Linear(2, 2))


def test_wait_must_be_a_bool():
    import sdk

    with pytest.raises(ConfigError, match="wait must be True or False"):
        sdk.compile(torch.nn.Linear(2, 2), remote="grpc://127.0.0.1:1", wait="no")


def test_the_blocking_backend_warns_of_every_farm_bug_but_of_an_outage_once(caplog):
    from sdk.backend import FarmBackend
    from sdk.settings import SDKSettings

    caplog.set_level(logging.WARNING, logger="sdk")
    backend = FarmBackend(SDKSettings(remote="grpc://127.0.0.1:1"), name="m")
    try:
        for index in (1, 2):
            backend._warn_fallback(index, FarmUnavailable("farm down"))
            backend._warn_fallback(index, FarmBug("submit: the farm failed", f"{index}" * 64))
    finally:
        backend.client.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("FarmUnavailable" in w for w in warnings) == 1
    bugs = [w for w in warnings if "FarmBug" in w]
    assert len(bugs) == 2 and "1" * 64 in bugs[0] and "2" * 64 in bugs[1]


def test_a_long_compile_error_is_warned_of_by_its_first_line(caplog):
    from sdk.backend import FarmBackend
    from sdk.settings import SDKSettings

    caplog.set_level(logging.DEBUG, logger="sdk")
    dump = "\n".join(f"  ir line {i}" for i in range(200))  # an Inductor IR dump, say
    error = RemoteCompileError(
        "the farm could not compile the graph (COMPILE_ERROR): CompileFailed: InductorError: "
        f"LoweringException: AttributeError: no attribute 'x'\n  target: aten.bmm.default\n{dump}",
        "COMPILE_ERROR",
    )
    backend = FarmBackend(SDKSettings(remote="grpc://127.0.0.1:1"), name="m")
    try:
        backend._warn_fallback(1, error)
    finally:
        backend.client.close()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "AttributeError: no attribute 'x'" in warning and "ir line" not in warning
    assert "201 more lines" in warning and "DEBUG" in warning
    assert any("ir line 199" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.norm, self.b = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.norm(self.a(x))))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dynamic_graph_whose_artifact_carries_shape_guards_swaps_in(compiling_farm):
    # An epoch's short last batch recompiles the graph with a symbolic batch size. Its
    # artifact carries shape guards, which were refused with wait=False: that graph,
    # which then serves every batch size, ran eagerly for good.
    from sdk.backend import FarmBackend

    torch.manual_seed(0)
    model = Net()
    backend = FarmBackend(compiling_farm.sdk_settings(fallback="error"), client=compiling_farm.client(), wait=False)
    compiled = nonblocking.attach(torch.compile(model, backend=backend), backend.swapper)
    for batch in (8, 5, 8, 6):
        x = torch.randn(batch, 16, requires_grad=True)
        out = compiled(x)
        out.pow(2).sum().backward()
        expected_grad = x.grad.clone()
        x.grad = None
        torch.testing.assert_close(out, model(x))
        model(x).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, expected_grad)
        assert backend.swapper.wait_ready(120)
    dynamic = backend.swapper.graphs[-1]
    assert dynamic.state == COMPILED and dynamic.compiled_calls >= 2
