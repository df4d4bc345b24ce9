"""From the meta device to a fake GPU: build a model without memory, then record it as if on ``cuda:0``.

``torch.device("meta")`` builds a model with shapes and dtypes but no storage: instant, whatever the size.
Meta tensors cannot run on a device, though. ``fakeviz.fakeify(model, device="cuda:0")`` turns every
parameter and buffer into a fake tensor on ``cuda:0`` (also on a machine without a GPU), keeping tied
weights tied, and ``fakeviz.record`` then records a forward pass op by op with its memory per device.

Run it: ``python examples/meta_to_fake.py`` (a few seconds on a laptop CPU).
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

import fakeviz as fv

pd.set_option("display.width", 160)


class TinyLM(nn.Module):
    """A tiny language model whose output layer shares its weight with the embedding (tied weights)."""

    def __init__(self, vocab: int = 1000, dim: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two modules
        self.register_buffer("positions", torch.arange(128))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(self.norm(h))


# 1. Build on the meta device: no memory is allocated, no weights are initialised.
with torch.device("meta"):
    model = TinyLM()
print("built on:", model.head.weight.device, "| tied:", model.head.weight is model.embed.weight)

# 2. Make it fake on cuda:0. Every parameter and buffer becomes a fake tensor there (this works on a
#    CPU-only machine too); the tie survives because the tied parameter is one object, converted once.
fake_model = fv.fakeify(model, device="cuda:0")
weight = fake_model.head.weight
print("fake on:", weight.device, "| fake:", fv.is_fake(weight), "| tied:", weight is fake_model.embed.weight)

# (By contrast, `model.to_empty(device="cuda:0")` gives each module its own new tensor, untying the
# weights exactly as PyTorch does; transformers models re-tie them with `model.tie_weights()`.)

# 3. Record a forward pass at batch 4, sequence 32. Inputs created inside the block land on cuda:0.
with fv.record(device="cuda:0") as trace:
    ids = torch.randint(0, 1000, (4, 32))
    logits = fake_model(ids)
print("logits:", tuple(logits.shape), logits.device)

# The layer tree: parameters per module; the tied embedding/head weight is counted once at the root.
tree = trace.modules[["path", "class", "params", "param_bytes", "tied", "act_bytes"]]
print("\n== layer tree ==")
print(tree.to_string(index=False))

# The parameters and buffers as storages: the tied weight is one storage carrying both names.
storages = trace.storages
weights = storages[storages.category.isin(["Parameter", "Buffer"])]
print("\n== parameter and buffer storages ==")
print(weights[["device", "nbytes", "category", "name"]].to_string(index=False))

# Memory per device, and what was alive at the peak.
print("\n== memory per device ==")
for device, peak in trace.peak().items():
    parts = ", ".join(f"{cat} {nbytes:,} B" for cat, nbytes in peak.by_category.items() if nbytes)
    print(f"{device}: peak {peak.bytes:,} B at {peak.op} in {peak.module} ({parts})")
