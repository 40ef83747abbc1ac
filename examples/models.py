"""Small, readable models that the examples, tests and benchmarks share.

- `MLP`: linear layers and GELU.
- `SmallCNN`: convolution, batch norm, pooling.
- `GPT`: a nanoGPT-style decoder using `scaled_dot_product_attention`.

Each comes with a `make_*` helper that returns the model and a batch of inputs built
from a seeded generator, so two processes see the same weights and data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 3, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 1000
    block: int = 128
    layers: int = 4
    heads: int = 4
    width: int = 256


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, `layers` blocks, a tied-free LM head and the loss."""

    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.block, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_mlp(batch: int = 16, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return MLP(), (torch.randn(batch, 64, generator=gen),)


def make_cnn(batch: int = 4, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return SmallCNN(), (torch.randn(batch, 3, 16, 16, generator=gen),)


def make_gpt(
    cfg: GPTConfig = GPTConfig(), batch: int = 8, seed: int = 0
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.block), generator=gen)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.block), generator=gen)
    return GPT(cfg), (idx, targets)


TINY_GPT = GPTConfig(vocab=128, block=32, layers=1, heads=2, width=64)
"""A one-block GPT small enough for integration tests."""
