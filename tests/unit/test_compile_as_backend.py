"""`sdk.compile` passed to Dynamo as the backend itself: `torch.compile(fn,
backend=sdk.compile)` or a `functools.partial` of it. Dynamo calls it with each graph
and its example inputs, which failed with Python's TypeError."""

from __future__ import annotations

import functools

import pytest
import torch

import sdk
from localfarm.stack import free_port
from sdk import report
from sdk.errors import CompileArgumentError


def _graph() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(lambda x: (x * 2).relu())


@pytest.mark.parametrize("given,named", [
    ({"wait": False}, "wait"),
    ({"fullgraph": True}, "fullgraph"),
    ({"dynamic": True}, "dynamic"),
])
def test_what_only_sdk_compile_of_a_model_takes_is_named(given, named):
    with pytest.raises(CompileArgumentError, match=f"{named} belong to sdk.compile\\(model"):
        sdk.compile(_graph(), [torch.randn(3)], **given)


def test_a_second_positional_argument_that_is_not_dynamos_call_is_refused():
    with pytest.raises(CompileArgumentError, match="one positional argument, the model"):
        sdk.compile(torch.nn.Linear(2, 2), [torch.randn(3)])


@pytest.mark.parametrize("how", ["sdk.compile", "partial"])
def test_each_graph_is_reported_where_reports_are_collected(how, monkeypatch):
    # A farm that does not answer: each graph compiles here, and the reports say so.
    # The backend of the first block is not the second's: a backend reports where it
    # was made.
    monkeypatch.setenv("TORCHFARM_REMOTE", f"grpc://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TORCHFARM_CONNECT_TIMEOUT_S", "0.2")
    backend = sdk.compile if how == "sdk.compile" else functools.partial(sdk.compile, fallback="local")
    for _ in range(2):
        torch._dynamo.reset()
        with report.collect() as graphs:
            fn = torch.compile(lambda x: (x * 2).relu(), backend=backend)
            x = torch.randn(3)
            assert torch.equal(fn(x), (x * 2).relu())
        assert [(g.model, g.outcome) for g in graphs] == [("backend=sdk.compile", report.LOCAL)]
    torch._dynamo.reset()
