# Tutorial 10: fine-tuning Llama-3.1-8B on one 24 GB GPU (issue 31).
#
# Full fine-tuning in bf16 with AdamW (does not fit), LoRA r=16 (what trains, what gradients and optimizer state
# shrink to), QLoRA (NF4 base weights with double quantization, `prepare_model_for_kbit_training`, LoRA, checkpointing
# and paged AdamW8bit: fits on an RTX 4090), the precision of each module's weights and why "QLoRA needs more than
# LoRA" is reported for small models, a sweep over quantization x optimizer, the longest batch and the step time on
# the card, and how far to trust it.
#
# `python notebooks/build.py 10 --execute` writes `notebooks/10_finetune_one_gpu.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_10.py`) check its figures against hand computations (bitsandbytes' NF4
# storage formula, LoRA's r x (in + out), AdamW's two moments, bitsandbytes' paged 8-bit state).

# %% [markdown]
# # 10 · Fine-tuning on one GPU: full, LoRA and QLoRA on a 24 GB card
#
# The question most people bring: *I have one 24 GB GPU (an RTX 4090, a 3090, an L4); can I fine-tune an 8B model on it, and how?* The usual answers are hand formulas (bytes per parameter times a factor). fakeviz answers by running the real training code, transformers, peft and bitsandbytes included, under fake tensors on a GPU you do not have, and reading the memory off the record.
#
# In this notebook you will learn:
#
# * why full fine-tuning of `meta-llama/Llama-3.1-8B` in bf16 with AdamW needs about three 24 GB cards' worth of memory, split by what the memory holds;
# * what LoRA (r=16 on every linear layer) trains, and what it shrinks: gradients and optimizer state, checked against `r x (in + out)` by hand;
# * QLoRA (NF4 base weights with double quantization, peft's `prepare_model_for_kbit_training`, LoRA, activation checkpointing, paged AdamW8bit): it fits on an RTX 4090, and the precision of each module's weights shows why some people find that *QLoRA needs more than LoRA*;
# * a sweep of precision and optimizer on one card, the largest batch that fits, and the step time;
# * how far to trust the figures: what the tests compare with real runs, and what `fidelity()` names.
#
# Nothing is downloaded: the model is built from its published config (fakeviz's catalog), its weights are fake tensors that have shapes and dtypes but no data, and bitsandbytes quantizes them with its own code on the fake GPU. Each 8B plan records a whole training step (tens of thousands of ops) and takes a few seconds to tens of seconds on a laptop CPU.

# %%
# bitsandbytes and peft (fakeviz[quant]): Binder has them; elsewhere (Colab) this installs them
import importlib.util
import subprocess
import sys

if not all(importlib.util.find_spec(m) for m in ("bitsandbytes", "peft")):
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "bitsandbytes>=0.48", "peft>=0.17"])

# %%
import logging

import pandas as pd
import torch
import transformers

import fakeviz as fv

transformers.logging.set_verbosity_error()
for logger in ("bitsandbytes", "torchao", "torch.utils._pytree"):  # notices printed at import
    logging.getLogger(logger).setLevel(logging.ERROR)
pd.set_option("display.width", 150)
pd.set_option("display.max_colwidth", 100)
NAME = "meta-llama/Llama-3.1-8B"
GPU = "4090"  # an RTX 4090 (24 GiB); "RTX 3090", "L4" or "24GB" work too
SEQ = 1024  # tokens per sequence, batch 1
GiB = 2**30


def by_category(plan):
    """The plan's peak on its GPU split by what the memory holds, in GiB (categories under 1 MiB left out)."""
    peak = plan.trace.peak()["cuda:0"]
    cats = pd.Series({k: v / GiB for k, v in peak.by_category.items() if v >= 2**20}, name="GiB at the peak")
    return cats.sort_values(ascending=False).round(2)


