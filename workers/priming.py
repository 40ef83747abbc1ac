"""What a worker would otherwise pay on its first compile or kernel build, paid once
when it starts, in the main process before Celery forks the pool: the pool processes
inherit it, and so do those that replace a recycled one (`worker_max_tasks_per_child`).

- Inductor's CPU vector ISA probe (`pick_vec_isa()`): it compiles a test program per
  ISA the CPU reports and dlopens it in a child process; the answer is cached for the
  process (`valid_vec_isa_list`, `functools.cache`). Unwarmed, every worker process
  pays it again, on the critical path of its first kernel build.
- The build hashes every compile's cache key starts from (`torch_key()`, a hash of
  torch's sources, and `triton_key()`; `prefetchable_cache`d for the process).
- The first compile's own start-up: Inductor's lazily built pattern-matcher passes,
  lowerings and decomposition tables, and the modules they import, and what each op
  costs the first time a process traces, decomposes and lowers it. A small
  transformer block's training graph (an embedding, layer norms, causal attention, an
  MLP with GELU, a cross-entropy loss: the ops most models are built from) goes the
  way a staged compile goes: encoded and decoded, decomposed (`decompose_graph`),
  stored and lowered from the stored graphs (`using_decomposition`), with its kernel
  builds deferred (no compiler runs, nothing stays loaded) and one compile thread, so
  no thread or process pool exists when Celery forks. This block warms a later
  compile more than a tiny MLP did, and a convolution block did not help the CNN
  example (figures in docs/measurements.md). Like every job, it runs in a stack chunk
  of its own (workers/stackroom.py).

Nothing here changes what a compile does: the same functions run, earlier. Torch 2.13
internals, pinned in tests/unit/test_warmup.py: `torch._inductor.cpu_vec_isa.
pick_vec_isa` and `valid_vec_isa_list`, `torch._inductor.codecache.torch_key` and
`triton_key`.
"""

from __future__ import annotations

import logging
import time

import torch

from torchfarm.fx.internals import resolve
from workers.stackroom import in_stack_room

log = logging.getLogger(__name__)


def warm_inductor(compile: bool = True, isa_probe: bool = True) -> dict[str, float]:
    """Runs the ISA probe (with `isa_probe`), the build hashes and, with `compile`, a
    small staged compile; returns the seconds each took. A GPU worker skips the probe
    and the compile, CPU work, and warms its GPU path where it runs (workers/gpu_warm.py)."""
    torch_key, triton_key = resolve("torch_key"), resolve("triton_key")
    pick_vec_isa = resolve("pick_vec_isa")

    t0 = time.perf_counter()
    isa = pick_vec_isa() if isa_probe else "not probed"
    t1 = time.perf_counter()
    torch_key()
    triton_key()
    t2 = time.perf_counter()
    if compile:
        in_stack_room(_staged_lowering)
    t3 = time.perf_counter()
    seconds = {"isa_probe": t1 - t0, "build_keys": t2 - t1, "first_compile": t3 - t2}
    log.info(
        "warmed Inductor: vector ISA %s (probe %.2fs), build keys %.2fs, first compile %.2fs",
        isa or "none", seconds["isa_probe"], seconds["build_keys"], seconds["first_compile"],
    )
    return seconds


class _Block(torch.nn.Module):
    """A transformer block with an embedding and a loss, tiny: what the warm-up compiles."""

    def __init__(self, vocab: int = 32, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, width)
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width)
        )
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp(self.ln2(x))
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _staged_lowering() -> None:
    """`_Block`'s training graph, captured by Dynamo and compiled as a staged job
    compiles one: decomposed, then lowered from its stored decomposition, its kernels
    deferred. Raises if the lowering did not take the decomposition."""
    fresh_cache = resolve("fresh_cache")

    from torchfarm.fx.decode import decode_graph
    from torchfarm.fx.encode import encode_graph
    from workers.aot_seam import Decomposition, decompose_graph, using_decomposition
    from workers.compiler import lower_graph

    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(encode_graph(gm, example_inputs))
        return gm.forward

    gen = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, 32, (2, 8), generator=gen) for _ in range(2))
    try:
        torch.compile(_Block(), backend=capture, dynamic=False)(idx, targets)
    finally:
        resolve("dynamo_reset")()
    # In a cache dir of its own, deleted after: a restarted worker would find this graph
    # in its Inductor cache dir and skip the very work the warm-up is for.
    with fresh_cache(), resolve("inductor_config").patch(compile_threads=1):
        fields = decompose_graph(decode_graph(graphs[0])).to_fields()
        dec = Decomposition.from_fields({k.encode(): v for k, v in fields.items()})
        used: list[str] = []
        decoded = decode_graph(graphs[0])
        lower_graph(
            decoded.gm, decoded.example_inputs, fake_mode=decoded.fake_mode,
            aot_seam=using_decomposition(dec, decoded, used),
        )
    if used != ["capture", "partition"]:
        raise RuntimeError(f"the warm-up's lowering did not take its decomposition: {used}")
