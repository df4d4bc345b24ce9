# Tutorial 02: a 70B model on a laptop: Llama-3.1-70B built fake, its layer tree, parameters and bytes, a forward, the
# model placed on 2 H100s, and the verdict for inference and for training.
#
# `python notebooks/build.py 02 --execute` writes `notebooks/02_70b_on_a_laptop.ipynb` from these cells and runs it.
# `tests/notebook/test_tutorial_02.py` checks what it teaches.

# %% [markdown]
# # 02 · A 70B model on a laptop
#
# Llama 3.1 70B has 70.6 billion parameters: 141 GB in bfloat16, more than any single GPU holds and ten times a laptop's memory. Under fake tensors it is an ordinary `nn.Module` that builds in about a second and runs forward in a few, so you can look at it, measure it and place it before you rent a single GPU.
#
# In this notebook you will learn how to:
#
# 1. build the published 70B model from its `config.json` alone, and count its parameters and bytes (and check them by hand from the config);
# 2. read its **layer tree**, with the 80 identical decoder layers folded into one row;
# 3. record a forward pass and read what the memory peak is made of (weights, KV cache, activations, temporaries), and why `torch.no_grad()` matters for inference;
# 4. place the model on **2 H100s** with `fv.plan`, read the per-device bars, and answer *does it fit?* for inference, and for training (it does not: you will see why).

# %%
import resource
import time

import torch

import fakeviz as fv
from fakeviz import models

# %% [markdown]
# ## The model, from its config
#
# The catalog ships the published `config.json` of each model with its published parameter total (and where that total comes from). Llama 3.1 is gated on the hub; here that does not matter, since no weights are read.

# %%
catalog = models.catalog().set_index("name")
catalog.loc["meta-llama/Llama-3.1-70B", ["architecture", "parameters", "layers", "context_length", "dtype", "gated"]]

# %% [markdown]
# `models.build` instantiates `LlamaForCausalLM` from that config, in bfloat16 as published, on a fake `cuda:0`. Every `nn.Linear` of every layer is created and initialised, just as with real tensors, only without data. Look at the time it takes and at this Python process's memory (its peak resident size, imports included) next to the 131 GiB the parameters describe.

# %%
t0 = time.perf_counter()
model = models.build("meta-llama/Llama-3.1-70B", device="cuda:0")
print(f"built in {time.perf_counter() - t0:.1f} s")

n_params = sum(p.numel() for p in model.parameters())
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
p = next(model.parameters())
print(f"parameters: {n_params:,}")
print(f"dtype {p.dtype}, device {p.device}, fake: {fv.is_fake(p)}")
print(f"parameter bytes: {param_bytes:,} ({param_bytes / 2**30:.1f} GiB)")
print(f"this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB peak RSS")

# %% [markdown]
# ### Where 70,553,706,496 comes from
#
# Each decoder layer has grouped-query attention (64 query heads, 8 key/value heads of 128 dims: `q_proj` and `o_proj` are 8192 x 8192, `k_proj` and `v_proj` only 8192 x 1024), a gated MLP (`gate_proj`, `up_proj` and `down_proj`, 8192 x 28672 each, no biases) and two RMSNorm weights. The embedding and the output head are both 128256 x 8192 and are *not* tied in the 70B model (the 1B and 3B Llama 3.2 tie them), so they count twice. With the config's numbers:

# %%
c = model.config
attention = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
mlp = 3 * c.hidden_size * c.intermediate_size
per_layer = attention + mlp + 2 * c.hidden_size
embedding = c.vocab_size * c.hidden_size
by_hand = c.num_hidden_layers * per_layer + 2 * embedding + c.hidden_size  # + the final norm
print(f"per layer: {per_layer:,} (attention {attention:,}, MLP {mlp:,})")
print(f"{c.num_hidden_layers} layers: {c.num_hidden_layers * per_layer:,}, embedding and head: {2 * embedding:,}")
print(f"by hand: {by_hand:,}  (the model: {n_params:,}, equal: {by_hand == n_params})")