# %% [markdown]
# ## 1. Full fine-tuning in bf16 with AdamW
#
# `fv.plan(..., train=True)` records one steady-state training step (forward with labels, backward, `optimizer.step()`, with the optimizer's state already made, as from the second step of a real run) on the GPUs you name. `gpus="4090"` is one RTX 4090 with its published 24 GiB.

# %%
full = fv.plan(NAME, gpus=GPU, train=True, seq=SEQ, optimizer="adamw")
n_params = sum(p.numel() for p in full.module.parameters())
print(f"{n_params:,} parameters, all trainable")
print(full.fit_text)
peak = full.trace.peak()["cuda:0"]
print(f"the peak: op {peak.seq:,}, {peak.op} in the {peak.phase} phase")
by_category(full)

# %% [markdown]
# The peak is in the optimizer step, and the arithmetic is the familiar one: 8.03 billion parameters in bf16 are 15 GiB of weights, another 15 GiB of gradients, and AdamW keeps two moments per parameter in the parameters' dtype (bf16 here: 4 bytes per parameter, 30 GiB). `Temporary` is what `torch.optim.AdamW`'s multi-tensor (foreach) update allocates while it runs: one more parameter-sized buffer. Mixed precision with fp32 master weights would need more still. Even an 8-bit optimizer leaves 30 GiB of weights and gradients: full fine-tuning of an 8B model does not fit on one 24 GB card, whatever the optimizer.

# %% [markdown]
# ## 2. LoRA r=16: train small adapters, freeze the rest
#
# `lora=16` applies peft's `get_peft_model` with `LoraConfig(r=16, target_modules="all-linear")`: every linear layer of the decoder (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`) gets two small matrices, `lora_A` (r x in) and `lora_B` (out x r), and only those train. Pass a `peft.LoraConfig` for other ranks, targets or DoRA.

# %%
lora = fv.plan(NAME, gpus=GPU, train=True, seq=SEQ, lora=16, optimizer="adamw")
trainable = sum(p.numel() for p in lora.module.parameters() if p.requires_grad)
print(f"trainable {trainable:,} parameters ({trainable / n_params:.2%} of the model)")
print(lora.fit_text)
by_category(lora)

# %% [markdown]
# Where those 42 million parameters are: one decoder layer's adapters, read off the model the plan built (the shapes are the fake tensors'; Llama-3.1-8B has 32 such layers). Each adapted linear layer adds `r x (in + out)` parameters.

# %%
rows = []
for name, mod in lora.module.named_modules():
    if ".layers.0." in name and hasattr(mod, "lora_A"):
        a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        rows.append({
            "linear": name.split(".layers.0.")[1], "in": mod.in_features, "out": mod.out_features,
            "lora_A": tuple(a.shape), "lora_B": tuple(b.shape), "adapter parameters": a.numel() + b.numel(),
            "adapter dtype": str(a.dtype).removeprefix("torch."),
        })
layer0 = pd.DataFrame(rows)
print(f"{layer0['adapter parameters'].sum():,} adapter parameters per layer x 32 layers = "
      f"{32 * layer0['adapter parameters'].sum():,}")
layer0

# %% [markdown]
# The gradients and the optimizer state are now the adapters' only. peft makes the adapters in float32, so AdamW keeps two float32 moments: 8 bytes per trainable parameter. The layer tree (`trace.modules`) has both figures for the whole model (its first row):

# %%
root = lora.trace.modules.iloc[0]
print(f"gradients      {root['grad_bytes'] / GiB:.3f} GiB  ({root['grad_bytes'] / trainable:.0f} bytes per "
      f"trainable parameter)")
print(f"AdamW state    {root['opt_bytes'] / GiB:.3f} GiB  ({root['opt_bytes'] / trainable:.0f} bytes per "
      f"trainable parameter)")
print(f"weights        {root['param_bytes'] / GiB:.2f} GiB  (the frozen bf16 model and the float32 adapters)")

