"""One rank of a distributed training run, launched by torchrun (tests/integration/test_distributed.py).

    torchrun --standalone --nproc_per_node N distributed_train.py MODEL MODE STEPS OUT_DIR WIDTH

MODE is "farm" (`sdk.compile(..., fallback="error")`), "local" (plain `torch.compile`,
Inductor on this rank) or "eager" (no compile). Each rank writes OUT_DIR/rank<r>.json:
the losses of every step, the gradients of the first step, the farm's outcome for each
graph, the seconds from the start of the process to the end of the first step, and the
same model's losses and gradients trained eagerly afterwards in the same ranks
(`eager_losses`, `eager_grads`; left out with TORCHFARM_TEST_NO_REFERENCE=1).
The gloo backend on CPU; every rank starts from the same seeded weights and data.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

START = time.perf_counter()
if "TORCHFARM_TEST_INDUCTOR_BASE" in os.environ:  # a cache dir of its own per rank, as on nodes
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        os.environ["TORCHFARM_TEST_INDUCTOR_BASE"], f"rank{os.environ.get('RANK', '0')}"
    )

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.utils.checkpoint  # noqa: E402
from torch import nn  # noqa: E402


def _sum_forward_only(partial: torch.Tensor) -> torch.Tensor:
    """Megatron's g: the sum over ranks going forward, the identity going back."""
    total = funcol.all_reduce(partial, "sum", dist.group.WORLD)
    return partial + (total - partial).detach()


class TensorParallelMLP(nn.Module):
    """A column-sharded, then row-sharded two-layer MLP; one all-reduce in the graph."""

    def __init__(self, width: int, hidden: int, rank: int, world: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        full1, full2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        shard = hidden // world
        rows = slice(rank * shard, (rank + 1) * shard)
        self.w1 = nn.Parameter(full1.weight.detach()[rows].clone())
        self.b1 = nn.Parameter(full1.bias.detach()[rows].clone())
        self.w2 = nn.Parameter(full2.weight.detach()[:, rows].clone())
        self.b2 = nn.Parameter(full2.bias.detach().clone())
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.w1, self.b1))
        partial = torch.nn.functional.linear(h, self.w2)
        return self.norm(_sum_forward_only(partial) + self.b2 + x)


class Checkpointed(nn.Module):
    """`inner` under activation checkpointing: its collectives are in a subgraph."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


class Block(nn.Module):
    """A pre-norm transformer block: causal SDPA attention, then a GELU MLP."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.mlp(self.norm2(x))


