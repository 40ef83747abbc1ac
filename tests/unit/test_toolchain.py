"""torchfarm/fx/toolchain.py: this machine's compiler answers, kept per machine, replayed into
Inductor's caches; and the torch 2.13 internals that rests on."""

from __future__ import annotations

import functools
import inspect
import json
import subprocess
import sys

import pytest

from tests.conftest import run_python
from torchfarm.fx import internals, toolchain


def test_cpp_builder_reaches_the_compiler_through_cached_functions_and_its_subprocess_global():
    from torch._inductor import cpp_builder

    assert cpp_builder.subprocess is subprocess
    assert isinstance(cpp_builder.cpp_compiler_search, functools._lru_cache_wrapper)
    # torch 2.12 has no _is_gcc_version_less_than (torchfarm/fx/internals.py's SEAM).
    gcc_less = ("_is_gcc_version_less_than",) if internals.internal("is_gcc_version_less_than") else ()
    for name in ("_is_intel_compiler", "get_compiler_version_info", *gcc_less, "_is_clang", "_is_gcc"):
        assert hasattr(getattr(cpp_builder, name), "cache_clear"), name
    for name in ("cpp_compiler_search", "_is_intel_compiler", "get_compiler_version_info", *gcc_less):
        assert "subprocess.check_output" in inspect.getsource(getattr(cpp_builder, name)), name
    assert "cpp_compiler_search(search)" in inspect.getsource(cpp_builder.get_cpp_compiler)


def test_a_query_runs_once_then_comes_from_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFARM_TOOLCHAIN_CACHE_DIR", str(tmp_path))
    rec = toolchain.Record(str(tmp_path / "r.json"), {})
    assert rec.run([sys.executable, "-c", "print('hi')"]) == (0, "hi\n", "")
    assert rec.asked == 1
    again = toolchain.Record(str(tmp_path / "r.json"), json.loads((tmp_path / "r.json").read_text())["answers"])
    assert again.run([sys.executable, "-c", "print('hi')"]) == (0, "hi\n", "")
    assert again.asked == 0


def test_the_replayed_subprocess_keeps_check_outputs_contract():
    rec = toolchain.Record("/nonexistent/dir/r.json", {
        json.dumps(["cc", "-v"]): [0, "", "gcc version 12\n"],
        json.dumps(["cc", "--bad"]): [1, "", "no\n"],
    })
    shim = toolchain._replayed_subprocess(rec)
    assert shim.check_output(["cc", "-v"], stderr=subprocess.STDOUT) == b"gcc version 12\n"
    assert shim.check_output(["cc", "-v"]) == b""
    with pytest.raises(subprocess.CalledProcessError):
        shim.check_output(["cc", "--bad"])
    assert shim.SubprocessError is subprocess.SubprocessError
    assert rec.asked == 0


def test_the_identity_changes_with_the_compiler_binary(tmp_path, monkeypatch):
    from torch._inductor import config

    fake = tmp_path / "g++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with config.patch({"cpp.cxx": (None, "g++")}):
        before = toolchain.identity()
        fake.write_text("#!/bin/sh\n# upgraded\n")
        assert toolchain.identity() != before


SECOND_PROCESS = """
import json, subprocess
from torch._inductor import cpp_builder
calls = []
class Spy(subprocess.Popen):
    def __init__(self, args, *a, **k):
        calls.append(list(args) if isinstance(args, (list, tuple)) else args)
        super().__init__(args, *a, **k)
subprocess.Popen = Spy
from torchfarm.fx.fingerprint import local_fingerprint
fp = local_fingerprint()
compiler = cpp_builder.get_cpp_compiler()
cpp_builder.get_compiler_version_info(compiler)
cpp_builder._is_intel_compiler(compiler)
print(json.dumps({"calls": calls, "compiler": fp.compiler}))
"""


@pytest.mark.slow
def test_a_machines_second_process_asks_its_compiler_nothing(tmp_path):
    env = {"TORCHFARM_TOOLCHAIN_CACHE_DIR": str(tmp_path)}
    first = run_python(SECOND_PROCESS, env)
    assert first.returncode == 0, first.stderr[-2000:]
    first_out = json.loads(first.stdout.splitlines()[-1])
    assert first_out["calls"], "the first process asks the compiler"
    second = run_python(SECOND_PROCESS, env)
    assert second.returncode == 0, second.stderr[-2000:]
    second_out = json.loads(second.stdout.splitlines()[-1])
    assert second_out == {"calls": [], "compiler": first_out["compiler"]}
