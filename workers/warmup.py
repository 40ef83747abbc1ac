"""What a worker would otherwise pay on its first compile or kernel build, paid once
when it starts, in the main process before Celery forks the pool: the pool processes
inherit it, and so do those that replace a recycled one (`worker_max_tasks_per_child`).

- Inductor's CPU vector ISA probe (`pick_vec_isa()`): it compiles a test program per
  ISA the CPU reports and dlopens it in a child process; the answer is cached for the
  process (`valid_vec_isa_list`, `functools.cache`). Measured on the 2-core
  development machine, pinned to one core: 4.9 s in a fresh process with an empty
  Inductor cache dir, and the same again in every other worker process, where it sat on
  the critical path of the first kernel build.
- The build hashes every compile's cache key starts from (`torch_key()`, a hash of
  torch's sources, and `triton_key()`; `prefetchable_cache`d for the process): 0.8 to
  2.6 s on the same machine.

Nothing here changes what a compile does: the same functions run, earlier. Torch 2.13
internals, pinned in tests/unit/test_warmup.py: `torch._inductor.cpu_vec_isa.
pick_vec_isa` and `valid_vec_isa_list`, `torch._inductor.codecache.torch_key` and
`triton_key`.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def warm_inductor() -> dict[str, float]:
    """Runs the ISA probe and the build hashes; returns the seconds each took."""
    from torch._inductor.codecache import torch_key, triton_key
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    t0 = time.perf_counter()
    isa = pick_vec_isa()
    t1 = time.perf_counter()
    torch_key()
    triton_key()
    t2 = time.perf_counter()
    seconds = {"isa_probe": t1 - t0, "build_keys": t2 - t1}
    log.info(
        "warmed Inductor: vector ISA %s (probe %.2fs), build keys %.2fs",
        isa or "none", seconds["isa_probe"], seconds["build_keys"],
    )
    return seconds
