"""bench/gpu_bench.py without a GPU: its compiler counts (Triton's CUDA backend and its
bundled ptxas build a kernel for sm_90 on any host, so a fresh process run as the bench
runs a case, bench/counting/ first on PYTHONPATH and the ptxas wrapper named by
TRITON_PTXAS_PATH, must count one Triton compile, one ptxas run, then a cache hit), what
it calls a problem, and how it finds redis-server."""

from __future__ import annotations

import cProfile
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.gpu_bench import COUNTING, ROOT, farm_phases, problems, ptxas_env, redis_server_dir, triton_cc_env
from bench.profile_summary import area, summarize
from sdk.backend import FARM_LINE

pytest.importorskip("triton")

COMPILE_TWICE = textwrap.dedent(
    """
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sys.path.insert(0, "tests/targets/kernels")
    from add_kernel import add_kernel
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    source = ASTSource(fn=add_kernel, signature=signature, constexprs={"BLOCK": 64})
    for _ in range(2):
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
    """
)


def _counted(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """`script` in a fresh interpreter as a benchmarked case runs (bench/counting/ first on
    its path, a counts file named); what it counted, and what it printed."""
    counts = tmp_path / "counts"
    full_env = {
        **os.environ, **(env or {}), "PYTHONPATH": str(COUNTING), "TORCHFARM_BENCH_COUNTS": str(counts),
    }
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return counts.read_text().split(), proc.stdout


def test_a_triton_compile_its_ptxas_run_and_a_cache_hit_are_counted(tmp_path):
    assert "TRITON_PTXAS_PATH" in ptxas_env(tmp_path)
    env = {**ptxas_env(tmp_path), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    counted, _ = _counted(tmp_path, COMPILE_TWICE, env=env)
    assert sorted(counted) == ["ptxas", "triton", "triton-cache-hit"]


BUILD_WITH_TRITON = textwrap.dedent(
    """
    import sys
    from triton.runtime.build import _build
    src = sys.argv[1]
    open(src, "w").write("int answer(void) { return 42; }\\n")
    print(_build("answer", src, sys.argv[2], [], [], [], []))
    """
)


def test_tritons_own_c_builds_are_counted(tmp_path):
    """The C builds of Triton's launchers go through `_build`, which takes CC."""
    counted, printed = _counted(tmp_path, BUILD_WITH_TRITON, str(tmp_path / "answer.c"), str(tmp_path),
                                env=triton_cc_env(tmp_path))
    assert Path(printed.strip()).is_file()  # the wrapper ran the real compiler
    assert counted == ["triton-cc"]
    assert problems("farm hit", _report(["hit"], **{"triton-cc": 2})) == []  # shown, not failed


def test_nothing_is_counted_without_the_counts_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(COUNTING)}
    env.pop("TORCHFARM_BENCH_COUNTS", None)
    proc = subprocess.run([sys.executable, "-c", "import triton.knobs as k; print(k.compilation.listener)"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "None", proc.stderr[-2000:]


def _report(outcomes, **compiles):
    return {"loss_abs_err": 0.0, "grad_max_abs_err": 0.0, "outcomes": outcomes,
            "compiles": {"cpp": 0, "triton": 0, "triton-cache-hit": 0, "ptxas": 0, **compiles}}


def test_a_hit_that_compiled_or_missed_is_a_problem():
    assert problems("farm hit", _report(["hit"], **{"triton-cache-hit": 3})) == []
    assert problems("farm hit", _report(["hit"], triton=2, ptxas=2)) == ["a hit ran compilers: {'triton': 2, 'ptxas': 2}"]
    assert problems("autotuned hit", _report(["hit"], cpp=1)) == ["a hit ran compilers: {'cpp': 1}"]
    assert problems("farm hit", _report(["hit", "miss"]))[0].startswith("expected farm hits")
    assert problems("farm cold", _report(["hit"]))[0].startswith("expected farm misses")
    assert problems("local cold", _report([], cpp=5)) == []


def test_a_hit_that_benchmarked_is_a_problem():
    assert problems("farm hit", _report(["hit"], autotune=3)) == ["a hit benchmarked 3 kernels' configs"]


COUNT_BENCHMARKS = textwrap.dedent(
    """
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    kernel = CachingAutotuner.__new__(CachingAutotuner)
    try:
        kernel.benchmark_all_configs()
    except Exception:
        pass  # no launchers: only the count matters here
    """
)


def test_a_kernel_benchmarking_its_configs_is_counted(tmp_path):
    assert _counted(tmp_path, COUNT_BENCHMARKS)[0] == ["autotune"]


def test_numbers_off_eager_are_a_problem():
    report = {**_report([]), "grad_max_abs_err": 0.5}
    assert problems("local warm", report)[0].startswith("differs from eager")


def test_redis_server_is_found_under_its_name_or_reported_missing(tmp_path):
    assert redis_server_dir(str(tmp_path / "absent"), tmp_path) is None
    carried = tmp_path / "redis-server-7.2"
    carried.write_text("#!/bin/sh\necho carried\n")
    carried.chmod(0o755)
    found = redis_server_dir(str(carried), tmp_path)
    assert found is not None
    out = subprocess.run([str(found / "redis-server")], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "carried"


def test_the_sdks_phases_are_read_from_its_lines_and_summed():
    cold = FARM_LINE % (0, "gpt", "miss", "", "abc", 0.01, 9.5, " (farm: lower 4.00s, build 5.00s)",
                        0.25, 1.5, 12.0, 3)
    hit = FARM_LINE % (1, "gpt", "hit", "", "def", 0.02, 0.03, "", 0.05, 0.75, 12.0, 3)
    assert farm_phases([cold, "torchfarm: unrelated", hit]) == pytest.approx(
        {"encode": 0.03, "submit+wait": 9.53, "fetch": 0.30, "load": 2.25})
    assert farm_phases([]) == {"encode": 0.0, "submit+wait": 0.0, "fetch": 0.0, "load": 0.0}


def test_a_profile_says_where_the_time_went_by_area(tmp_path):
    module = tmp_path / "site-packages" / "slowpkg" / "__init__.py"
    module.parent.mkdir(parents=True)
    module.write_text("def spin(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n"
                      "    return total\n")
    sys.path.insert(0, str(module.parent.parent))
    profile = cProfile.Profile()
    try:
        profile.enable()
        import slowpkg

        slowpkg.spin(200_000)
        time.sleep(0.05)
        profile.disable()
    finally:
        sys.path.remove(str(module.parent.parent))
        sys.modules.pop("slowpkg", None)
    got = summarize(profile, top=5)
    assert got["by_area_s"]["builtin time.sleep"] >= 0.04
    assert got["by_area_s"]["slowpkg"] > 0  # a package outside the named areas: its own name
    assert any(row[0].endswith("__init__.py:1(spin)") for row in got["top_self"])
    assert 0 < got["imports_s"] < got["total_s"]
    assert len(got["top_self"]) == 5 and got["top_cumulative"][0][3] >= got["top_cumulative"][-1][3]


@pytest.mark.parametrize(("filename", "func", "expected"), [
    ("/v/lib/python3.12/site-packages/torch/_dynamo/symbolic_convert.py", "step", "dynamo"),
    ("/v/lib/python3.12/site-packages/torch/_inductor/runtime/triton_heuristics.py", "run", "inductor runtime"),
    ("/v/lib/python3.12/site-packages/triton/backends/nvidia/driver.py", "__init__", "triton"),
    ("/v/lib/python3.12/site-packages/networkx/utils/backends.py", "__new__", "networkx"),
    ("/repo/sdk/loader.py", "install_kernels", "torchfarm sdk"),
    ("/usr/lib/python3.12/subprocess.py", "run", "python stdlib"),
    ("~", "<built-in method posix.waitpid>", "builtin posix.waitpid"),
    ("~", "<method 'recv' of '_socket.socket' objects>", "builtin recv"),
])
def test_a_functions_area(filename, func, expected):
    assert area(filename, func) == expected
