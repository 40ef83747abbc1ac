"""Triton autotune results travel from the worker to the client (torchfarm/fx/autotune.py).

Without a GPU no kernel autotunes here, so the worker's side is played with torch's own
AutotuneCache: a record saved as a kernel's autotuning saves it, under a worker's cache
dir and cache-key tag; the client's Inductor, with another dir and tag, must then find
it for the same kernel, which it did not before the record was carried."""

from __future__ import annotations

import types

import pytest
import torch

from sdk import loader
from sdk.errors import ArtifactRejected
from torchfarm.fx import autotune
from torchfarm.fx.internals import resolve
from torchfarm.wire.codes import Rejection

pytest.importorskip("triton")

from torch._inductor.runtime.autotune_cache import AutotuneCache  # noqa: E402
from torch._inductor.runtime.triton_compat import Config  # noqa: E402
from torch._inductor.runtime.triton_heuristics import hash_configs  # noqa: E402

KERNEL = "cq/cqzmqjc2jcnrsdk4nrpb5fqrz3hsz6n6xt5hccxq5rvdvqvbvsxm.py"
META = {"autotune_local_cache": True}


def _configs() -> list:
    return [Config({"XBLOCK": 64}, num_warps=4, num_stages=1), Config({"XBLOCK": 128}, num_warps=8, num_stages=1)]


@pytest.fixture(autouse=True)
def _tag_put_back():
    tag = torch.compiler.config.cache_key_tag
    yield
    torch.compiler.config.cache_key_tag = tag


def _at(monkeypatch, root, tag: str) -> str:
    """Inductor's cache dir and torch's cache-key tag, as a worker or a client has them."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    torch.compiler.config.cache_key_tag = tag  # a config module: monkeypatch cannot undo it
    path = root / KERNEL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# a kernel's source\n")
    return str(path)


def _best_at_client(monkeypatch, tmp_path):
    path = _at(monkeypatch, tmp_path / "client", "")
    cache = AutotuneCache.create(META, path, hash_configs(_configs()))
    assert cache is not None
    return cache.read_best(META, _configs())


def _worker_records(monkeypatch, tmp_path) -> list:
    path = _at(monkeypatch, tmp_path / "worker", "torchfarm-fixes:191837,133734")
    configs = _configs()
    cache = AutotuneCache.create(META, path, hash_configs(configs))
    cache.save(configs[1], time_taken_ns=7_000_000)  # what a kernel's autotuning saves
    kernel = types.SimpleNamespace(filename=path, save_cache_hook=cache.save)
    untuned = types.SimpleNamespace(filename=path.replace("cqz", "cqa"), save_cache_hook=None)
    noted = autotune.Noted()
    noted.kernels += [kernel, untuned]
    return noted.results()


def test_a_worker_s_autotune_result_is_found_by_the_client_s_inductor(monkeypatch, tmp_path):
    records = _worker_records(monkeypatch, tmp_path)
    assert [r["kernel"] for r in records] == [KERNEL]
    assert records[0]["best"]["XBLOCK"] == 128 and records[0]["best"]["num_warps"] == 8

    assert _best_at_client(monkeypatch, tmp_path) is None  # what a hit did before: benchmark
    assert autotune.install(autotune.check_records(records)) == 1  # as the client, in its dir
    best = _best_at_client(monkeypatch, tmp_path)
    assert best is not None and best.kwargs == {"XBLOCK": 128} and best.num_warps == 8


def test_the_sdk_installs_the_records_a_manifest_carries(monkeypatch, tmp_path):
    toolchain = {"vec_isa": {}, **autotune.in_toolchain(_worker_records(monkeypatch, tmp_path))}
    _at(monkeypatch, tmp_path / "client", "")
    assert loader.install_autotune_records(toolchain) == 1
    assert _best_at_client(monkeypatch, tmp_path).kwargs == {"XBLOCK": 128}
    assert loader.install_autotune_records({"vec_isa": {}}) == 0  # a manifest from before records


def test_the_sdk_refuses_an_artifact_whose_records_are_malformed():
    with pytest.raises(ArtifactRejected, match="not a kernel path") as refused:
        loader.install_autotune_records({"autotune": [{"kernel": "../../.bashrc.py", "best": GOOD}]})
    assert refused.value.code == Rejection.MALFORMED


def test_a_record_for_other_configs_is_not_taken(monkeypatch, tmp_path):
    """The record names the hash of the configs it was picked from: a kernel compiled with
    other configs ignores it and tunes as before."""
    records = _worker_records(monkeypatch, tmp_path)
    records[0]["best"]["configs_hash"] = "0" * 64
    _at(monkeypatch, tmp_path / "client", "")
    assert autotune.install(autotune.check_records(records)) == 1
    assert _best_at_client(monkeypatch, tmp_path) is None


def test_noting_notes_each_precompiled_kernel_and_puts_precompile_back():
    autotuner = resolve("CachingAutotuner")
    real = autotuner.precompile
    kernel = object()
    with autotune.noting() as noted:
        with pytest.raises(AttributeError):  # torch's precompile, on something not a kernel
            autotuner.precompile(kernel)
    assert noted.kernels == [kernel]
    assert autotuner.precompile is real


GOOD = {"XBLOCK": 128, "num_warps": 8, "num_stages": 1, "configs_hash": "ab" * 32,
        "found_by_coordesc": False, "time_taken_ms": 7, "triton_cache_hash": None}


@pytest.mark.parametrize("records, match", [
    ({"kernel": KERNEL, "best": GOOD}, "not a list"),
    ([{"kernel": "../../etc/cron.d/x.py", "best": GOOD}], "not a kernel path"),
    ([{"kernel": "/tmp/" + KERNEL, "best": GOOD}], "not a kernel path"),
    ([{"kernel": KERNEL.replace(".py", ".so"), "best": GOOD}], "not a kernel path"),
    ([{"kernel": KERNEL, "best": GOOD, "run": "x"}], "not {kernel, best}"),
    ([{"kernel": KERNEL, "best": {**GOOD, "configs_hash": 1}}], "no configs_hash"),
    ([{"kernel": KERNEL, "best": {**GOOD, "XBLOCK": [128]}}], "not a plain value"),
    ([{"kernel": KERNEL, "best": {**GOOD, "XBLOCK": float("nan")}}], "not a plain value"),
    ([{"kernel": KERNEL, "best": {**GOOD, "note": "x" * 300}}], "not a plain value"),
    ([{"kernel": KERNEL, "best": {f"f{i}": i for i in range(80)}}], "1 to 64 fields"),
    ([{"kernel": KERNEL, "best": GOOD}] * (autotune.MAX_RECORDS + 1), "not a list of at most"),
])
def test_a_malformed_record_is_refused(records, match):
    with pytest.raises(autotune.BadRecord, match=match):
        autotune.check_records(records)


def test_a_well_formed_record_passes_unchanged():
    assert autotune.check_records([{"kernel": KERNEL, "best": GOOD}]) == [{"kernel": KERNEL, "best": GOOD}]
