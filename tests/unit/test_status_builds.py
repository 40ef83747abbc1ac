"""`torchfarm status` shows the builds each target's graph workers run, and each worker's sandbox."""

from __future__ import annotations

from cli.main import workers_table
from torchfarm.v1 import farm_pb2
from torchfarm.wire import builds

A = {"torch_version": "2.13.0+cpu", "torch_git": "1234567890", "triton_version": "3.7.0",
     "python": "3.11", "platform": "linux-x86_64", "isa": "avx512", "compiler": "g++ 12"}
B = {**A, "torch_version": "2.12.0+cpu", "triton_version": "3.6.0", "python": "3.12"}


def _worker(name: str, fingerprint: dict[str, str], jobs=("graph",)) -> farm_pb2.WorkerInfo:
    return farm_pb2.WorkerInfo(
        name=name, queue="q", last_seen_seconds=1.0, fingerprint=fingerprint,
        targets=[farm_pb2.ServedTarget(target="cpu:avx512", jobs=list(jobs))],
    )


def test_status_lists_each_build_of_a_target_with_its_workers():
    st = farm_pb2.FarmStatus(workers=[_worker("a1", A), _worker("b1", B), _worker("a2", A)])
    text = workers_table(st)
    rows = [line for line in text.splitlines() if "[b" in line]
    assert len(rows) == 2
    by_build = {builds.digest(A): "a1,a2", builds.digest(B): "b1"}
    for digest, names in by_build.items():
        (row,) = [r for r in rows if f"[b{digest}]" in r]
        assert row.startswith("cpu:avx512") and row.rstrip().endswith(names)
    assert "torch 2.12.0+cpu (git 12345678), triton 3.6.0, py3.12" in text


def test_a_kernel_only_worker_adds_no_build_row():
    st = farm_pb2.FarmStatus(workers=[_worker("k1", A, jobs=("kernel",))])
    assert "[b" not in workers_table(st)


def test_status_shows_a_degraded_sandbox():
    st = farm_pb2.FarmStatus(workers=[_worker("boxed", A), _worker("loose", A)])
    st.workers[0].sandbox, st.workers[1].sandbox = "bwrap", "process"
    rows = {line.split()[0]: line for line in workers_table(st).splitlines() if line.startswith(("boxed", "loose"))}
    assert rows["loose"].rstrip().endswith("process (DEGRADED)")
    assert rows["boxed"].rstrip().endswith("bwrap")
