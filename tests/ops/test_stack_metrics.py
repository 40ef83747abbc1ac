"""`torchfarm up --metrics-port P`: the coordinator on P, worker i on P + 1 + i."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cli import launch
from localfarm.stack import INDUCTOR_SEED_ENV, LocalStack, seed_isa_probe


@pytest.fixture(autouse=True)
def _no_seed(monkeypatch):
    """The stacks here start no real worker: none of them needs the probe's programs."""
    monkeypatch.delenv(INDUCTOR_SEED_ENV, raising=False)


@pytest.fixture
def spawned(monkeypatch) -> dict[Path, dict[str, str]]:
    """Each process a stack starts (`launch.spawn`), by its log file → its environment;
    none runs."""
    seen: dict[Path, dict[str, str]] = {}
    monkeypatch.setattr(launch, "spawn", lambda cmd, env, log: seen.__setitem__(log, env))
    return seen


def test_metrics_ports_and_multiprocess_dirs(tmp_path):
    stack = LocalStack(workers=2, metrics_port=9100, workdir=tmp_path)
    assert stack.env()["TORCHFARM_METRICS_PORT"] == "9100"  # the coordinator's
    assert [stack.worker_metrics_port(i) for i in range(2)] == [9101, 9102]
    off = LocalStack(workers=2, workdir=tmp_path)
    assert off.worker_metrics_port(1) == 0


def test_worker_environment(tmp_path, monkeypatch, spawned):
    stack = LocalStack(workers=2, metrics_port=9100, workdir=tmp_path)
    stack.start_worker(1)
    env = spawned[tmp_path / "worker1.log"]
    assert env["TORCHFARM_METRICS_PORT"] == "9102"
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "worker1" / "metrics")

    off = LocalStack(workers=1, workdir=tmp_path)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    off.start_worker(0)
    assert spawned[tmp_path / "worker0.log"]["TORCHFARM_METRICS_PORT"] == "0"
    assert "PROMETHEUS_MULTIPROC_DIR" not in spawned[tmp_path / "worker0.log"]


def test_workers_warm_up_unless_the_stack_says_not(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHFARM_WARMUP", raising=False)
    assert "TORCHFARM_WARMUP" not in LocalStack(workdir=tmp_path).env()
    assert LocalStack(workdir=tmp_path, warmup=False).env()["TORCHFARM_WARMUP"] == "0"


def test_workers_of_stacks_with_one_cache_root_share_caches_by_index(tmp_path, spawned):
    for name in ("a", "b"):
        stack = LocalStack(workers=2, workdir=tmp_path / name, cache_root=tmp_path / "caches")
        stack.start_worker(0)
        stack.start_worker(1)
    dirs = {(log.parent.name, log.stem): env["TORCHINDUCTOR_CACHE_DIR"] for log, env in spawned.items()}
    assert dirs[("a", "worker0")] == dirs[("b", "worker0")] == str(tmp_path / "caches" / "worker0" / "inductor")
    assert dirs[("a", "worker1")] == dirs[("b", "worker1")] != dirs[("a", "worker0")]
    alone = LocalStack(workdir=tmp_path / "c")
    alone.start_worker(0)
    assert spawned[tmp_path / "c" / "worker0.log"]["TRITON_CACHE_DIR"] == str(tmp_path / "c" / "worker0" / "triton")


def test_each_worker_cache_starts_with_the_seed_and_a_restart_keeps_its_own(tmp_path, monkeypatch, spawned):
    seed = tmp_path / "seed"
    (seed / "ab").mkdir(parents=True)
    (seed / "ab" / "probe.so").write_bytes(b"\x7fELF")
    (seed / ".seeded").touch()  # probed already: no probe process runs
    monkeypatch.setenv(INDUCTOR_SEED_ENV, str(seed))
    stack = LocalStack(workers=2, workdir=tmp_path / "stack")
    assert stack.inductor_seed == seed
    stack.start_worker(0)
    cache = tmp_path / "stack" / "worker0" / "inductor"
    assert spawned[tmp_path / "stack" / "worker0.log"]["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert (cache / "ab" / "probe.so").read_bytes() == b"\x7fELF"
    assert sorted(p.name for p in cache.iterdir()) == ["ab"]  # not the seed's lock or mark
    (cache / "ab" / "kernel.so").write_bytes(b"built")
    stack.start_worker(0)  # restarted: its cache is its own, not the seed's again
    assert (cache / "ab" / "kernel.so").exists()
    bare = LocalStack(workdir=tmp_path / "bare", inductor_seed=None)
    bare.start_worker(0)
    assert not (tmp_path / "bare" / "worker0" / "inductor").exists()


def test_the_seed_is_probed_once_in_its_own_cache_dir(tmp_path):
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$TORCHINDUCTOR_CACHE_DIR" >> {calls}\n'
        'mkdir -p "$TORCHINDUCTOR_CACHE_DIR/xy" && touch "$TORCHINDUCTOR_CACHE_DIR/xy/isa.so"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    seed = tmp_path / "seed"
    assert seed_isa_probe(seed, str(python)) == seed
    assert seed_isa_probe(seed, str(python)) == seed
    assert calls.read_text().splitlines() == [str(seed)]
    assert (seed / "xy" / "isa.so").exists() and os.path.exists(seed / ".seeded")
