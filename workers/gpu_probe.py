"""The machine's accelerator, as a fresh child process sees it.

A worker's main process forks (Celery's prefork pool), and so does each sandbox
forkserver. CUDA cannot start in a child forked from a process that started it:
"Cannot re-initialize CUDA in forked subprocess". Seen on a GPU, where the main process
had asked `torch.cuda.get_device_properties` for its serving plan and every graph job
failed in the pool. So a process that forks never asks torch.cuda, torch.xpu or
torch.mps about the device; it asks this module, which runs `python -m workers.gpu_probe`
(fork and exec: a new interpreter that inherits no CUDA state) and keeps its answer for
the process.

What this relies on in torch (pinned in tests/unit/test_gpu_probe.py): every
`torch.cuda` query that reads device properties goes through `_lazy_init`, which starts
CUDA; `is_available()` starts the driver (`cudaGetDeviceCount` calls `cuInit`) unless
`PYTORCH_NVML_BASED_CUDA_CHECK=1`, which workers/app.py sets for torch code that asks.

With `check`, the child also proves the GPU path works where it runs: a CUDA context
starts, Triton's driver and launcher load, and one small Triton kernel compiles, runs
and gives the right answer (workers/gpu_warm.py). A GPU worker registers only after that
check passed (workers/lifecycle.py), run under its sandbox's limits (`preexec`).
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field

from torchfarm.wire import targets
from torchfarm.wire.targets import Target

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0
"""Seconds the identity probe may take (importing torch, asking the driver)."""
CHECK_TIMEOUT_S = 300.0
"""Seconds the GPU check may take: a CUDA context, Triton's launcher build, one compile."""


@dataclass(frozen=True)
class Probe:
    accelerator: str = ""
    """The exact accelerator target ("cuda:sm_90", "rocm:gfx942", "xpu:...", "mps"); "" for none."""
    ready: bool = False
    """With `check`: whether the GPU path ran there (a kernel launched and was right)."""
    error: str = ""
    """Why the probe or the check failed; "" when it did not."""
    seconds: dict[str, float] = field(default_factory=dict)
    """What each step of the check took."""


def probe_argv(check: bool = False, python: str = sys.executable) -> list[str]:
    """The probe's command line; `check` adds the GPU path's check."""
    return [python, "-m", "workers.gpu_probe", *(["--check"] if check else [])]


def run_probe(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Probe:
    """Runs the probe (`probe_argv()` unless given, in `env`, as a sandbox runs a child:
    workers/sandbox/process.py `child_command`) and reads its answer.
    Never raises for the child's failure: `error` says it."""
    argv = argv or probe_argv()
    timeout = CHECK_TIMEOUT_S if "--check" in argv else PROBE_TIMEOUT_S
    try:
        done = subprocess.run(
            argv, capture_output=True, timeout=timeout, check=False, env=env,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return Probe(error=f"the device probe did not run: {e}")
    try:
        # The last line: torch or Triton may print before it.
        answer = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
        return Probe(
            accelerator=str(answer["accelerator"]), ready=bool(answer.get("ready")),
            error=str(answer.get("error", "")), seconds=dict(answer.get("seconds", {})),
        )
    except (IndexError, ValueError, KeyError, TypeError):
        tail = done.stderr.decode(errors="replace").strip()[-800:]
        return Probe(error=f"the device probe ended {done.returncode} with no answer: {tail}")


@functools.cache
def accelerator() -> Target | None:
    """This machine's accelerator target, from a spawned probe; None when it has none.
    Cached for the process: the device does not change while a worker runs."""
    found = run_probe()
    if found.error:
        # A GPU machine whose probe fails serves no GPU target, and says why.
        log.warning("the device probe failed, so this worker sees no accelerator: %s", found.error)
    return targets.parse(found.accelerator) if found.accelerator else None


def local_targets() -> list[Target]:
    """`torchfarm.fx.fingerprint.local_targets()` without starting CUDA in this process:
    the CPU (which asks only ATen's ISA) first, then the probe's accelerator, if any."""
    from torchfarm.fx.fingerprint import local_target

    gpu = accelerator()
    return [local_target("cpu"), *([gpu] if gpu is not None else [])]


def _answer(check: bool) -> dict[str, object]:
    from torchfarm.fx.fingerprint import local_targets as probe_here

    found = probe_here()
    answer: dict[str, object] = {"accelerator": str(found[-1]) if len(found) > 1 else ""}
    if check:
        from workers.gpu_warm import warm_gpu

        t0 = time.perf_counter()
        try:
            answer["seconds"] = warm_gpu(found[-1])
            answer["ready"] = True
        except Exception as e:  # reported to the parent, which does not register
            answer["error"] = f"{type(e).__name__}: {e}"[:2000]
        answer.setdefault("seconds", {"failed_after": time.perf_counter() - t0})
    return answer


def main(argv: list[str]) -> int:
    try:
        answer = _answer("--check" in argv)
    except Exception as e:
        answer = {"accelerator": "", "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