# %% [markdown]
# From 45 GiB of gradients and optimizer state to under half a GiB. What is left is the frozen bf16 weights (15 GiB: LoRA does not make the model smaller) and the **activations**: without checkpointing every decoder layer keeps its inputs, attention and MLP intermediates for the backward pass, 9.4 GiB at 1024 tokens. With the temporaries of the moment, the peak is 26 GiB: just too much. Activation checkpointing (`checkpointing=True`) would bring LoRA under 24 GiB at this length (section 4); the weights are the part QLoRA goes after.

# %% [markdown]
# ## 3. QLoRA: 4-bit base weights, LoRA on top
#
# The QLoRA recipe (Dettmers et al., 2023): the frozen base weights quantized to 4-bit NormalFloat (NF4) with double quantization (the per-block scales quantized too), computation in bf16, peft's `prepare_model_for_kbit_training`, LoRA on every linear layer, activation checkpointing, and a paged 8-bit AdamW. `quantization=` takes the same `BitsAndBytesConfig` you would give `from_pretrained` (or the short strings `"nf4"`, `"fp4"`, `"int8"`, `"int4"`, `"fp8"`); the weights are quantized by bitsandbytes' own code on the fake GPU.

# %%
nf4 = transformers.BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)
qlora = fv.plan(NAME, gpus=GPU, train=True, seq=SEQ, quantization=nf4, lora=16, checkpointing=True,
                optimizer="paged_adamw8bit")
del full, lora  # done with sections 1 and 2: each plan holds its whole record (tens of MB)
print(qlora.settings["quantization"], "|", qlora.settings["lora"], "|", qlora.settings["optimizer"])
print(qlora.fit_text)
by_category(qlora)

# %% [markdown]
# It fits, with room to spare. Which weights are in which precision: the layer tree has a `precision` column (the text summary and the explorer show it too). A few modules of the model:

# %%
mods = qlora.trace.modules.set_index("path")
show = [p for p in mods.index if p.endswith((
    "embed_tokens", "layers.0.self_attn.q_proj", "layers.0.self_attn.q_proj.base_layer",
    "layers.0.self_attn.q_proj.lora_A.default", "layers.0.mlp.down_proj.base_layer",
    "layers.0.input_layernorm", "model.norm", "lm_head",
))]
mods.loc[show, ["class", "precision", "param_bytes", "grad_bytes", "opt_bytes"]]

# %% [markdown]
# Each linear layer of the decoder is a bitsandbytes `Linear4bit` (`nf4+dq`: NF4 with double quantization) wrapped by peft's LoRA layer, whose adapters are float32. Its `param_bytes` is what bitsandbytes stores: the weight packed two 4-bit values per byte, plus one absmax scale per block of 64 values (with double quantization an 8-bit code per block, and a float32 scale per 256 blocks), plus the small lookup tables. Everything **not** quantized, the embeddings, the output head (`lm_head` stays unquantized as transformers leaves it) and the norms, is float32: `prepare_model_for_kbit_training` casts every parameter that is not 4/8-bit to float32 for stable training. Summed over the model by precision:

# %%
leaves = qlora.trace.modules.query("n_children == 0 and param_bytes > 0")
by_precision = (leaves.groupby("precision")["param_bytes"].sum() / GiB).round(3).rename("GiB")
by_precision

# %% [markdown]
# The float32 embeddings and head (2 x 128,256 x 4,096 values, 4 bytes each: 3.9 GiB) weigh **more than all 224 quantized linear layers together**. For an 8B model QLoRA still wins, since those linear layers are 87% of the parameters. For a small model with a large vocabulary it can lose: the embeddings are a large share of the model and they double from bf16 to float32; and the hidden states become float32 too (the float32 embedding's output, and RMSNorm multiplying its float32 weight by the normalised input), so the activations grow. This is where reports that *QLoRA needs more memory than LoRA* come from. Qwen2.5-0.5B (151,936-token vocabulary, tied embeddings) at the same settings:

# %%
small = {}  # the peaks by category, not the plans (each holds its whole record)
for label, quant in (("LoRA r=16 bf16", None), ("QLoRA nf4 r=16", "nf4")):
    small[label] = by_category(
        fv.plan("Qwen/Qwen2.5-0.5B", gpus=GPU, train=True, seq=SEQ, quantization=quant, lora=16)
    )
pd.DataFrame(small).fillna(0).loc[["Parameter", "Activation", "Temporary", "Optimizer state"]]

# %% [markdown]
# Back to the 8B model. The paged optimizer: bitsandbytes' `PagedAdamW8bit` keeps each adapter's two moments as 8-bit codes (one byte per value, plus a float32 scale per block of 256), and puts the 8-bit states of tensors of at least 100,000 values in CUDA unified memory, which the driver can move to host memory when the GPU runs short. The plan counts them on the GPU and says how much is paged:

# %%
root = qlora.trace.modules.iloc[0]
print(f"optimizer state {root['opt_bytes'] / 2**20:.1f} MiB, of it paged "
      f"{qlora.settings['paged_bytes'] / 2**20:.1f} MiB")

# %% [markdown]
# ## 4. A sweep: which combinations fit on the card
#
# `fv.sweep` runs one plan per combination of its axes and returns a table: the peak and its parts, whether it fits, and the estimated step time on the card. `quantization`, `lora` and `optimizer` are axes like `batch` or `seq`; the model is built once per quantization and re-run for each optimizer. Full fine-tuning is section 1; here LoRA r=16 with checkpointing in bf16 and in NF4 (the short string: without double quantization), with AdamW and with paged AdamW8bit. Four 8B plans: about a minute.

# %%
grid = fv.sweep(NAME, gpus=GPU, train=True, seq=SEQ, lora=16, checkpointing=True, progress=False,
                quantization=[None, "nf4"], optimizer=["adamw", "paged_adamw8bit"])
del grid.attrs["plans"]  # the table is all we read here; each plan holds its whole record
cols = ["cuda:0 peak", "cuda:0 weights", "cuda:0 optimizer", "cuda:0 activations", "cuda:0 temporaries"]
table = grid.assign(**{c: (grid[c] / GiB).round(2) for c in cols})
table = table.assign(quantization=table["quantization"].fillna("bf16"), step_s=table["step_s"].round(3))
table[["quantization", "optimizer", *cols, "fits", "step_s", "rank"]]

# %% [markdown]
# All four fit at 1024 tokens once checkpointing is on: with it, the activations are each layer's input plus one layer's intermediates during its recomputation, about 1 GiB or less. NF4 saves 7.4 GiB of weights; paged AdamW8bit saves a quarter of a GiB over AdamW, which matters little when only 42 million parameters train (it matters for full fine-tuning). The sweep ranks what fits by estimated step time: bf16 LoRA is the faster, since a 4-bit layer dequantizes its weight on every forward and backward. The 7.4 GiB NF4 frees are what buys a longer batch.

# %% [markdown]
# ## 5. How long a batch, and how long a step
#
# `fv.max_batch` finds the largest batch that fits (doubling, then bisection: one recording per try, on one build of the model), with the plan at it and the plan at the next size that fails. The QLoRA recipe of section 3 on the 4090 at 1024 tokens:

# %%
largest = fv.max_batch(NAME, gpus=GPU, train=True, seq=SEQ, quantization=nf4, lora=16, checkpointing=True,
                       optimizer="paged_adamw8bit", limit=16)
print(largest)

# %% [markdown]
# The step time is the time model of notebook 09 applied to the recorded ops, with the RTX 4090's datasheet figures (165.2 TFLOP/s dense bf16, 1,008 GB/s of GDDR6X): an estimate, and an extrapolation from the H100 the model was fitted on. `plan.speed` has the details; for the QLoRA step at batch 1:

# %%
s = qlora.speed
print(f"step {qlora.step_s:.3f} s, {qlora.tokens_per_s:,.0f} tokens/s on {s.gpu}")
print(f"at the largest batch ({largest.value}): {largest.plan.step_s:.3f} s, "
      f"{largest.plan.tokens_per_s:,.0f} tokens/s")

# %% [markdown]
# ## 6. How far to trust it
#
# What the tests compare with real runs (the real libraries on this machine's CPU, where their kernels run; `fv.record(fake=False)` records a real run the same way):
#
# * **op by op and byte by byte**: a fake record equals the real CPU record of the same code for bitsandbytes NF4 and LLM.int8 layers, QLoRA steps over NF4 and LLM.int8 weights (bitsandbytes' own quantization, `prepare_model_for_kbit_training`, LoRA), LoRA and DoRA steps, and torchao int8 and int4 weight-only layers (`tests/engine/test_bnb.py`, `tests/frontends/test_finetune_plan.py`, `tests/engine/test_torchao.py`);
# * **storage formulas**: NF4 and FP4 bytes, with and without double quantization, equal bitsandbytes' formula on every shape tried; the 8-bit optimizers' state equals bitsandbytes' blockwise layout;
# * **on a real GPU**: a QLoRA step of a 4-layer Llama-3.1-8B on an H100 (`benchmarks/qlora_gpu.py`), fake peak against `torch.cuda.max_memory_allocated`: **0.995** at 2048 tokens and **0.999** at 512.
#
# Where fakeviz cannot be exact it says so: `trace.fidelity()` lists, among others, the assumptions a record rests on. The QLoRA step's, one line per kind (the plan records the step after the optimizer made its state, so the paged allocations, which `fidelity()` names in a record that makes them, are not among these; the plan's text above says how much is paged):

# %%
assumptions = qlora.trace.fidelity()["assumptions"]
kinds = assumptions.groupby("op")["assumption"].first()
print(f"{len(assumptions)} ops rest on an assumption; the kinds ({len(kinds)}):")
for op, text in kinds.items():
    print(f"- {op}: {text}")

# %% [markdown]
# What that means in practice:
#
# * **Kernels recorded through fake rules.** bitsandbytes' CUDA kernels do not run here; their fake implementations give the real kernels' output shapes and the workspace they allocate (the dequantized weight inside `gemm_4bit`), measured against the real GPU as above.
# * **Paged memory.** The paged optimizer state is counted on the GPU as if resident. On a real card under memory pressure the driver moves pages to host memory, which `max_memory_allocated` does not see: a real run can survive a little over the line, more slowly.
# * **What is not in the record**: the CUDA context (a few hundred MiB on a real card, outside PyTorch's allocator: `max_memory_allocated` does not count it either), the data loader, other processes on the GPU, and a display using the card.
# * **Step times** are estimates for eager PyTorch, fitted on an H100 (notebook 09); a consumer card's clocks under sustained load can be lower.
#
# Use the verdicts with a margin of a GiB or so on a 24 GB card, and the step times to compare configurations rather than as a promise.

# %% [markdown]
# ## Exercises
#
# 1. Re-run the QLoRA plan with `gpus="RTX 3090"` and `gpus="L4"` (both 24 GB class). Does the verdict change? Which card is faster, and why (compare their bf16 FLOP/s and memory bandwidth)?
# 2. Pass `lora=peft.LoraConfig(r=64, target_modules="all-linear")` (the QLoRA paper's rank for its largest models). By how much do the trainable parameters and the optimizer state grow? Check the count against `r x (in + out)` per linear layer.
# 3. Use `quantization="nf4"` (no double quantization) in section 3. How many bytes per block of 64 weights does double quantization save, and how much is that over the whole model?
# 4. Try `optimizer="adamw8bit"` for **full** fine-tuning (no `lora`) at `seq=1024`. How much does the 8-bit state save over AdamW, and why does it still not fit on one 4090?
# 5. Use `fv.max_seq` instead of `fv.max_batch`: the longest single sequence the QLoRA recipe trains on the 4090.
