"""The worker's start-up warm-up (workers/priming.py): Inductor's ISA probe and a tiny
lowering run once, in the process that will fork the pool; a forked process does not
run the probe again, and compiles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import os
    from torchfarm.fx.hooks import count_kernel_builds
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list
    from workers.priming import warm_inductor

    with count_kernel_builds() as warm:
        seconds = warm_inductor()
    assert set(seconds) == {"isa_probe", "build_keys", "first_compile"}, seconds
    pid = os.fork()
    if pid == 0:  # a pool process
        with count_kernel_builds() as child:
            pick_vec_isa()
        if child.count:
            os._exit(3)
        # And it compiles: nothing the warm-up left (no thread or process pool) hangs it.
        import torch
        x = torch.randn(64)
        out = torch.compile(lambda t: (t * 2).sin() + 1)(x)
        os._exit(0 if torch.allclose(out, (x * 2).sin() + 1, rtol=1e-5, atol=1e-5) else 4)
    _, status = os.waitpid(pid, 0)
    print(len(valid_vec_isa_list()), warm.count, os.waitstatus_to_exitcode(status))
    """
)


def test_internals_the_warmup_calls():
    from torch._inductor import cpu_vec_isa

    from torchfarm.fx import internals

    assert callable(cpu_vec_isa.pick_vec_isa)
    assert hasattr(cpu_vec_isa.valid_vec_isa_list, "cache_info")  # cached for the process
    # triton_key lives elsewhere before 2.13 (internals.SEAM).
    assert callable(internals.resolve("torch_key")) and callable(internals.resolve("triton_key"))


@pytest.mark.slow
def test_the_isa_probe_runs_at_warmup_and_a_forked_process_inherits_it(tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    isas, warm_builds, child_exit = (int(x) for x in done.stdout.split()[-3:])
    if isas:  # a CPU with a vector ISA: its probe is a compiler run, in the warm-up
        assert warm_builds >= 1
    assert child_exit != 3, "the forked process ran the ISA probe again"
    assert child_exit == 0, f"the forked process could not compile (exit {child_exit})"
