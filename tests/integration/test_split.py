"""A graph with a call the farm refuses is split there (sdk/split.py): the call runs
eagerly and the rest compiles on the farm, with real parts (redis-server, the gRPC
coordinator, a Celery worker). Numerics as in test_end_to_end.py."""

from __future__ import annotations

import logging

import pytest
import torch
from prometheus_client import REGISTRY
from torch import nn

import sdk
from sdk import report
from tests.integration.test_end_to_end import assert_matches_eager, train_step

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


class _Reseeds(nn.Module):
    """Reformer's pattern: a block draws a fresh seed (torch.seed(), which the farm
    refuses: it changes the global generator) between two layers of one graph."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.relu(self.a(x)))
        torch.seed()
        return torch.tanh(self.b(h)) * 2


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdk.backend"]


def test_training_through_a_split_graph_matches_eager(stack, client_cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="sdk")

    def splits() -> float:
        return REGISTRY.get_sample_value("torchfarm_sdk_graphs_split_total", {"refused_by": "format"}) or 0.0

    x = torch.randn(4, 16)
    before = splits()
    with report.collect() as graphs:
        got, ref = train_step(_Reseeds(), (x,), remote=stack.address, fallback="local")
    assert splits() == before + 1
    assert_matches_eager(got, ref)
    # `sdk.warm`'s report: the graph, split, naming what ran eagerly; its two pieces, each
    # from the farm.
    on_farm = (report.COMPILED, report.HIT)  # HIT where an earlier run filled the session's farm
    assert [(g.graph, g.outcome in on_farm, g.split_from) for g in graphs] == [
        (1, False, 0), (2, True, 1), (3, True, 1)], graphs
    assert graphs[0].outcome == report.SPLIT
    assert graphs[0].error.startswith("ran eagerly: seed (op 'torch.random.seed'"), graphs[0]
    assert str(report.WarmReport(graphs)).splitlines()[-1].endswith(
        ", 0 not on the farm; 1 split at calls the farm refuses, which ran eagerly")
    lines = _lines(caplog)
    split = [m for m in lines if "the farm refuses run eagerly" in m]
    assert len(split) == 1 and "torch.random.seed" in split[0] and "graph(s) 2, 3" in split[0], lines
    farm = [m for m in lines if " key=" in m]
    assert [m.split(":")[1].split(" of ")[0].strip() for m in farm] == ["graph 2", "graph 3"], lines
    assert not [m for m in lines if "compiled locally" in m], lines
    # Captured again, the pieces are the same graphs: the farm's cache serves both.
    with report.collect() as again:
        assert_matches_eager(*train_step(_Reseeds(), (x,), remote=stack.address, fallback="local"))
    assert [g.outcome for g in again] == [report.SPLIT, report.HIT, report.HIT], again


def test_a_split_graph_with_dynamic_sizes(stack, client_cache_dir, caplog):
    """The pieces take the graph's size symbols where their inputs need them, and one
    compile serves every batch size."""
    caplog.set_level(logging.INFO, logger="sdk")
    torch._dynamo.reset()
    model = _Reseeds()
    compiled = sdk.compile(model, remote=stack.address, fallback="local", dynamic=True)
    for batch in (3, 5, 9):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    lines = _lines(caplog)
    assert len([m for m in lines if "the farm refuses run eagerly" in m]) == 1, lines
    assert len([m for m in lines if " key=" in m]) == 2, lines
    assert not [m for m in lines if "compiled locally" in m], lines


def test_without_waiting_the_pieces_swap_in_as_they_compile(stack, client_cache_dir):
    """wait=False: the split graph runs at once, each piece eagerly until its compile
    is loaded, then compiled."""
    from sdk.nonblocking import COMPILED, swapper_of

    torch._dynamo.reset()
    model = _Reseeds()
    compiled = sdk.compile(model, remote=stack.address, wait=False)
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert sdk.wait_ready(compiled, timeout=120)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert [s.state for s in swapper_of(compiled).graphs] == [COMPILED, COMPILED]
    torch._dynamo.reset()


def test_split_refused_off_compiles_the_graph_whole_locally(stack, client_cache_dir, caplog, monkeypatch):
    monkeypatch.setenv("TORCHFARM_SPLIT_REFUSED", "0")
    caplog.set_level(logging.INFO, logger="sdk")
    x = torch.randn(4, 16)
    got, ref = train_step(_Reseeds(), (x,), remote=stack.address, fallback="local")
    assert_matches_eager(got, ref)
    lines = _lines(caplog)
    local = [m for m in lines if "compiled locally in" in m]
    assert len(local) == 1 and "torch.random.seed" in local[0], lines
    assert not [m for m in lines if " key=" in m], lines


def test_with_fallback_error_a_refused_call_still_raises(stack, client_cache_dir):
    """fallback="error" asks for every graph whole from the farm: the refusal is raised,
    naming the call, not split around."""
    torch._dynamo.reset()
    compiled = sdk.compile(_Reseeds(), remote=stack.address, fallback="error")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"torch\.random\.seed") as e:
        compiled(torch.randn(4, 16))
    assert isinstance(e.value.inner_exception, sdk.GraphRejected)
