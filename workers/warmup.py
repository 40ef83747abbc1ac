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
- The first compile's own start-up: Inductor's lazily built pattern-matcher passes,
  lowerings and decomposition tables, and the modules they import. A tiny training
  graph is lowered with its kernel builds deferred (`lower_graph`: no compiler runs,
  nothing stays loaded) and with one compile thread, so no thread or process pool
  exists when Celery forks. Measured on the GPT example's graph, pinned to one core:
  its lowering took 12.7 s after this against 14.4 s without, and its first kernels
  were ready 2.1 s sooner.

Nothing here changes what a compile does: the same functions run, earlier. Torch 2.13
internals, pinned in tests/unit/test_warmup.py: `torch._inductor.cpu_vec_isa.
pick_vec_isa` and `valid_vec_isa_list`, `torch._inductor.codecache.torch_key` and
`triton_key`.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def warm_inductor(compile: bool = True) -> dict[str, float]:
    """Runs the ISA probe, the build hashes and, with `compile`, a tiny lowering;
    returns the seconds each took."""
    from torch._inductor.codecache import torch_key, triton_key
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    t0 = time.perf_counter()
    isa = pick_vec_isa()
    t1 = time.perf_counter()
    torch_key()
    triton_key()
    t2 = time.perf_counter()
    if compile:
        _tiny_lowering()
    t3 = time.perf_counter()
    seconds = {"isa_probe": t1 - t0, "build_keys": t2 - t1, "first_compile": t3 - t2}
    log.info(
        "warmed Inductor: vector ISA %s (probe %.2fs), build keys %.2fs, first compile %.2fs",
        isa or "none", seconds["isa_probe"], seconds["build_keys"], seconds["first_compile"],
    )
    return seconds


def _tiny_lowering() -> None:
    """A small MLP's training graph, captured by Dynamo and lowered as a staged job
    lowers one, its kernels deferred."""
    import torch

    from workers.compiler import lower_graph

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    captured: list[tuple[torch.fx.GraphModule, list[torch.Tensor]]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        captured.append((gm, example_inputs))
        return gm.forward

    torch.compile(model, backend=capture, dynamic=False)(torch.randn(4, 8, requires_grad=True))
    try:
        with torch._inductor.config.patch(compile_threads=1):
            lower_graph(*captured[0])
    finally:
        torch._dynamo.reset()
