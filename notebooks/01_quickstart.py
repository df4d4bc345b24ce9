# Tutorial 01: quickstart: the classic fake-tensor example (Blenderbot under `fake_mode()`), then `%%fake`, then the
# explorer.
#
# `python notebooks/build.py 01 --execute` writes `notebooks/01_quickstart.ipynb` from these cells and runs it.
# `tests/notebook/test_tutorial_01.py` checks what it teaches.

# %% [markdown]
# # 01 · Quickstart: a model you never allocate
#
# A *fake tensor* is a PyTorch tensor with everything but its data: shape, dtype, strides, device and which storage it lives in. Every PyTorch operator still runs on it (through its meta kernel), so whole models build, run forward and backward, and take optimizer steps, while the machine allocates nothing for them.
#
# In this notebook you will learn how to:
#
# 1. build a published model under `fv.fake_mode()` (the classic example, Blenderbot) and read its parameters' shapes, dtypes and devices, with no data behind them;
# 2. check that the shapes a fake run gives are the ones a real run gives;
# 3. record a whole notebook cell with `%%fake`, on a GPU this machine does not have, and read the recorded ops, the memory peak and a fits / does-not-fit verdict;
# 4. look at the record in the **explorer** (layer tree, memory bars, timeline, alias graph, ops table), in the notebook and as an offline HTML file.
#
# Everything here runs on a laptop CPU in well under a minute.

# %%
import torch
from transformers import BlenderbotForConditionalGeneration

import fakeviz as fv
from fakeviz import models

# %% [markdown]
# ## The classic example: Blenderbot under `fake_mode()`
#
# `models.config("facebook/blenderbot-400M-distill")` returns the model's published `config.json` as a transformers config. fakeviz ships the configs of 36 published models (`models.catalog()` lists them), so nothing is downloaded and no weights are needed. Inside `with fv.fake_mode():` every tensor that is created is fake, so `BlenderbotForConditionalGeneration(cfg)` runs its ordinary `__init__` (every `nn.Linear`, every `normal_` initialisation) and returns a normal `nn.Module` whose parameters take no memory.

# %%
cfg = models.config("facebook/blenderbot-400M-distill")   # the published config.json, shipped with fakeviz
with fv.fake_mode():
    model = BlenderbotForConditionalGeneration(cfg)

n_params = sum(p.numel() for p in model.parameters())
print(f"parameters: {n_params:,}")
print(f"as float32: {n_params * 4 / 2**30:.2f} GiB, none of it allocated")
published = models.resolve("facebook/blenderbot-400M-distill").parameters
print(f"published:  {published:,} (the hub page rounds to 1M)")

# %% [markdown]
# The count is the one the model's hub page publishes (365M: the "400M" in the name is looser), and it is exact: `parameters()` yields a tied weight once, and Blenderbot ties its input embedding to its output projection, as the real model does.
#
# A parameter looks like any other: it has a shape, a dtype and a device. `fv.is_fake` tells it apart, and its repr shows `...` where the values would be. Its storage reports the bytes a real tensor would need (41 MB here), and tied weights share one storage, so fakeviz can count memory and aliasing exactly without ever holding the bytes.

# %%
w = model.model.shared.weight
print("shape", tuple(w.shape), "| dtype", w.dtype, "| device", w.device, "| fake:", fv.is_fake(w))
print("storage bytes:", f"{w.untyped_storage().nbytes():,}")
print("lm_head tied to the embedding:", model.lm_head.weight is w)
w

# %% [markdown]
# ### Run it, on a GPU you do not have
#
# `fv.fake_mode(device="cuda:0")` also makes `cuda:0` the default device. This machine has no GPU (and may have a CPU-only PyTorch): fakeviz registers a data-less CUDA device, so the model is built *on* `cuda:0` and the forward runs there, exactly as your code would on a real GPU, device checks included. Inside the block `torch.cuda` answers as an H100 would.