# %% [markdown]
# 80 % of the parameters are in the MLPs (each layer's MLP is 705M parameters, its attention 151M): that is where most of the compute and most of the weight memory go.
#
# ## A forward pass, recorded
#
# `fv.record(device="cuda:0", gpu="H100")` records every op of the block on a fake `cuda:0`, with the verdict judged against an H100 (81,559 MiB, what an "80 GB" H100 reports). The model is built inside the block, so the record holds it from its first tensor, and the forward runs one sequence of 512 tokens under `torch.no_grad()`, as inference does. The trace's summary (shown as the cell's result) says at once what a single H100 makes of it.
#
# (Why build it again rather than record the `model` of the cell above? In this version of fakeviz, a model built *before* the `record` block is recorded with a flaw: each view of its weights, such as the transposed weight every `nn.Linear` multiplies by, is counted as new memory, which inflates the peak by up to the size of the weights. Building inside the block, or with `fv.plan` below, avoids it.)

# %%
with fv.record(device="cuda:0", gpu="H100") as trace:
    model = models.build("meta-llama/Llama-3.1-70B")
    inputs = models.inputs(model, batch=1, seq=512, labels=False)
    with torch.no_grad():
        out = model(**inputs)
trace

# %% [markdown]
# The weights alone (131.4 GiB) are more than the 79.6 GiB an H100 has, so a real H100 would not even finish building the model: the verdict names the first op that would fail, an `empty` in the `__init__` of a layer about 60 % of the way through, with 79.6 GiB already live. No batch size or sequence length changes that. What else is alive at the peak? `trace.peak()` says which op set it (the output head's matmul, which makes the logits) and splits the live bytes by category:
#
# * **Parameter**: the 141,107,412,992 bytes counted above;
# * **KV cache**: transformers keeps each layer's keys and values for the next token (`use_cache` is on by default): 2 (K and V) x 80 layers x 8 heads x 128 dims x 512 tokens x 2 bytes = 160 MiB;
# * **Temporary**: intermediate results alive at that moment, here mostly the logits, 512 x 128256 values.

# %%
peak = trace.peak()["cuda:0"]
print(f"peak at op {peak.seq:,} {peak.op} in {peak.module} ({peak.phase})")
for category, nbytes in peak.by_category.items():
    if nbytes:
        print(f"  {category:10s} {nbytes:>18,} bytes  {nbytes / 2**30:8.2f} GiB")
print(f"peak, live tensors: {peak.bytes:,} bytes; reserved by the caching allocator: {peak.reserved:,}")

# %% [markdown]
# ### The layer tree
#
# `trace.modules` has one row per module of the run (over a thousand here); `trace.folded_modules()` folds the numbered blocks that have the same structure into one row (`0-79 x80`) and keeps every figure as the sum over the blocks (a block that differs would be flagged in the `odd` column). `act_bytes` is what each module's ops produced during the forward: with `no_grad` none of it is kept, so it is transient.

# %%
print(f"{len(trace.modules)} modules, {len(trace.folded_modules())} rows folded")
tree = trace.folded_modules()
tree.index = ["· " * depth + name for depth, name in zip(tree.depth, tree.name)]
tree.loc[tree.depth <= 5, ["class", "count", "params", "param_bytes", "act_bytes", "flops_fwd"]]

# %% [markdown]
# The FLOPs follow the rule of thumb for a forward pass: one multiply and one add per weight per token, so 2 x parameters x tokens, leaving out the embedding (a lookup, no arithmetic); attention's two matmuls over the 512 x 512 scores add the rest.

# %%
flops = trace.flops()["forward"]
rule = 2 * (n_params - embedding) * 512
print(f"forward: {flops / 1e12:.2f} TFLOP, 2 x non-embedding parameters x 512 tokens: {rule / 1e12:.2f} TFLOP")

