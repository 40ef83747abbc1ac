"""Progress display (sdk/progress.py): what is shown when, with no server."""

from __future__ import annotations

import io
import logging

import pytest

from sdk.progress import GraphTrack, Progress, bar, describe
from sdk.settings import SDKSettings
from torchfarm.v1 import farm_pb2

KEY = "ab" * 32


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def make(stream=None, after=2.0, every=5.0, graphs=1):
    clock = [100.0]
    settings = SDKSettings(progress_after_s=after, progress_every_s=every)
    p = Progress("MLP", settings, lambda: graphs, stream=stream or io.StringIO(),
                 clock=lambda: clock[0], draw_thread=False)
    return p, clock


def test_unknown_kernel_total_shows_stage_and_elapsed_only():
    t = GraphTrack(2, KEY, started=10.0)
    t.update(farm_pb2.JobStatus(state=farm_pb2.RUNNING, stage="compile"))
    assert describe(t, 3, now=24.0) == "graph 2 of 3 so far: compile, 14s"


def test_kernel_counts_and_bar_once_the_farm_reports_a_total():
    t = GraphTrack(1, KEY, started=0.0)
    t.update(farm_pb2.JobStatus(state=farm_pb2.RUNNING, stage="kernels",
                                kernels_total=10, kernels_done=5, kernels_hit=2))
    assert describe(t, 1, now=3.0) == "graph 1 of 1 so far: kernels, kernels 5/10 (2 cached), 3s"
    assert "[##########..........] kernels 5/10" in describe(t, 1, now=3.0, with_bar=True)
    assert bar(0, 0) == "[" + "." * 20 + "]"


def test_queued_job_says_queued():
    t = GraphTrack(1, KEY, started=0.0)
    t.update(farm_pb2.JobStatus(state=farm_pb2.QUEUED, stage=""))
    assert t.stage == "queued"


def test_log_lines_start_after_the_threshold_and_repeat_every_interval(caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    p, clock = make(after=2.0, every=5.0)

    def lines():
        return [r.getMessage() for r in caplog.records if r.name == "sdk.progress"]

    with p.graph(1, KEY) as track:
        track.set_stage("compile")
        clock[0] += 1.0
        p.draw(clock[0])
        assert lines() == []  # a cache hit's second never shows
        clock[0] += 1.5
        p.draw(clock[0])
        assert lines() == [f"torchfarm: MLP graph 1 of 1 so far: compile, 2s key={KEY[:12]}"]
        clock[0] += 1.0
        p.draw(clock[0])
        assert len(lines()) == 1
        clock[0] += 5.0
        p.draw(clock[0])
        assert len(lines()) == 2
    assert lines()[-1] == f"torchfarm: MLP graph 1: ready after 8.5s key={KEY[:12]}"


def test_a_short_compile_prints_nothing_at_all(caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    p, clock = make(after=2.0)
    with p.graph(1, KEY):
        clock[0] += 0.5
        p.draw(clock[0])
    assert [r for r in caplog.records if r.name == "sdk.progress"] == []


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_quiet_above_info(caplog, stream):
    caplog.set_level(logging.WARNING, logger="sdk")
    out = stream()
    p, clock = make(stream=out)
    with p.graph(1, KEY):
        clock[0] += 60
        p.draw(clock[0])
    assert caplog.records == [] and out.getvalue() == ""


def test_terminal_redraws_one_line_and_ends_it(caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    out = Terminal()
    p, clock = make(stream=out, graphs=2)
    with p.graph(2, KEY) as track:
        track.update(farm_pb2.JobStatus(state=farm_pb2.RUNNING, stage="kernels",
                                        kernels_total=4, kernels_done=1))
        clock[0] += 3
        p.draw(clock[0])
        track.update(farm_pb2.JobStatus(state=farm_pb2.RUNNING, stage="kernels",
                                        kernels_total=4, kernels_done=4))
        clock[0] += 1
        p.draw(clock[0])
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "graph 2 of 2 so far: kernels, [#####...............] kernels 1/4, 3s" in text
    assert "[####################] kernels 4/4" in text
    assert "graph 2: ready after 4.0s" in text
    assert [r for r in caplog.records if r.name == "sdk.progress"] == []  # the bar, not log lines


def test_a_failed_compile_says_so(caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    p, clock = make()
    with pytest.raises(RuntimeError):
        with p.graph(1, KEY):
            clock[0] += 3
            p.draw(clock[0])
            raise RuntimeError("farm down")
    assert caplog.records[-1].getMessage().startswith("torchfarm: MLP graph 1: failed after 3.0s")


def test_a_resubmit_of_the_same_graph_shares_its_line(caplog):
    caplog.set_level(logging.INFO, logger="sdk")
    p, clock = make()
    with p.graph(1, KEY) as outer:
        with p.graph(1, "cd" * 32) as inner:
            assert inner is outer
            clock[0] += 3
            p.draw(clock[0])
    done = [r.getMessage() for r in caplog.records if "ready after" in r.getMessage()]
    assert done == [f"torchfarm: MLP graph 1: ready after 3.0s key={KEY[:12]}"]