# %%
with fv.fake_mode(device="cuda:0"):
    model = BlenderbotForConditionalGeneration(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    out = model(input_ids=ids, decoder_input_ids=ids[:, :8])
    print("torch.cuda sees:", torch.cuda.get_device_name())
for name in ("logits", "encoder_last_hidden_state"):
    t = out[name]
    print(f"fake {name}: {tuple(t.shape)} {t.dtype} {t.device}")

# %% [markdown]
# Are these the shapes a real run would give? The same code on real tensors, on the CPU, with one encoder and one decoder layer instead of 2 and 12 (the output shapes do not depend on depth, and a real full-size model would take 1.4 GB): the logits are `[batch, decoder tokens, vocabulary]` and the encoder's states `[batch, tokens, d_model]`, the same as above.

# %%
small = models.config("facebook/blenderbot-400M-distill", encoder_layers=1, decoder_layers=1)
real = BlenderbotForConditionalGeneration(small).eval()
ids = torch.randint(0, cfg.vocab_size, (2, 32))
with torch.no_grad():
    ref = real(input_ids=ids, decoder_input_ids=ids[:, :8])
for name in ("logits", "encoder_last_hidden_state"):
    t = ref[name]
    print(f"real {name}: {tuple(t.shape)} {t.dtype} {t.device} (fake: {fv.is_fake(t)})")
del real, ref

# %% [markdown]
# ## `%%fake`: record a whole cell
#
# `fake_mode()` gives you fake tensors; `fv.record()` also records every aten op they go through, with its output's shape, dtype, device and storage, and the module and line of your code that ran it. In a notebook, the `%%fake` cell magic does both for a whole cell. Load it once:

# %%
# %load_ext fakeviz

# %% [markdown]
# The cell below builds the same Blenderbot (this time with `models.build`, which builds the catalog entry inside the cell's recording) and trains on one batch of 4 x 64 tokens: forward with labels, then backward. Its options:
#
# * `--device cuda:0`: the default device inside the cell (fake, so no GPU is needed);
# * `--gpu T4`: judge the memory against a T4 (16 GB; `--capacity 24GB` takes a size instead);
# * `-o trace`: keep the recorded `Trace` in the variable `trace` (the default name is `_fake`).
#
# The cell's result is the trace, shown as a summary (the verdict, each device's peak by memory category, the largest modules) followed by the interactive explorer when the kernel is live. The variables the cell made (`model`, `batch`, `loss`) stay in the notebook as fake objects.

# %%
# %%fake --device cuda:0 --gpu T4 -o trace
model = models.build("facebook/blenderbot-400M-distill")
batch = models.inputs(model, batch=4, seq=64)
loss = model(**batch).loss
loss.backward()

# %% [markdown]
# The trace is a record you can query. `num_ops` counts every aten op (the parameter initialisation during `__init__` is the `init` phase); `peak()` says, per device, when memory peaked, which op and module were running, and what was alive, by category.
#
# Look at the categories at the peak: the parameters (1.36 GiB: 364.8M float32 values) and their gradients (the same again). The peak is at the very end of the backward, when the last gradient, the shared embedding's, is accumulated: by then the saved activations have been freed, which is why `Activation` is zero at the peak even though the forward saved 230 MiB of them.

# %%
print(f"ops: {trace.num_ops:,}", trace.phase_counts())
peak = trace.peak()["cuda:0"]
print(f"peak on cuda:0: {peak.bytes:,} bytes, {peak.phase} phase, {peak.op} in {peak.module}")
for category, nbytes in peak.by_category.items():
    if nbytes:
        print(f"  {category:12s} {nbytes / 2**20:10,.1f} MiB")
print(trace.verdict("T4")["text"])

# %% [markdown]
# The op log is the record itself, one line per op, in the form of PyTorch's logging tensor: `$N` names a tensor, followed by its dtype, shape and device, then the op and its arguments (`trace.ops` has the same as a DataFrame, with the module and the line of your code that ran each op). Here is the query projection of the first encoder layer's self-attention: the `[4, 64, 1280]` hidden states are viewed as 256 tokens, the weight is transposed (`t`, a view: no new memory), one `addmm` computes all 256 tokens, and a `view` and a `transpose` split the result into 32 heads of 40. Only `addmm` allocates: every other line is a view of an existing storage.

# %%
attn = trace.ops[trace.ops.module == "BlenderbotForConditionalGeneration.model.encoder.layers.0.self_attn.q_proj"]
print(trace.oplog(start=int(attn.seq.iloc[0]), limit=6))

# %% [markdown]
# ### One story across cells
#
# `%%fake` cells share one fake session: this cell takes an AdamW step on the model above. Its trace starts with everything the session still holds (parameters and gradients, marked as carried in), so its peak is the true peak at this point of the notebook. AdamW keeps two float32 states per parameter, so weights + gradients + states are 4 x 1.36 GiB before any temporary: against a 4 GB capacity (`--capacity`), the verdict says no and names the first op that would fail.

# %%
# %%fake --device cuda:0 --capacity 4GB -o step
opt = torch.optim.AdamW(model.parameters())
opt.step()

# %%
v = step.verdict("4GB")
print("fits:", v["fits"])
print(v["text"])

# %% [markdown]
# ### What fake tensors cannot do
#
# A fake tensor has no values, so code that *reads* a value computed on the GPU cannot run: here a Python `if` on the sum of a random GPU tensor. (Numbers you wrote yourself, and random draws on the CPU from the seeded generator, are known, and those reads work.) The error names the line and what to do, the partial trace is kept, and no fake mode stays active after it.

# %% tags=["raises-exception"]
# %%fake --device cuda:0 -o broken
x = torch.randn(3)
if x.sum() > 0:
    print("positive")

# %%
print("stopped at:", broken.error["op"], "| ops recorded before it:", broken.num_ops)
print("fake mode still active?", torch._guards.detect_fake_mode() is not None)
torch.ones(2) + 1  # an ordinary cell computes real tensors again

# %% [markdown]
# ## The explorer
#
# `trace.explore(capacity)` returns the explorer as a widget you can keep (a trace that is the last expression of a cell shows the same panel). It has linked views:
#
# * the **layer tree**: an icicle of the modules, repeated blocks folded (`layers.0-11 x12`), sized by parameters, bytes, activations, gradients, FLOPs or ops; click a module to drill in and see its figures;
# * **peak memory** per device, stacked by category, with the capacity line and the verdict;
# * the **memory timeline**: live bytes after every op, phases shaded, the peak marked;
# * the **ops table**, filtered by module, phase, device or op name;
# * the **alias graph**: storages, the tensors viewing them, tied names and in-place writes (here the shared embedding, tied to `lm_head`).
#
# Clicking a module filters the table, marks when it ran on the timeline and shows its share of each peak. Here the capacity is an H100's and the tree is sized by the activations each module makes. (On GitHub, or in a notebook reopened without its kernel, you see the static summary instead.)

# %%
explorer = trace.explore("H100", size_by="act_bytes")
explorer

# %% [markdown]
# The selection is a trait that syncs both ways: set it from Python and the panel follows; click in the tree and `explorer.selected_module` holds your pick.

# %%
explorer.selected_module = "BlenderbotForConditionalGeneration.model.decoder.layers.0-11"
print("selected:", explorer.selected_module)

# %% [markdown]
# `trace.to_html(path, capacity)` writes the same panel into one self-contained HTML file: it opens offline in any browser, with no kernel and no server, so you can attach it to an issue or a review.

# %%
report = trace.to_html("quickstart_explorer.html", "T4")
print(report.name, f"{report.stat().st_size / 1e6:.1f} MB")

# %% [markdown]
# Every figure of the explorer is also a DataFrame. The folded layer tree (`trace.folded_modules()`) has one row per module, with repeated blocks folded and every figure kept: parameters, bytes of parameters, activations made and saved for backward, gradients, forward and backward FLOPs. The decoder's 12 layers hold 86 % of the parameters; the 2 encoder layers run on 64 tokens while the decoder runs on 32 (`models.inputs` gives a seq2seq model half as many target tokens).

# %%
tree = trace.folded_modules()
tree.index = ["· " * depth + name for depth, name in zip(tree.depth, tree.name)]
tree.loc[tree.depth <= 4, ["class", "count", "params", "act_bytes", "act_saved_bytes", "flops_fwd", "flops_bwd"]]

# %% [markdown]
# ## Exercises
#
# 1. Build `openai-community/gpt2-xl` under `fv.fake_mode()` and check its parameter count against `models.catalog()` (the catalog's `parameters` column). Which module holds the most parameters?
# 2. Re-run the `%%fake` training cell with `--dtype bfloat16` and `models.build(..., dtype="bf16")`: how do the parameter, gradient and peak figures change? Does the AdamW step now fit in 4 GB?
# 3. Change `batch=4, seq=64` to `batch=32, seq=128` and find the smallest `--gpu` of `T4`, `L4`, `A100 40GB` on which the training cell fits.
# 4. In the explorer, size the tree by `flops_fwd` and find the module with the most forward FLOPs; check your answer in `trace.folded_modules()`.
# 5. Write the `%%fake` training cell as a plain `with fv.record(device="cuda:0", gpu="T4") as t:` block and check that `t.num_ops` and `t.peak()["cuda:0"].bytes` equal the cell's.
