"""Distributed training through the farm: gloo ranks on CPU, launched with torchrun.

Each case trains a few steps with `fallback="error"` and checks, against the same
distributed run without `torch.compile` (in the same ranks, after it), every rank's
losses and first-step gradients;
and that the farm compiled each distinct graph once, every other rank joining that
compile or hitting its artifact. The model's width varies with this process's id, so
the shared stack has not seen the keys before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.report import COMPILED, HIT, JOINED
from torchfarm.wire.codes import JobError

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("distributed_train.py")
WIDTH = 32 + os.getpid() % 16 * 4
"""A multiple of 4 (the transformer views its features in four), new to the shared stack."""


def torchrun(model: str, mode: str, ranks: int, out: Path, env: dict[str, str], steps: int = 3,
             width: int = WIDTH) -> list[dict]:
    """Runs the ranks; returns each rank's report, in rank order."""
    out.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
        str(SCRIPT), model, mode, str(steps), str(out), str(width),
    ]
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def assert_same_training(ranks: list[dict]) -> None:
    """The farm's losses and first-step gradients against the eager run in the same ranks."""
    import torch

    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(r["eager_losses"]),
                                   atol=1e-5, rtol=1e-5)
        assert r["grads"].keys() == r["eager_grads"].keys()
        for name, grad in r["eager_grads"].items():
            torch.testing.assert_close(torch.tensor(r["grads"][name]), torch.tensor(grad),
                                       atol=1e-5, rtol=1e-4, msg=f"rank {r['rank']} grad {name}")


def assert_one_compile_per_graph(farm: list[dict]) -> None:
    """Each distinct key compiled once; every other rank's graph of that key a join or a hit."""
    by_key: dict[str, list[str]] = {}
    for rank in farm:
        assert rank["outcomes"], "the rank sent no graph to the farm"
        for key, outcome in zip(rank["keys"], rank["outcomes"], strict=True):
            by_key.setdefault(key, []).append(outcome)
    for key, outcomes in by_key.items():
        assert sorted(outcomes).count(COMPILED) == 1, (key, outcomes)
        assert all(o in (COMPILED, JOINED, HIT) for o in outcomes), (key, outcomes)


@pytest.fixture
def rank_env(stack, tmp_path):
    return {
        **stack.client_env(),
        "TORCHFARM_TRUSTED_KEYS_FILE": str(stack.trusted_keys_file),
        "TORCHFARM_TEST_INDUCTOR_BASE": str(tmp_path / "inductor"),
        "TORCHFARM_BLOB_CACHE_DIR": str(tmp_path / "blobs"),
    }


def test_tensor_parallel_mlp_two_ranks_one_compile(rank_env, tmp_path):
    farm = torchrun("tp_mlp", "farm", 2, tmp_path / "farm", rank_env)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert len({k for r in farm for k in r["keys"]}) == 1, "the ranks' graphs had different keys"


@pytest.mark.distributed
def test_collectives_inside_a_checkpointed_subgraph_two_ranks(rank_env, tmp_path):
    """The TP MLP under activation checkpointing: its all-reduce travels inside the
    checkpoint's body, group and all, and the recomputing backward matches eager."""
    farm = torchrun("tp_mlp_checkpointed", "farm", 2, tmp_path / "farm", rank_env, width=WIDTH + 4)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert len({k for r in farm for k in r["keys"]}) == 1, "the ranks' graphs had different keys"


@pytest.mark.distributed
def test_fsdp2_small_transformer_two_ranks(rank_env, tmp_path):
    """FSDP2 compiled block by block: its all-gathers and reduce-scatters run between the
    graphs; both blocks and both ranks share one key, so one compile and three others."""
    farm = torchrun("fsdp2", "farm", 2, tmp_path / "farm", rank_env)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert [len(r["keys"]) for r in farm] == [2, 2]


