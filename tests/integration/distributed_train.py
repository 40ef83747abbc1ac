"""One rank of a distributed training run, launched by torchrun (tests/integration/test_distributed.py).

    torchrun --standalone --nproc_per_node N distributed_train.py MODEL MODE STEPS OUT_DIR WIDTH

MODE is "farm" (`sdk.compile(..., fallback="error")`), "local" (plain `torch.compile`,
Inductor on this rank) or "eager" (no compile). Each rank writes OUT_DIR/rank<r>.json:
the losses of every step, the gradients of the first step, the farm's outcome for each
graph, and the seconds from the start of the process to the end of the first step.
The gloo backend on CPU; every rank starts from the same seeded weights and data.
"""

from __future__ import annotations

import json
import os
import sys
import time

START = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
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


def build(name: str, width: int, rank: int, world: int) -> nn.Module:
    if name == "tp_mlp":
        return TensorParallelMLP(width, 4 * width, rank, world)
    raise SystemExit(f"unknown model {name}")


def compiled(model: nn.Module, mode: str) -> nn.Module:
    if mode == "farm":
        import sdk

        return sdk.compile(model, fallback="error")
    if mode == "local":
        return torch.compile(model)  # type: ignore[return-value]
    return model


def main(name: str, mode: str, steps: int, out_dir: str, width: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(name, width, rank, world)
    step_fn = compiled(model, mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data_gen = torch.Generator().manual_seed(1)
    data, target = torch.randn(8, width, generator=data_gen), torch.randn(8, width, generator=data_gen)
    losses: list[float] = []
    grads: dict[str, list[float]] = {}
    first_step_s = 0.0
    from sdk import report

    with report.collect() as graphs:
        for step in range(steps):
            optimizer.zero_grad()
            loss = (step_fn(data) - target).pow(2).mean()
            loss.backward()
            if step == 0:
                first_step_s = time.perf_counter() - START
                grads = {n: p.grad.flatten().tolist() for n, p in model.named_parameters()}
            optimizer.step()
            losses.append(loss.item())
    result = {
        "rank": rank,
        "losses": losses,
        "grads": grads,
        "outcomes": [g.outcome for g in graphs],
        "keys": [g.key for g in graphs],
        "first_step_s": first_step_s,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