# %% [markdown]
# ### Why `no_grad` matters
#
# Without `torch.no_grad()`, autograd saves what the backward would need, the inputs of every matmul and every norm, even if no backward ever runs. The same forward without it:

# %%
with fv.record(device="cuda:0") as with_grad:
    model = models.build("meta-llama/Llama-3.1-70B")
    model(**models.inputs(model, batch=1, seq=512, labels=False))
for name, t in [("no_grad", trace), ("with grad", with_grad)]:
    by = t.peak()["cuda:0"].by_category
    print(f"{name:10s} Activation at the peak: {by['Activation'] / 2**30:6.2f} GiB, peak {t.peak()['cuda:0'].bytes / 2**30:6.1f} GiB")

# %% [markdown]
# About 15 GiB of saved activations for one 512-token sequence: that grows linearly with batch and sequence length, and it is memory an inference server would waste. (Recording both runs took a few seconds and no memory: the figures come from the record, not from a GPU.)
#
# ## Placing it on 2 H100s
#
# The weights need at least two 80 GB GPUs. `fv.plan(model, gpus="2xH100")` builds the model, computes a device map (the dict `from_pretrained(device_map=...)` takes), moves each decoder layer and the embedding, norm and head to its GPU, hooks the layers so their inputs follow them across GPUs (as accelerate's hooks do), and records the step as placed. The default map, `"balanced"`, evens the measured peaks (weights, KV cache, activations and temporaries together); `"auto"` and `"sequential"` are accelerate's own maps. The run here is the same inference forward: batch 1, 512 tokens.

# %%
plan = fv.plan("meta-llama/Llama-3.1-70B", gpus="2xH100", seq=512)
plan

# %% [markdown]
# Which modules went where: the embedding and the first 40 layers on `cuda:0`, the last 40 layers, the final norm, the rotary embedding (no parameters, two small buffers of inverse frequencies) and the head on `cuda:1`.
#
# Every tensor that crosses GPUs is a recorded copy, and `plan.transfers` sums them per direction. To `cuda:1` go the hidden states (8 MiB: 512 x 8192 x 2 bytes), once into the rotary embedding (which only reads their dtype) and once into layer 40, plus the int64 positions each layer there gets; back to `cuda:0` go the rotary embedding's cos and sin tables, to each of the 40 layers there: 80 copies of 512 x 128 x 2 bytes. A few MiB per forward: placing whole layers moves little data (but only one GPU computes at a time).

# %%
for dev in ("cuda:0", "cuda:1"):
    names = [n for n, d in plan.device_map.items() if d == dev]
    layers = [n for n in names if n.startswith("model.layers.")]
    others = [n for n in names if not n.startswith("model.layers.")]
    print(f"{dev}: {len(layers)} decoder layers ({layers[0]} ... {layers[-1]}) + {others}")
plan.transfers

# %% [markdown]
# ### The per-device bars
#
# `plan.peaks` is one row per GPU: the bytes alive at that GPU's peak, by kind, then `peak` (what the caching allocator has reserved at that moment), `judged` (the bytes the verdict judged: the same, or less when the run fits only by freeing cached blocks under the GPU's capacity), the capacity, the headroom (capacity minus judged), whether it fits and the verdict's words for that GPU. The numbers in GiB:

# %%
peaks = plan.peaks.set_index("device")
(peaks.select_dtypes("number") / 2**30).round(2).assign(fits=peaks.fits)


# %% [markdown]
# The same as bars (each `█` is weights, `▒` everything else alive at the peak, `|` the capacity). `plan.explore()` shows them interactively, with the timeline of each GPU and the layer tree, in the explorer of notebook 01.

# %%
def bars(peaks, width=60):
    scale = max(peaks.peak.max(), peaks.capacity.max()) / width
    for dev, row in peaks.iterrows():
        w, rest = round(row.weights / scale), round((row.peak - row.weights) / scale)
        line = list("█" * w + "▒" * rest + " " * max(width - w - rest, 0))
        cap = min(round(row.capacity / scale), len(line) - 1)
        line[cap] = "|"
        print(f"{dev} {''.join(line)} {row.peak / 2**30:6.1f} GiB of {row.capacity / 2**30:.1f}")

