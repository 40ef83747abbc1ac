"""How a staged compile's stage timings read in the SDK's per-graph log line and in
`torchfarm status`'s recent jobs: one formatter, `torchfarm.tables.stage_timings`."""

from __future__ import annotations

from cli.main import recent_jobs_table
from torchfarm.tables import stage_timings
from torchfarm.v1 import farm_pb2


def _staged() -> farm_pb2.JobStatus:
    return farm_pb2.JobStatus(
        key="ab" * 32, state=farm_pb2.JobState.Value("SUCCEEDED"), stage="done",
        kernels_total=19, kernels_done=19, kernels_hit=12,
        timings=[
            farm_pb2.StageTiming(stage="decompose", seconds=1.1, queued_seconds=0.3, worker="cpu0"),
            farm_pb2.StageTiming(stage="lower", seconds=2.31, worker="cpu0"),
            farm_pb2.StageTiming(stage="kernels", seconds=4.02, queued_seconds=0.1,
                                 kernels=19, kernels_hit=12, worker="cpu0,cpu1"),
            farm_pb2.StageTiming(stage="assemble", seconds=0.05, worker="cpu1"),
        ],
    )


def test_the_log_line_shows_each_stage_and_the_kernel_cache_hits():
    assert stage_timings(_staged().timings) == (
        "decompose 1.10s (queued 0.30s), lower 2.31s, kernels 4.02s (queued 0.10s) 12/19 hit, "
        "assemble 0.05s"
    )


def test_a_whole_graph_compile_reads_as_before():
    whole = farm_pb2.JobStatus(timings=[farm_pb2.StageTiming(stage="compile", seconds=3.5)])
    assert stage_timings(whole.timings) == "compile 3.50s"


def test_status_recent_jobs_show_stage_timings_and_hits():
    table = recent_jobs_table(farm_pb2.FarmStatus(recent_jobs=[_staged()]))
    assert "lower 2.31s, kernels 4.02s (queued 0.10s) 12/19 hit" in table
