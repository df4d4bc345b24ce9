# Tutorial 06: fake export. `torch.export` of a model split between cuda:0 and the CPU, on a machine with no GPU; then
# fake tensor propagation over an FX graph (`fakeviz.prop`): shapes, devices and shared storages per node.
#
# `python notebooks/build.py 06 --execute` writes `notebooks/06_fake_export.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_06.py`) take the notebook's own classes and compare every node's shape and
# dtype with `torch.export` and `torch.fx.Interpreter` runs of them on real CPU tensors.

# %% [markdown]
# # 06 · Fake export: a cuda model exported on a laptop
#
# `torch.export` turns a model into a graph of aten ops with the shape, dtype and device of every value (an `ExportedProgram`): the input to AOTInductor, ExecuTorch and TensorRT. To export a model that runs on a GPU you normally need the GPU, and the weights. Neither is needed to *trace*: export already runs your model on fake tensors internally. fakeviz lets you hand it a model that *is* fake from the start, placed on a `cuda:0` this machine does not have.
#
# In this notebook you will learn:
#
# * how to build a model under `fv.fake_mode()` with one layer on `cuda:0` and one on the CPU, and export it with `fv.check_export` on a machine with no GPU;
# * how to read the exported graph as a table (`check.nodes`: one row per node with shape, dtype and **device**) and where the transfer between devices is;
# * what a failed export tells you (`check.reason`): here, a forgotten `.to(device)` that would only have crashed on the GPU box;
# * a batch size that is a symbol (`dynamic_shapes`): bytes as formulas such as `1024*s77`;
# * how to run `FakeTensorProp` over any FX graph (`torch.fx.symbolic_trace`) with `fv.prop`: shapes, strides, bytes, devices, and which nodes share a storage.
#
# It runs in about 15 seconds on a laptop CPU.

# %%
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

import fakeviz as fv

pd.set_option("display.width", 140)
print("a real GPU here:", torch.cuda.is_available(), "| fake cuda:", fv.fake_cuda_status().mode)

# %% [markdown]
# No GPU (on Binder, Colab's CPU runtime or a laptop). A real tensor cannot go to `cuda:0` here; PyTorch stops at the first attempt:

# %% tags=["raises-exception"]
nn.Linear(64, 256).to("cuda:0")  # a real layer, a GPU this machine doesn't have


# %% [markdown]
# ## 1. The model: one layer on the GPU, one on the CPU
#
# A two-layer MLP whose `forward` moves the hidden activations to wherever `fc2` lives. When both layers share a device the `.to` is a no-op; when they do not, it is a device-to-host copy. Splitting a model like this is what `device_map="auto"` does when a model does not fit on the GPU, and what you do by hand to keep a large output layer on the CPU.

