"""PyTorch Fake Export: export a model for a device this machine does not have.

The model is a two-layer MLP with GELU. Its first layer may live on a GPU (``cuda:0``) and its second on
the CPU, with a transfer between them. We export it with ``torch.export`` three ways: all on cpu, all on
cuda:0, and split between the two (the hybrid placement), on a machine with no GPU and without making a
single real weight: the parameters are *fake* tensors (shape, dtype and device, no data).

``fakeviz.check_export`` runs the export under fake tensors, records it, and returns a result with
``.ok``, ``.program`` (the ``ExportedProgram``), ``.nodes`` (one row per graph node, with its device:
the table ``fakeviz.prop`` makes of an FX graph, plus each node's ``kind``)
and ``.trace``. When an export fails, ``.reason`` says what failed, at which line of your code, and what
to change.

Run it with ``python examples/fake_export_hybrid_mlp.py`` (a few seconds). In a notebook, show a result
(``check``) for a table with the devices coloured, or open ``check.explore()``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import fakeviz as fv

COLUMNS = ["name", "target", "kind", "shape", "dtype", "device"]


# 1. The model. `forward` moves the hidden activations to wherever fc2 lives: a real transfer when fc1 and
#    fc2 are on different devices, nothing at all when they share one.
class MLP(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = h.to(self.fc2.weight.device)  # the transfer between fc1's device and fc2's
        return self.fc2(h)


# 2. Build it under fake tensors and place each layer. `fv.fake_mode()` makes every tensor created inside
#    fake: "cuda:0" works even on a CPU-only machine, and no memory is spent on weights.
def build(fc1_device: str, fc2_device: str, batch: int = 8) -> tuple[MLP, torch.Tensor]:
    with fv.fake_mode():
        model = MLP()
        model.fc1.to(fc1_device)
        model.fc2.to(fc2_device)
        x = torch.randn(batch, 64, device=fc1_device)  # the example input lives where fc1 does
    return model, x


def export_all_placements() -> None:
    # 3. Export each placement. check_export copies the model into its own fake mode (your model is not
    #    modified), runs torch.export.export on it while recording every op, and collects the graph.
    for name, (fc1_device, fc2_device) in {
        "cpu": ("cpu", "cpu"),
        "cuda": ("cuda:0", "cuda:0"),
        "hybrid": ("cuda:0", "cpu"),
    }.items():
        model, x = build(fc1_device, fc2_device)
        check = fv.check_export(model, (x,))
        print(f"== {name}: fc1 on {fc1_device}, fc2 on {fc2_device}: {check!r}")
        # 4. One row per graph node: parameters and the input (placeholders), each op, the output. In the
        #    hybrid export, fc1's linear and gelu are on cuda:0, the `to` node is the transfer, and fc2's
        #    linear runs on cpu.
        print(check.nodes[COLUMNS].to_string(index=False))
        # The same export, recorded: the aten ops each graph node ran, with their devices.
        print(f"recorded: {check.trace!r}\n")


# 5. A model that cannot be exported as written: it branches on a tensor's *value*. An exported graph is
#    traced on shapes, not values, so export cannot pick a side. check_export does not raise: it explains.
class GatedMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        if h.mean() > 0:  # a Python `if` on a tensor: data-dependent control flow
            h = h * 2
        return self.fc2(h.to(self.fc2.weight.device))


# 6. The fix the reason suggests: torch.cond exports both branches and picks one when the program runs.
class CondMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = torch.cond(h.mean() > 0, lambda t: t * 2, lambda t: t.clone(), (h,))
        return self.fc2(h.to(self.fc2.weight.device))


def export_data_dependent() -> None:
    with fv.fake_mode():
        gated = GatedMLP()
        gated.fc1.to("cuda:0")
        x = torch.randn(8, 64, device="cuda:0")
    check = fv.check_export(gated, (x,))
    print(f"== data-dependent branch: {check!r}")
    print(check.reason)  # what failed, your line, what to change; torch's own message is on check.error
    print(f"recorded up to the failure: {check.trace!r}\n")

    with fv.fake_mode():
        fixed = CondMLP()
        fixed.fc1.to("cuda:0")
    check = fv.check_export(fixed, (x,))
    print(f"== with torch.cond: {check!r}")
    print(check.nodes[COLUMNS].to_string(index=False))


if __name__ == "__main__":
    export_all_placements()
    export_data_dependent()
