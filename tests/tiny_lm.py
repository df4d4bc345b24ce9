"""The tiny transformer the distributed tests shard (``test_distributed.py``: FSDP2, HSDP, tensor parallel;
``test_distributed_pp.py``: pipeline stages): an embedding, pre-norm MLP blocks, an optional final norm and
a head without bias. Parameter names (``emb``, ``blocks.N.norm/up/down``, ``norm``, ``out``) are what the
tests' hand sums and split points name."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, *, final_norm: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d) if final_norm else None
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.out(self.norm(x) if self.norm is not None else x)