# %%
class MLP(nn.Module):
    def __init__(self, d_in=64, d_hidden=256, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = h.to(self.fc2.weight.device)  # the transfer between fc1's device and fc2's
        return self.fc2(h)


# %% [markdown]
# Under `fv.fake_mode()` every tensor made is fake: it has a shape, dtype and device but no data, so `.to("cuda:0")` works without a GPU (fakeviz registers a data-less CUDA device with PyTorch) and the weights cost no memory. The example input lives where `fc1` does.

# %%
with fv.fake_mode():
    model = MLP()
    model.fc1.to("cuda:0")
    x = torch.randn(8, 64, device="cuda:0")

for name, p in model.named_parameters():
    print(f"{name:12} {str(p.device):7} {tuple(p.shape)}  fake: {fv.is_fake(p)}")

# %% [markdown]
# ## 2. Export it
#
# `fv.check_export(model, (x,))` copies the model into its own fake mode (yours is not modified), runs `torch.export.export` on it while recording every op, and returns an `ExportCheck`: `.ok`, `.program` (the `ExportedProgram`), `.nodes` (the graph as a table), `.trace` (the recorded ops) and, if it failed, `.reason`. Shown in a notebook, it is a table of the graph's nodes with each device coloured.

# %%
check = fv.check_export(model, (x,))
check

# %% [markdown]
# Eleven nodes. The *placeholders* are the graph's inputs: the four parameters (lifted out of the module: an exported graph takes its weights as arguments) and `x`. Then the ops, in order, and the `output`. `check.nodes` is a DataFrame with more columns; here are the ones that matter for placement:

# %%
check.nodes[["name", "target", "kind", "shape", "dtype", "device", "bytes"]]

# %% [markdown]
# Follow the `device` column: `fc1`'s parameters, the input, `linear` and `gelu` are on `cuda:0`; the `to` node (`aten.to.dtype_layout`, the transfer) produces a CPU tensor, and `fc2`'s `linear_1` runs on the CPU. `_assert_tensor_metadata` is a check export inserts before the `to` (that its input is float32 on `cuda:0`); it returns nothing, like `output`, so it has no device. Nodes per device:

# %%
per_device = check.nodes.groupby("device").name.apply(list)
for device, names in per_device.items():
    print(f"{device or '(no tensor)':12} {len(names)} nodes: {', '.join(names)}")

# %% [markdown]
# The graph itself, as torch prints it, has the devices in the arguments: the `to` node carries `device: cpu`, and the assert carries `device: cuda:0`. This program would run on a machine with a GPU; compiling it (AOTInductor) would generate CUDA kernels for the first half and C++ for the second.

# %%
print(check.program.graph)

# %% [markdown]
# `check.trace` is the export recorded like any `fv.record` run: the aten ops PyTorch dispatched while tracing (`linear` is `t` + `addmm`; the transfer is `_to_copy`), each with its output's device, and the memory per device. The weights are 65,536 + 1,024 bytes on `cuda:0` and 10,240 + 40 on the CPU.

# %%
print(check.trace.oplog())
check.trace.storages.groupby(["device", "category"], observed=True).nbytes.sum()

# %% [markdown]
# The same model placed three ways. The summary line counts the graph's nodes and its op nodes, with the devices they run on:

# %%
for fc1_device, fc2_device in [("cpu", "cpu"), ("cuda:0", "cuda:0"), ("cuda:0", "cpu")]:
    with fv.fake_mode():
        m = MLP()
        m.fc1.to(fc1_device)
        m.fc2.to(fc2_device)
        example = torch.randn(8, 64, device=fc1_device)
    print(f"fc1 on {fc1_device:6}, fc2 on {fc2_device:6}: {fv.check_export(m, (example,))!r}")


# %% [markdown]
# ## 3. When the export fails: a forgotten transfer
#
# Take the `.to(...)` out of `forward`. On one device it makes no difference; split across two, `fc2` gets a cuda tensor and CPU weights. A real run would crash only on the machine with the GPU. Fake tensors check devices exactly as real ones do, so the export fails here, and `check_export` returns the failure as a result (it does not raise) with a short explanation: what failed, your line, what to change. PyTorch's own exception is kept on `.error` (and `.raise_for_error()` raises it).

# %%
class Forgot(MLP):
    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # no .to(): fc1's output goes straight to fc2


with fv.fake_mode():
    forgot = Forgot()
    forgot.fc1.to("cuda:0")
broken = fv.check_export(forgot, (x,))
print(repr(broken))
print(broken.reason)

# %% [markdown]
# Other failures get the same treatment: a Python `if` on a tensor's value (`kind` `"data-dependent"`, with `torch.cond` as the fix), a graph break under `strict=True`, dynamic shapes that do not hold.
#
# ## 4. A symbolic batch
#
# Exported programs usually take any batch size. Say so with `dynamic_shapes`: dimension 0 of `x` is a `Dim`. The shapes become formulas in a symbol (PyTorch names it after a hash of where it came from, e.g. `s77`); `bytes` is -1 where it depends on the symbol, `bytes_expr` is the formula and `bytes_hint` its value for the example input (batch 8).

# %%
batch = torch.export.Dim("batch")
dynamic = fv.check_export(model, (x,), dynamic_shapes={"x": {0: batch}})
dynamic.nodes[["name", "shape", "device", "bytes", "bytes_expr", "bytes_hint"]]

# %% [markdown]
# `x` costs `256*s77` bytes (64 float32 per row) and the hidden activations `1024*s77` (256 per row), on `cuda:0` until the transfer and on the CPU after it. The constraints the export found are on the program:

# %%
dynamic.program.range_constraints


# %% [markdown]
# ## 5. FakeTensorProp on an FX graph: `fv.prop`
#
# `torch.export` is one way to get a graph. `torch.fx.symbolic_trace` is the oldest: it records the ops a module calls, without running them and without any shapes. Here is a small block with a residual connection and a reshape into heads (two views at the end):

# %%
class Block(nn.Module):
    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads = heads
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        y = self.norm(x + h)
        return y.view(y.size(0), self.heads, -1).transpose(1, 2)


gm = torch.fx.symbolic_trace(Block())
print(gm.graph)

# %% [markdown]
# The graph says *which* ops run, not what flows between them. `fv.prop(gm, example)` runs torch's `FakeTensorProp` over it: the example input becomes a fake tensor, every node runs on fake tensors (no arithmetic, no memory) and the table has one row per node. `storage` numbers the storages in graph order and `shares_with` names the other nodes on the same storage:

# %%
table = fv.prop(gm, torch.randn(8, 16))
table[["name", "op", "target", "shape", "stride", "dtype", "device", "bytes", "storage", "shares_with"]]

# %% [markdown]
# Read the last rows: `view` reshapes `norm`'s `[8, 16]` into 4 heads (`[8, 4, 4]`, strides `[16, 4, 1]`) and `transpose` swaps the last two strides (`[16, 1, 4]`), yet both have the same `storage` as `norm`, and so does `output`: they cost no bytes of their own (notebook 05 is about exactly this). `size` is a Python `int` node, not a tensor (no storage, `-1`). Every number here equals a real run of the graph (the tests check it node by node with `torch.fx.Interpreter`).
#
# With `symbolic=True` the sizes become symbols; `dynamic={"x": 0}` keeps only the batch symbolic. The table then holds for every batch size at once, and `table.attrs["values"]` says where each symbol came from and what the graph required of it (`guards`):

# %%
sym = fv.prop(gm, torch.randn(8, 16), symbolic=True, dynamic={"x": 0})
display(sym[["name", "shape", "bytes_expr", "bytes_hint", "storage"]])
values = sym.attrs["values"]
for symbol, (origin, example) in values.symbols().items():
    print(f"{symbol} = {origin} (= {example} in the example input)")
print("guards:", values.guards() or "none")

# %% [markdown]
# ### Devices in an FX graph
#
# `symbolic_trace` works on a fake model too, and `prop` uses fake inputs as they are. Trace the hybrid MLP from part 1 (`fc1` on `cuda:0`, `fc2` on the CPU) and propagate the fake `cuda:0` input: the `device` column follows the placement through the `to` node, as in the exported graph. Here the graph keeps `fc1` and `fc2` as `call_module` nodes, and the device `to` reads comes from a `get_attr` of `fc2.weight` (its row shows the weight on the CPU).

# %%
hybrid_fx = torch.fx.symbolic_trace(model)
fv.prop(hybrid_fx, x)[["name", "op", "target", "shape", "dtype", "device", "bytes"]]

# %% [markdown]
# ## Exercises
#
# 1. Put `fc2` on `cuda:1` instead of the CPU (`torch.device("cuda:1")` is fake too). How do the `to` node and the per-device node counts change? What does `check.trace.storages.groupby("device")` show?
# 2. Give `MLP.forward` a data-dependent branch, `if h.mean() > 0: h = h * 2`, and read `check.reason`. Then write it with `torch.cond(h.mean() > 0, lambda t: t * 2, lambda t: t.clone(), (h,))` and export again: which new nodes appear, and on which device?
# 3. Export the hybrid MLP with `strict=True` (TorchDynamo traces the Python). Are the nodes and devices the same?
# 4. Build the MLP in bfloat16 (`MLP().to(torch.bfloat16)` under `fv.fake_mode()`, with a bfloat16 input) and compare `bytes` and `bytes_expr` in the dynamic export with part 4.
# 5. Define `def positive(x): return x[x > 0] * 2` and propagate `torch.fx.symbolic_trace(positive)` with `fv.prop(..., symbolic=True)`. The output's size is `u0`: why can no fake tensor know it, and what happens without `symbolic=True`?