bars(peaks)

# %% [markdown]
# The `weights` column is exactly the bytes of the parameters (and buffers) the map put on that GPU, as the plan's placed model shows:

# %%
placed = plan.module
for dev in ("cuda:0", "cuda:1"):
    params = sum(p.numel() * p.element_size() for p in placed.parameters() if str(p.device) == dev)
    buffers = sum(b.numel() * b.element_size() for b in placed.buffers() if str(b.device) == dev)
    print(f"{dev}: weights {peaks.loc[dev, 'weights']:,} bytes = parameters {params:,} + buffers {buffers:,}:",
          peaks.loc[dev, "weights"] == params + buffers)

# %% [markdown]
# ### Does it fit on 2 H100s?
#
# For inference, yes: each GPU holds half the weights (65.7 GiB), the KV cache of its 40 layers (80 MiB) and about 120 MiB of temporaries: 66 GiB reserved of 79.6. The 13.6 GiB of headroom per GPU is what longer prompts, larger batches and the KV cache of generated tokens can use (`fv.max_seq` and `fv.max_batch` search for the limit).

# %%
print("fits:", plan.fits)
print(plan.text)

# %% [markdown]
# ### And training?
#
# A training step keeps much more than the weights. For every bfloat16 parameter there is its gradient (same size) and AdamW's two moment estimates (`exp_avg`, `exp_avg_sq`, same dtype as the parameter here): 4 x 65.7 = 263 GiB per GPU before a single activation, more than three times an H100. `train=True` records one steady-state AdamW step (the optimizer state already exists, as from the second step of a real run on):

# %%
train = fv.plan("meta-llama/Llama-3.1-70B", gpus="2xH100", seq=512, train=True)
print("fits:", train.fits)
train_peaks = train.peaks.set_index("device")
(train_peaks.select_dtypes("number") / 2**30).round(1).assign(fits=train_peaks.fits)

# %%
bars(train_peaks)
print(train.first_oom["where"])

# %% [markdown]
# Each GPU would need about 334 GiB. The peak is in the optimizer step, where AdamW's multi-tensor (`foreach`) kernels make one more parameter-sized temporary. The first failure is before the first op: the weights and optimizer state that exist before the step (197.1 GiB per GPU: the verdict's text calls all of it "the weights") do not fit by themselves.
#
# So fine-tuning a 70B model needs another plan: shard weights, gradients and optimizer state over many more GPUs (FSDP, notebook 08), keep fp32 master weights only where needed, or train small adapters (LoRA) on top of frozen weights. Notebook 03 measures training memory step by step, and what activation checkpointing and dtypes change.

# %% [markdown]
# ## Exercises
#
# 1. How many H100s does the inference forward at 512 tokens need with `device_map="sequential"` (accelerate's map: fill the first GPU, then the next)? Compare `plan.peaks` with the balanced map.
# 2. Use `fv.max_seq("meta-llama/Llama-3.1-70B", gpus="2xH100")` to find the longest prompt two H100s can take for a forward, and check that the KV cache in the plan's peaks grows as `2 x layers x kv_heads x head_dim x tokens x 2 bytes`.
# 3. Build `meta-llama/Llama-3.1-405B` and count its parameters and bytes as above. How many H100s do its weights need at the least? Check with `fv.plan(..., gpus="8xH100")`.
# 4. With `train=True`, how many H100s would the step need if it were split evenly? Estimate it from `train_peaks` first, then try `gpus="8xH100"` (per-layer placement is not sharding: look at which GPU holds the most).
# 5. Re-run the first recording without `labels=False`: the loss adds a float32 copy of the logits. Find the op that makes it in `trace.ops`.
