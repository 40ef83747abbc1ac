"""A farm hit in a fresh process runs no C/C++ compiler, not even a version query.

A compiler wrapper on `PATH` (every name Inductor may invoke: its default `g++` from
`config.cpp.cxx`, `CXX` unset, plus gcc/c++/cc/clang/clang++) logs each call and execs
the real compiler. Inductor's probes (`cpp_compiler_search`'s `--version`,
`get_compiler_version_info`'s `-v`, `_is_gcc_version_less_than`, the vector-ISA test
builds) and the fingerprint's own queries (`torchfarm/fx/fingerprint.py`) all go through `PATH`.

The fingerprint's compiler identity is this machine's, so the first process on a
machine asks the compiler once (`torchfarm/fx/toolchain.py` keeps the answer by the compiler
binary's identity); the hit process after it must ask nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import textwrap

import pytest

from sdk.report import HIT
from tests.conftest import run_python

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

SPIED = ("g++", "gcc", "c++", "cc", "clang", "clang++")
"""Every name Inductor or the fingerprint may start a C/C++ compiler by."""

WIDTH = 40 + os.getpid() % 16 * 2
"""A key the shared farm has not seen in this run."""

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    def make(width):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.LayerNorm(width), nn.Linear(width, 4))
        return model, torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    """
)

HIT_PROCESS = MODEL + textwrap.dedent(
    """
    import copy, json, sys
    import sdk
    from sdk import report

    model, x = make(int(sys.argv[1]))
    eager = copy.deepcopy(model)
    with report.collect() as graphs:
        out = sdk.compile(model, fallback="error")(x)
    out.pow(2).mean().backward()
    ref = eager(x)
    ref.pow(2).mean().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    print(json.dumps({"outcomes": [g.outcome for g in graphs]}))
    """
)

PRIME_PROCESS = "from torchfarm.fx.fingerprint import local_fingerprint; print(local_fingerprint())"


def compiler_spy(directory, log_file) -> str:
    """A directory of wrappers, to put first on PATH; returns the PATH to use."""
    directory.mkdir()
    real_path = os.environ["PATH"]
    for name in SPIED:
        real = shutil.which(name, path=real_path)
        script = directory / name
        body = f'echo "{name} $*" >> "{log_file}"\n'
        body += f'exec "{real}" "$@"\n' if real else "exit 127\n"
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return f"{directory}{os.pathsep}{real_path}"


def test_a_fresh_process_hit_calls_no_compiler(stack, client_cache_dir, tmp_path, monkeypatch):
    log_file = tmp_path / "compiler-calls.log"
    log_file.touch()
    env = {
        "PATH": compiler_spy(tmp_path / "spy", log_file),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh-inductor"),
        "TORCHFARM_TOOLCHAIN_CACHE_DIR": str(tmp_path / "toolchain"),
        "TORCHFARM_REMOTE": stack.address,
    }
    # Inductor would start $CXX by its absolute path, past the spy: use the spied name.
    monkeypatch.delenv("CXX", raising=False)
    # The machine's first process: only toolchain queries, no build.
    prime = run_python(PRIME_PROCESS, env)
    assert prime.returncode == 0, prime.stderr[-3000:]
    primed = log_file.read_text().splitlines()
    assert all(not line.endswith((".cpp", ".so")) and " -o " not in line for line in primed), primed

    # The farm compiles the graph for a process of the same environment (not for this
    # one: earlier tests in this process may have changed what its fingerprint reads).
    cold = run_python(f"import sys; sys.argv = ['x', '{WIDTH}']\n" + HIT_PROCESS, {
        **env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cold-inductor"),
    })
    assert cold.returncode == 0, cold.stderr[-3000:]

    log_file.write_text("")
    proc = run_python(f"import sys; sys.argv = ['x', '{WIDTH}']\n" + HIT_PROCESS, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcomes"] and set(result["outcomes"]) == {HIT}, result
    calls = [line[:160] for line in log_file.read_text().splitlines()]
    assert calls == [], "\n".join(calls)