@pytest.mark.distributed
def test_two_stage_pipeline_each_stage_compiles_once(rank_env, tmp_path):
    """GPipe over two ranks: the stages' graphs differ, so two compiles, no sharing;
    the sends and receives between stages run outside the graphs."""
    farm = torchrun("pipeline", "farm", 2, tmp_path / "farm", rank_env)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert [r["outcomes"] for r in farm] == [["compiled"], ["compiled"]]
    assert farm[0]["keys"] != farm[1]["keys"]
    assert farm[0]["losses"] == [] and len(farm[1]["losses"]) == 3


@pytest.mark.distributed
@pytest.mark.parametrize("model", ["tp_mlp", "fsdp2"])
def test_four_ranks_compile_each_graph_once(rank_env, tmp_path, model):
    """Four ranks: every rank's graphs are the same (a quarter of the TP MLP's hidden
    units; FSDP2's unsharded blocks), so each distinct graph compiles once and every
    other rank joins or hits it."""
    farm = torchrun(model, "farm", 4, tmp_path / "farm", rank_env, width=WIDTH + 8)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert len({tuple(r["keys"]) for r in farm}) == 1, "the ranks' graphs had different keys"


@pytest.mark.distributed
def test_fsdp2_composed_with_tensor_parallel_on_a_2d_mesh(rank_env, tmp_path):
    """Four ranks on a 2x2 mesh: FSDP2 along "dp", ColwiseParallel and RowwiseParallel
    along "tp", compiled block by block; the graphs take the unsharded DTensor parameters
    on the "tp" submesh. Each "tp" pair's submesh is sent in the shared form, so every
    rank sends the same bytes and each block compiles once for the four ranks. (The
    second block's input needs a gradient, the first's does not: two keys.)"""
    farm = torchrun("fsdp2_tp", "farm", 4, tmp_path / "farm", rank_env, width=WIDTH + 8)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert len({tuple(r["keys"]) for r in farm}) == 1, "the ranks' graphs had different keys"
    assert len(set(farm[0]["keys"])) == 2


@pytest.mark.parametrize("model", ["dtensor_block", pytest.param("dtensor_mlp", marks=pytest.mark.distributed)])
def test_dtensor_tensor_parallel_compiles_once_for_every_rank(rank_env, tmp_path, model):
    """`parallelize_module` with ColwiseParallel, RowwiseParallel and SequenceParallel:
    Dynamo's graphs take DTensor parameters and the device mesh, and compile on the
    farm. The ranks' graphs differ in the rank alone, which the key leaves out, and the
    worker found the compile the same at both: one compile, the other rank joins it; the
    same ranks started again hit. The width is a multiple of 16: each rank's heads are 4 wide."""
    farm = torchrun(model, "farm", 2, tmp_path / "farm", rank_env, width=4 * WIDTH)
    assert_same_training(farm)
    assert_one_compile_per_graph(farm)
    assert farm[0]["keys"] == farm[1]["keys"] and len(farm[0]["keys"]) == 1
    again = torchrun(model, "farm", 2, tmp_path / "again", {**rank_env, "TORCHFARM_TEST_NO_REFERENCE": "1"},
                     width=4 * WIDTH)
    assert [r["outcomes"] for r in again] == [[HIT], [HIT]]
    assert [r["keys"] for r in again] == [r["keys"] for r in farm]
    assert [r["losses"] for r in again] == [r["losses"] for r in farm]


def test_a_dtensor_graph_whose_ranks_compile_differently_compiles_per_rank(stack, rank_env, tmp_path):
    """A vocabulary-parallel embedding: each rank's code masks its own rows. The shared
    job fails RANK_SPECIFIC, and each rank resubmits keyed with its rank and compiles its
    own graph, which trains as eager does."""
    farm = torchrun("dtensor_vocab", "farm", 2, tmp_path / "farm", rank_env, width=WIDTH)
    assert_same_training(farm)
    assert [r["outcomes"] for r in farm] == [[COMPILED], [COMPILED]]
    assert farm[0]["keys"] != farm[1]["keys"]
    shared = [j for j in stack.store().recent_jobs() if j.error_code == JobError.RANK_SPECIFIC]
    assert len(shared) == 1 and "differs from rank" in shared[0].message