class SmallTransformer(nn.Module):
    def __init__(self, width: int, depth: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, features = x.shape
        h = x.view(batch, 4, features // 4).repeat(1, 1, 4)
        for block in self.blocks:
            h = block(h)
        return h.mean(dim=1)


class ParallelBlock(nn.Module):
    """A pre-norm transformer block laid out for Megatron-style tensor and sequence
    parallelism (`dtensor_plan`): attention heads and MLP columns split over the ranks,
    the norms and residuals over the sequence."""

    def __init__(self, width: int, head_dim: int = 4) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def _heads(self, p: torch.Tensor) -> torch.Tensor:
        return p.view(p.shape[0], p.shape[1], -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = (self._heads(p(h)) for p in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        x = x + self.o(a.reshape(a.shape[0], a.shape[1], -1))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class SequenceParallelModel(nn.Module):
    """The batch as a sequence of four tokens, through a `ParallelBlock` whose input and
    output are this rank's shard of the sequence."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = ParallelBlock(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, features = x.shape
        h = x.view(batch, 4, features // 4).repeat(1, 1, 4)
        return self.block(h).mean(dim=1)


class DTensorMLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.down(torch.nn.functional.gelu(self.up(x))) + x)


class MLPStack(nn.Module):
    """Two `DTensorMLP` blocks, for FSDP2 composed with tensor parallelism."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(DTensorMLP(width) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class VocabParallelModel(nn.Module):
    """Token ids made from the batch, through an embedding whose rows `RowwiseParallel`
    splits over the ranks: each rank masks the ids outside its rows, so its graph
    compiles to code with its own offsets."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(4 * width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 100).long() % self.emb.num_embeddings
        return self.out(self.emb(ids).mean(dim=1))


def dtensor_parallel(name: str, width: int, world: int) -> nn.Module:
    """The models laid out with `torch.distributed.tensor.parallel` on a 1-d mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    if name == "dtensor_mlp":
        return parallelize_module(DTensorMLP(width), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if name == "dtensor_vocab":
        return parallelize_module(VocabParallelModel(width), mesh, {"emb": RowwiseParallel()})
    model = SequenceParallelModel(width)
    columns = ColwiseParallel(input_layouts=Shard(1))
    plan = {
        "norm1": SequenceParallel(), "q": columns, "k": columns, "v": columns,
        "o": RowwiseParallel(output_layouts=Shard(1)), "norm2": SequenceParallel(),
        "up": columns, "down": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(model.block, mesh, plan)
    return model


def fsdp2_tensor_parallel(width: int, world: int) -> nn.Module:
    """`MLPStack` on a 2-d mesh: each block tensor parallel along "tp" (two ranks), and
    FSDP2 sharding it along "dp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = MLPStack(width)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def build(name: str, width: int, rank: int, world: int) -> nn.Module:
    if name in ("dtensor_mlp", "dtensor_block", "dtensor_vocab"):
        return dtensor_parallel(name, width, world)
    if name == "tp_mlp":
        return TensorParallelMLP(width, 4 * width, rank, world)
    if name == "tp_mlp_checkpointed":
        return Checkpointed(TensorParallelMLP(width, 4 * width, rank, world))
    if name == "fsdp2_tp":
        return fsdp2_tensor_parallel(width, world)
    if name == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = SmallTransformer(width)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    if name == "pipeline":
        torch.manual_seed(0)
        full = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, 2 * width), nn.GELU(),
            nn.Linear(2 * width, width),
        )
        half = len(full) // 2
        return full[:half] if rank == 0 else full[half:]  # two stages, one per rank
    raise SystemExit(f"unknown model {name}")


def _compiler(mode: str):  # noqa: ANN202 - the compile function of a mode
    if mode == "farm":
        import sdk

        return lambda m: sdk.compile(m, fallback="error")
    if mode == "local":
        return torch.compile
    return None


def compiled(model: nn.Module, mode: str) -> nn.Module:
    """The module to call: compiled whole; or, under FSDP2, block by block, the way FSDP2
    is compiled (its hooks run eagerly between the blocks' graphs, so the graphs hold no
    collectives and see the unsharded parameters)."""
    compile_fn = _compiler(mode)
    if compile_fn is None:
        return model
    if isinstance(model, (SmallTransformer, MLPStack)):
        for i, block in enumerate(model.blocks):
            model.blocks[i] = compile_fn(block)
        return model
    return compile_fn(model)


def _gradient(p: torch.Tensor) -> list[float]:
    grad = p.grad
    if hasattr(grad, "full_tensor"):  # FSDP2's and tensor parallel's sharded DTensor gradients
        grad = grad.full_tensor()
    return grad.flatten().tolist()


FIRST_STEP_AT: list[float] = []
"""Wall-clock time at the end of the first step, for bench/ranks.py."""


def _batch(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data and target on every rank, every run."""
    data_gen = torch.Generator().manual_seed(1)
    return torch.randn(8, width, generator=data_gen), torch.randn(8, width, generator=data_gen)


def _sgd_steps(
    module: nn.Module, steps: int, step: Callable[[], float | None]
) -> tuple[list[float], dict, float]:
    """`steps` SGD steps of `module`'s parameters, each a forward and backward by
    `step`, which returns the step's loss (None on a rank that has none). The losses,
    the first step's gradients, and seconds from process start to its end."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    losses: list[float] = []
    grads: dict[str, list[float]] = {}
    first_step_s = 0.0
    for i in range(steps):
        optimizer.zero_grad()
        loss = step()
        if loss is not None:
            losses.append(loss)
        if i == 0:
            first_step_s = time.perf_counter() - START
            FIRST_STEP_AT.append(time.time())
            grads = {n.replace("._orig_mod", ""): _gradient(p) for n, p in module.named_parameters()}
        optimizer.step()
    return losses, grads, first_step_s


def train(model: nn.Module, step_fn: nn.Module, steps: int, width: int) -> tuple[list[float], dict, float]:
    """Losses of every step, first-step gradients, seconds from process start to the
    end of the first step."""
    data, target = _batch(width)

    def step() -> float:
        loss = (step_fn(data) - target).pow(2).mean()
        loss.backward()
        return loss.item()

    return _sgd_steps(model, steps, step)


def train_pipeline(
    stage_module: nn.Module, step_fn: nn.Module, steps: int, width: int
) -> tuple[list[float], dict, float]:
    """`train` for one stage of a two-stage GPipe schedule (two microbatches); the last
    stage has the losses, the mean over its microbatches per step."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    stage = PipelineStage(step_fn, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda o, t: (o - t).pow(2).mean())
    data, target = _batch(width)

    def step() -> float | None:
        if rank == 0:
            schedule.step(data)
            return None
        micro: list[torch.Tensor] = []
        schedule.step(target=target, losses=micro)
        return torch.stack(micro).mean().item()

    return _sgd_steps(stage_module, steps, step)


def main(name: str, mode: str, steps: int, out_dir: str, width: int) -> None:
    """Trains through `mode`, then (unless timing only) the same model eagerly, for
    reference, in the same ranks."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from sdk import report

    model = build(name, width, rank, world)
    run = train_pipeline if name == "pipeline" else train
    with report.collect() as graphs:  # the backend takes its sinks when made
        losses, grads, first_step_s = run(model, compiled(model, mode), steps, width)
    result: dict[str, object] = {
        "rank": rank,
        "losses": losses,
        "grads": grads,
        "outcomes": [g.outcome for g in graphs],
        "keys": [g.key for g in graphs],
        "first_step_s": first_step_s,
        "first_step_at": FIRST_STEP_AT[0],
    }
    if os.environ.get("TORCHFARM_TEST_NO_REFERENCE") != "1":
        reference = build(name, width, rank, world)
        result["eager_losses"], result["eager_grads"], _ = run(reference, reference, steps, width)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
