"""The warm report, warm mode's step counting, and the table helpers. No farm."""

from __future__ import annotations

import pytest
import torch

from sdk import report, warm_mode, warming
from sdk.report import COMPILED, HIT, LOCAL, GraphReport, WarmReport
from torchfarm.tables import fmt_age, parse_age, table


def _graphs() -> list[GraphReport]:
    return [
        GraphReport("MLP", 1, HIT, key="a" * 64, target="cpu:avx512", seconds=0.3, kernels=4, bytes=2048),
        GraphReport("MLP", 2, COMPILED, key="b" * 64, target="cpu:avx512", seconds=9.0,
                    compile_seconds=8.5, kernels=7, bytes=4096),
        GraphReport("MLP", 3, LOCAL, error="FarmUnavailable: down"),
    ]


def test_report_counts_prints_a_table_and_round_trips_json():
    r = WarmReport(_graphs())
    assert (r.hits, r.compiled, r.failed, r.all_hits) == (1, 1, 1, False)
    text = str(r)
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["MODEL", "GRAPH", "KEY", "TARGET", "OUTCOME"]
    assert "aaaaaaaaaaaa" in lines[1] and "8.50s" in lines[2] and "FarmUnavailable" in lines[3]
    assert lines[-1] == "3 graphs: 1 already cached, 1 compiled by the farm, 1 not on the farm"
    assert WarmReport.from_json(r.to_json()) == r
    assert WarmReport([_graphs()[0]]).all_hits and not WarmReport().all_hits


def test_a_split_graph_counts_as_its_pieces():
    """A graph split at calls the farm refuses is warm when its pieces hit."""
    graphs = [
        GraphReport("MLP", 1, report.SPLIT, error="ran eagerly: seed (touches the RNG)"),
        GraphReport("MLP", 2, HIT, key="a" * 64, split_from=1),
        GraphReport("MLP", 3, HIT, key="b" * 64, split_from=1),
    ]
    r = WarmReport(graphs)
    assert (len(r.compiles), r.hits, r.compiled, r.failed, r.all_hits) == (2, 2, 0, 0, True)
    assert str(r).splitlines()[-1] == (
        "2 graphs: 2 already cached, 0 compiled by the farm, 0 not on the farm; "
        "1 split at calls the farm refuses, which ran eagerly")
    assert not WarmReport(graphs[:1]).all_hits
    assert WarmReport.from_json(r.to_json()) == r


def test_the_exit_tally_counts_a_split_graph_as_its_pieces():
    from collections import Counter

    from sdk import outcomes

    assert outcomes.summary(Counter()) == ""
    assert outcomes.summary(Counter([report.SPLIT, HIT, COMPILED, LOCAL])) == (
        "torchfarm: 3 graphs in this process: 2 from the farm (1 hits, 1 compiled), 1 compiled "
        "locally, 0 eager; 1 split at calls the farm refuses")


def test_collect_gets_only_what_backends_made_inside_it_publish():
    outer_graph = _graphs()[0]
    with report.collect() as outer:
        early = report.active_sinks()
        with report.collect() as inner:
            late = report.active_sinks()
        report.publish(late, outer_graph)
        report.publish(early, outer_graph)
    assert inner == [outer_graph] and outer == [outer_graph, outer_graph]
    assert report.active_sinks() == ()


def test_warm_mode_stops_a_script_when_a_model_is_called_past_its_steps():
    runner = warm_mode._Runner(steps=2)
    # Pins torch: torch.compile(module) returns a module whose __call__ runs the
    # module's forward pre-hooks (OptimizedModule.__call__ → nn.Module.__call__).
    model = runner.observe(torch.compile(torch.nn.Linear(2, 2), backend="eager"))
    fn = runner.observe(torch.compile(lambda x: x + 1, backend="eager"))
    x = torch.ones(1, 2)
    for _ in range(2):
        model(x)
        fn(x)
    with pytest.raises(SystemExit) as stop:
        fn(x)
    assert stop.value.code == 0
    with pytest.raises(SystemExit):
        model(x)
    assert not warm_mode.active()


def test_warm_refuses_wait_false_and_needs_a_farm(monkeypatch):
    monkeypatch.delenv("TORCHFARM_REMOTE", raising=False)
    with pytest.raises(Exception, match="needs a farm"):
        warming.warm(torch.nn.Linear(2, 2), torch.ones(1, 2))
    with pytest.raises(Exception, match="wait=False"):
        warming.warm(torch.nn.Linear(2, 2), torch.ones(1, 2), remote="grpc://127.0.0.1:1", wait=False)


def test_tables_and_ages():
    assert table([["a", 1], ["bbb", 22]], ["X", "Y"]).splitlines() == ["X    Y", "a    1", "bbb  22"]
    assert [parse_age(t) for t in ("90", "90s", "15m", "12h", "7d", "2w")] == [
        90, 90, 900, 43200, 604800, 1209600,
    ]
    for bad in ("soon", "-1d", ""):
        with pytest.raises(ValueError):
            parse_age(bad)
    assert [fmt_age(s) for s in (5, 120, 7200, 172800)] == ["5s", "2m", "2.0h", "2.0d"]


def test_sdk_warm_is_the_function_whatever_was_imported():
    """No module of the package is named like a public function: importing it would
    shadow the function on the package."""
    import sdk
    import sdk.warm_mode  # noqa: F401
    import sdk.warming  # noqa: F401

    assert callable(sdk.warm) and sdk.warm.__module__ == "sdk.warming"
    assert callable(sdk.compile) and callable(sdk.export)
