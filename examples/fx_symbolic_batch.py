"""Shapes with a symbolic batch: fake tensor propagation over an FX graph with ``fakeviz.prop``.

An FX graph (from ``torch.fx.symbolic_trace``, ``torch.export`` or a ``torch.compile`` backend) says which
ops run, not what shapes flow through it. ``fakeviz.prop`` runs the graph on fake tensors (no data, no
memory) and gives one row per node: shape, dtype, device, stride, bytes, and which nodes share a storage.
With ``symbolic=True`` the batch becomes a symbol, so the table holds for every batch size at once.

Run it: ``python examples/fx_symbolic_batch.py`` (a few seconds on a laptop CPU).
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

import fakeviz as fv

pd.set_option("display.width", 160)
COLUMNS = ["name", "op", "target", "shape", "stride", "bytes_expr", "bytes_hint", "storage", "shares_with"]


class Block(nn.Module):
    """A small MLP block with a residual connection and a reshape to heads."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.relu(self.up(x)))
        y = self.norm(x + h)
        return y.view(y.size(0), self.heads, -1).transpose(1, 2)  # two views of the norm's output


# 1. Trace the module into an FX graph: no shapes yet, only ops.
gm = torch.fx.symbolic_trace(Block())

# 2. Propagate a real example input as fake tensors. `symbolic=True` turns its sizes into symbols;
#    `dynamic={"x": 0}` keeps only the batch (dim 0 of the input named x) symbolic. The 16 features stay
#    concrete. PyTorch names a symbol after a hash of where it comes from, so the batch prints as e.g. s93.
table = fv.prop(gm, torch.randn(8, 16), symbolic=True, dynamic={"x": 0})
print("== a symbolic batch ==")
print(table[COLUMNS].to_string(index=False))

# `bytes` is -1 where the size depends on a symbol: `bytes_expr` is the formula, `bytes_hint` its value
# for the example input (batch 8). The view and transpose share the layer norm's storage (same `storage`
# id): they cost no memory of their own.
values = table.attrs["values"]  # node name -> fake tensor, plus the symbols and guards
for symbol, (origin, example) in values.symbols().items():
    print(f"symbol {symbol}: {origin} (= {example} in the example input)")
print("the graph required:", values.guards() or "nothing of the symbols")


# 3. Sizes that depend on the data: nonzero and boolean masks. Fake tensors hold no values, so the number
#    of selected elements is an unbacked symbol, u0, u1...: known to exist, never given a value.
def select_positive(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    where = torch.nonzero(x)
    kept = x[x > 0]
    return where, kept * 2


gm2 = torch.fx.symbolic_trace(select_positive)
table2 = fv.prop(gm2, torch.randn(4, 5), symbolic=True)
print("\n== sizes that depend on data ==")
print(table2[COLUMNS].to_string(index=False))

# Without symbolic=True the same graph stops at the first such node, and says which one and what to do.
try:
    fv.prop(gm2, torch.randn(4, 5))
except fv.DataDependentError as exc:
    print("\nwithout symbolic=True:", str(exc).splitlines()[0])
