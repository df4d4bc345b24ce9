# Tutorial 03: a training step's memory, where its peak is and why, what-ifs, largest batch.
#
# `python notebooks/build.py 03 --execute` writes `notebooks/03_training_memory.ipynb` from these cells and runs it.
# `tests/notebook/test_tutorial_03.py` checks what it teaches.

# %% [markdown]
# # 03 · Training memory
#
# Training needs far more memory than inference: besides the weights, every parameter gets a gradient, AdamW keeps two running averages per parameter, and the forward pass saves activations for the backward pass. In this notebook you will learn how to record one full training step (forward, backward, AdamW) of a Llama-3.1-8B-shaped model under fake tensors, on a laptop with no GPU, and read its memory: the timeline by phase and category, **where the peak is and why** (which op set it, what was alive at that moment), how the numbers follow from the parameter count by hand, what activation checkpointing and the dtype change side by side (`fv.sweep`, `fv.compare`), and the largest batch that fits on one H100 (`fv.max_batch`).
#
# Nothing here allocates real memory: every tensor is a *fake* tensor (shape, dtype, device and storage, no data), and fakeviz records each aten op the step dispatches, with the bytes it makes and frees.

# %%
import pandas as pd
import torch

import fakeviz as fv
from fakeviz import models

pd.set_option("display.width", 140)
GiB = 2**30


def gib(nbytes):
    """Bytes as GiB, rounded for reading (the tables keep exact bytes where it matters)."""
    return round(nbytes / GiB, 2)


# %% [markdown]
# ## 1. One training step, recorded
#
# We build the published Llama-3.1-8B configuration from fakeviz's catalog (no download, no weights) with **two** decoder layers instead of 32 (`num_hidden_layers=2`): every width is the real one (hidden size 4096, vocabulary 128,256), so the embedding, the output head and each layer are exactly as large as in the real model, but the step records in about a second. Section 4 goes back to the full depth.
#
# The block is ordinary PyTorch training code. `fv.record(device="cuda:0")` makes tensors created inside it fake and puts them on `cuda:0`, a GPU this machine does not have: fakeviz answers for it.

# %%
with fv.record(device="cuda:0") as trace:
    model = models.build("meta-llama/Llama-3.1-8B", num_hidden_layers=2)  # bf16, as published
    ids = torch.randint(0, model.config.vocab_size, (1, 512))  # batch 1, 512 tokens
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    opt.step()

print(trace, "ops per phase:", trace.phase_counts())

# %% [markdown]
# Every memory figure below is a multiple of one number: the bytes of the parameters, `P`. Let us count it (the two layers, the embedding and the untied output head, each 128,256 x 4096):

# %%
n_params = sum(p.numel() for p in model.parameters())
P = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"{n_params:,} parameters in {model.dtype}: P = {P:,} bytes ({gib(P)} GiB)")

# %% [markdown]
# ## 2. The memory timeline, by phase and category
#
# `trace.memory()` has one row per recorded op and device: the live bytes of each category after that op (*Parameter*, *Gradient*, *Optimizer state*, *Activation* (tensors autograd saved for the backward pass), *Temporary* (everything else the step makes and frees), ...), the `total`, and on a cuda device what PyTorch's caching allocator would have `allocated` and `reserved`. The largest value of each category in each phase summarises the step:

# %%
mem = trace.memory(device="cuda:0")
cats = ["Parameter", "Gradient", "Optimizer state", "Activation", "Temporary", "total"]
by_phase = mem.groupby("phase", observed=True)[cats].max()
by_phase.loc[["init", "forward", "backward", "optimizer"]].map(gib)  # GiB

# %% [markdown]
# Read it row by row:
#
# * **init** (building the model): the parameters appear, 2.77 GiB.
# * **forward**: activations accumulate as each layer saves what its backward will need. The largest single one is at the loss: the log-softmax of 512 positions x 128,256 vocabulary logits, in fp32 (0.24 GiB), saved for the backward pass; the logits themselves (bf16, then an fp32 copy for the loss) are among the temporaries.
# * **backward**: activations are released as their gradients are computed, while the gradients (one per parameter, same shape and dtype) grow to `P`.
# * **optimizer**: AdamW makes its state at the first `step()`: `exp_avg` and `exp_avg_sq` for every parameter, in the parameter's dtype (bf16 here), so `2P`. The total jumps.
#
# The explorer shows the same record interactively: the layer tree, the peak bars, the memory timeline (live bytes by category against the op number, phases shaded, the peak marked; hover for the op, the module and the line), the ops table and the alias graph. A saved notebook keeps its static summary:

# %%
trace.explore("H100")

# %% [markdown]
# ## 3. Where the peak is, and why
#
# `trace.peak()` gives, per device, the highest total, the op that reached it (the first one if it is reached again), its module and source line, and the bytes of each category alive at that moment:

# %%
pk = trace.peak()["cuda:0"]
print(f"peak {pk.bytes:,} bytes ({gib(pk.bytes)} GiB) in the {pk.phase} phase at op {pk.seq}: {pk.op}")
for category, nbytes in pk.by_category.items():
    if nbytes:
        print(f"  {category:16s} {nbytes:>16,}  = {nbytes / P:.3f} P")

# %% [markdown]
# The peak is not in the forward or backward pass at all: it is inside `opt.step()`, at `aten._foreach_sqrt`. On a GPU, PyTorch's AdamW uses the *multi-tensor* (`foreach`) kernels: instead of a Python loop over parameters it computes `exp_avg_sq.sqrt()` for **all** parameters in one call, which makes a temporary list of tensors as large as all the parameters together. At that moment the device holds
#
# | | bytes |
# |---|---|
# | parameters | `P` |
# | gradients (not freed until `zero_grad`) | `P` |
# | AdamW state: `exp_avg`, `exp_avg_sq` | `2P` |
# | the `sqrt` temporaries | `P` |
# | **total** | **`5P`** |
#
# and no activations: the backward pass freed them all. (The few bytes above `P` in *Temporary* are AdamW's scalar bookkeeping; its `step` counters live on the CPU, as PyTorch keeps them unless `capturable=True`.) The largest tensors alive at the peak say the same: the embedding and head weights (1 GiB each), their gradients, their two AdamW buffers and their `sqrt` temporaries:

# %%
top = pk.top[["nbytes", "category", "name", "op", "module"]].copy()
top["MiB"] = top.pop("nbytes") / 2**20
top

# %% [markdown]
# So for this step the rule of thumb is *5 bytes of GPU memory per byte of bf16 weights* at the optimizer step, and whatever the activations add at the start of the backward pass. Which of the two is larger depends on the batch, the sequence length and the depth, which is what the next sections explore.
#
# ## 4. What-ifs side by side: checkpointing and dtype, at full depth
#
# `fv.sweep` runs one recording per combination of its axes and returns a table. It builds the fake model once per dtype and re-runs only the step, so here the **full 32-layer Llama-3.1-8B** is affordable. A training point records the *steady-state* step: AdamW's state already exists when the forward pass starts, as from the second step of a real run on (the first step, as above, creates it only at `step()`).
#
# Two axes: `checkpointing` (activation checkpointing of the decoder layers: each layer keeps only its input and recomputes the rest during backward) and `dtype` (bf16 as published, or fp32).

# %%
df = fv.sweep(
    "meta-llama/Llama-3.1-8B", gpus="H100", train=True, batch=1, seq=2048,
    checkpointing=[False, True], dtype=["bf16", "fp32"], progress=False,
)
cols = ["cuda:0 weights", "cuda:0 gradients", "cuda:0 optimizer", "cuda:0 activations",
        "cuda:0 temporaries", "cuda:0 peak"]
table = df[["dtype", "checkpointing"]].copy()
for c in cols:
    table[c.removeprefix("cuda:0 ")] = df[c].map(gib)
table["fits"] = df["fits"]
table  # GiB at each point's peak

# %% [markdown]
# A note on the `peak` column: on cuda devices it is what PyTorch's caching allocator would *reserve* over the step on a GPU with unlimited memory (it keeps freed blocks cached for reuse, so it holds more than the live tensors). It can exceed the capacity while the step still fits, as in the first row: on a real 80 GB card, when a request finds no free block, the allocator first releases its cached blocks and retries. `fits` runs fakeviz's model of that allocator with the GPU's real capacity (79.65 GiB for an H100), so it is the figure to trust; a peak above the capacity means the step fits only thanks to that release and retry.
#
# **dtype.** In fp32 every figure doubles: 8.03 billion parameters x (4 + 4 + 8) bytes is 128 GB of weights, gradients and AdamW state before a single activation, far above the H100's 80 GB. In bf16 the same is 64 GB, and the step fits.
#
# **checkpointing.** The *activations* column is 0 in every row: at full depth and batch 1 the peak is again the optimizer step (`5P`), where no activation is alive. Checkpointing does shrink the activations, but that is visible only when we look at their own maximum over the step, not at the peak:

# %%
rows = []
for p in df.attrs["plans"]:
    m = p.trace.memory(allocator=False)
    peak = p.trace.peak()["cuda:0"]
    rows.append({
        "dtype": p.settings["dtype"], "checkpointing": p.settings["checkpointing"],
        "max activations": int(m["Activation"].max()), "(GiB)": gib(m["Activation"].max()),
        "peak (live bytes)": peak.bytes,
        "peak phase": peak.phase, "peak op": peak.op,
    })
acts = pd.DataFrame(rows)
acts

# %% [markdown]
# With checkpointing the activations saved across the 32 layers drop by almost an order of magnitude (each layer keeps its 2048 x 4096 input; the rest is what is computed outside the checkpointed layers: the head's logits and the loss). The live peak does not change at all, because it is set where no activation exists. The lesson: look at *where* the peak is before choosing a remedy. Checkpointing buys room for larger batches (section 5); it cannot shrink the optimizer step.
#
# `fv.compare` puts runs side by side on one byte scale: a table (the bytes by category at each run's peak) and, with a live kernel, the stacked bars and the timelines of the four runs:

# %%
labels = [f"{d} {'ckpt' if c else 'no ckpt'}" for d, c in zip(df["dtype"], df["checkpointing"])]
comparison = fv.compare(df, labels=labels)
t = comparison.table
t[["run", "Parameter", "Gradient", "Optimizer state", "Temporary", "total", "capacity"]].set_index("run").map(gib)

# %%
print(repr(comparison))  # its text summary
comparison  # with a live kernel: the stacked bars and the timelines, on one scale

# %% [markdown]
# ## 5. The largest batch that fits
#
# `fv.max_batch` answers "how many sequences of 2048 tokens per step on one H100?" by recording the step at batch 1, 2, 4, ... until one does not fit, then bisecting between the last that fits and the first that does not: a handful of recordings. It returns the answer, the plan at it, and the plan one above, whose `first_oom` says which op would run out of memory first.

# %%
plain = fv.max_batch("meta-llama/Llama-3.1-8B", gpus="H100", seq=2048, train=True)
ckpt = fv.max_batch("meta-llama/Llama-3.1-8B", gpus="H100", seq=2048, train=True, checkpointing=True)
for name, r in [("without checkpointing", plain), ("with checkpointing", ckpt)]:
    print(f"{name}: largest batch {r.value} ({r.recordings} recordings, tried {r.tried})")
    oom = r.failing.first_oom
    print(f"  batch {r.value + 1} fails in {oom['phase']} at op {oom['seq']:,} {oom['op']} "
          f"in {oom['module']}, with {gib(oom['live'])} GiB live")

# %% [markdown]
# Now the batch is large enough for the activations to matter, and the two failures are different:
#
# * **Without checkpointing** the next batch runs out of memory *in the forward pass*, in a late decoder layer's MLP: every layer's saved activations pile up on top of `4P` of weights, gradients and state (in the steady state the AdamW state is alive throughout).
# * **With checkpointing** the layers keep only their inputs, so the batch can grow about four times larger, until the step fails at the *loss*: `_log_softmax_backward_data` needs the logits, their fp32 log-softmax and its gradient, each batch x 2048 x 128,256 elements.
#
# The plan at the answer shows the bytes by kind at its peak:

# %%
peaks = ckpt.plan.peaks.set_index("device")
peaks[["weights", "gradients", "optimizer", "kv_cache", "activations", "temporaries", "peak", "judged",
       "capacity", "headroom"]].map(gib)  # GiB

# %% [markdown]
# ## Exercises
#
# 1. Record the section 1 step again with `torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)`. Where is the peak now, and how many bytes of *Temporary* are alive there? Why?
# 2. Add a second training step to the section 1 block (`opt.zero_grad(set_to_none=True)`, then forward, backward and step again). Which phase of the second step holds the AdamW state, and does the peak move?
# 3. Sweep `seq=[1024, 2048, 4096]` at batch 4 with and without checkpointing. At which sequence length does the peak leave the optimizer step and move to the backward pass?
# 4. Use `fv.max_seq` for the longest sequence at batch 1 on one H100, with and without checkpointing. Which op fails first above it?
# 5. Try `gpus="A100 40GB"` in `fv.max_batch`. Does Llama-3.1-8B train in bf16 with AdamW on it at all? Compute `5P` by hand and compare.
