"""torchfarm/fx/vecisa.py: the worker's vector-ISA probe replayed on a client, and the torch 2.13
internals that rests on."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from tests.conftest import run_python
from torchfarm.fx import vecisa

pytestmark = pytest.mark.timeout(120)


def test_the_probe_internals_are_where_the_replay_expects_them():
    from torch._inductor import cpu_vec_isa as v

    assert hasattr(v.valid_vec_isa_list, "cache_info")
    assert list(inspect.signature(v.VecISA.check_build).parameters) == ["self", "code"]
    for cls, name in ((v.VecISA, "_avx_code"), (v.VecAVX512, "_avx512_bf16_code"),
                      (v.VecAVX512VNNI, "_avx512_vnni_code"), (v.VecAMX, "_amx_code"),
                      (v.VecAMX, "_amx_fp16_code")):
        assert isinstance(getattr(cls, name), str), name
        assert re.search(rf"check_build\((\w+\.)?{name}\)", inspect.getsource(v)), name
    assert "self._is_avx512_bf16_supported = True" in inspect.getsource(v.VecAVX512)
    assert "self._is_amx_fp16_supported = True" in inspect.getsource(v.VecAMX)
    # Every probe build goes through check_build: no other compiler call in the module.
    assert inspect.getsource(v).count(".build()") == 1
    assert "valid_vec_isa_list()" in inspect.getsource(v.pick_vec_isa)
    assert isinstance(v.supported_vec_isa_list, list)


def test_the_record_names_every_isa_and_the_pick():
    record = vecisa.probe_record()
    assert record["format"] == vecisa.PROBE_FORMAT
    assert (record["picked"], record["arch_flags"]) == vecisa.picked()
    assert all(set(e) == {"valid", "bf16", "amx_fp16"} for e in record["isas"].values())


@pytest.mark.parametrize("record", [None, {"format": "other"}, {"format": vecisa.PROBE_FORMAT}])
def test_a_malformed_record_is_refused(record):
    with pytest.raises(vecisa.ToolchainMismatch, match="vector-ISA record"):
        vecisa.seed(record)


CLIENT = """
import json, sys
from torchfarm.fx import vecisa
from torchfarm.fx.hooks import count_kernel_builds
record = json.loads(sys.argv[1])
with count_kernel_builds() as builds:
    try:
        vecisa.seed(record)
        outcome = "seeded"
    except vecisa.ToolchainMismatch as e:
        outcome = "refused: " + str(e)
print(json.dumps({"outcome": outcome, "builds": builds.count, "picked": vecisa.picked()}))
"""


def _client(record: dict, tmp_path, **env: str) -> dict:
    code = f"import sys; sys.argv = ['x', {json.dumps(json.dumps(record))}]\n" + CLIENT
    proc = run_python(code, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty"), **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def worker_record(tmp_path_factory) -> dict:
    """What a worker process (its own cache dir, the real probe) records."""
    proc = run_python(
        "import json; from torchfarm.fx import vecisa; print(json.dumps(vecisa.probe_record()))",
        {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("worker"))},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_fresh_client_takes_the_workers_probe_and_builds_nothing(tmp_path, worker_record):
    record = dict(worker_record)
    out = _client(record, tmp_path)
    assert out == {"outcome": "seeded", "builds": 0, "picked": [record["picked"], record["arch_flags"]]}


@pytest.mark.slow
def test_a_client_that_picks_another_isa_refuses_the_artifact(tmp_path, worker_record):
    record = dict(worker_record)
    if not record["picked"].startswith("avx512"):
        pytest.skip(f"needs an AVX-512 machine; this one picks {record['picked']!r}")
    out = _client(record, tmp_path, ATEN_CPU_CAPABILITY="avx2")
    assert out["outcome"].startswith("refused: its kernels were built for vector ISA"), out
    assert out["builds"] == 0


@pytest.mark.slow
def test_flags_that_differ_refuse_the_artifact(tmp_path, worker_record):
    record = dict(worker_record)
    record["arch_flags"] += " -mextra"
    out = _client(record, tmp_path)
    assert out["outcome"].startswith("refused"), out
