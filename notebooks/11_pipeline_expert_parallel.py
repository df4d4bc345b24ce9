# Tutorial 11: context, expert and pipeline parallel, per rank (issue 33).
#
# Context parallel (torch's ring attention over a 32k-token sequence split over 4 GPUs) against plain FSDP, expert
# parallel (Qwen3-30B-A3B's 128 experts over 8 GPUs, tokens moved by all-to-all) against FSDP of the experts, and
# pipeline parallel (Llama-3.1-8B in four stages under 1F1B), each a `fv.plan(..., parallel=...)` that records every
# distinct rank in torch's fake process group; what the records assume (routing) and how far to trust them.
#
# `python notebooks/build.py 11 --execute` writes `notebooks/11_pipeline_expert_parallel.ipynb` from these cells and
# runs it.
#
# The tests (`tests/notebook/test_tutorial_11.py`) check its figures against hand computations from the published
# widths.

# %% [markdown]
# # 11 · Pipeline, context and expert parallel
#
# Notebook 08 sharded a model's weights over GPUs (FSDP2) and split its matrices (tensor parallel). Large training runs use three more kinds of parallelism, each for a different problem: **context parallel** when one sequence's activations do not fit on one GPU, **expert parallel** when a mixture-of-experts model's experts should stay put while tokens travel to them, and **pipeline parallel** when the layers themselves are split into stages. Memory estimators usually stop here (torchtitan's estimator says "DDP, TP, PP, CP, EP are not supported yet"); fakeviz runs the real recipes per rank, in torch's fake process group, on GPUs you do not have.
#
# In this notebook you will learn:
#
# * how `parallel={"cp": 4}` splits a 32k-token sequence over 4 GPUs with torch's ring attention, what it saves against plain FSDP, and which K/V bytes travel between the ranks;
# * how `parallel={"ep": 8}` keeps 16 of Qwen3-30B-A3B's 128 experts on each GPU and moves the tokens instead, with the all-to-all bytes and the routing assumption behind them;
# * how `parallel={"pp": 4}` with a 1F1B schedule gives each stage its own peak;
# * how far to trust the figures, and what `fidelity()` names.
#
# Nothing is downloaded: the models are built from their published configs with 2 layers (6 for the pipeline), which keeps each plan to a few seconds; every layer is the same, so the per-layer figures hold for the full depth.

# %%
import logging

import pandas as pd
import transformers

import fakeviz as fv

transformers.logging.set_verbosity_error()
for logger in ("bitsandbytes", "torchao", "torch.utils._pytree"):  # notices printed at import
    logging.getLogger(logger).setLevel(logging.ERROR)
pd.set_option("display.width", 150)
GiB, MiB = 2**30, 2**20
KINDS = ["weights", "gradients", "optimizer", "activations", "temporaries", "peak"]


def side_by_side(**sims):
    """Rank 0's peak by kind for each simulation, in GiB."""
    return (pd.DataFrame({k: s.peaks.loc[0, KINDS] for k, s in sims.items()}).astype(float) / GiB).round(2)


# %% [markdown]
# ## 1. Context parallel: one long sequence over four GPUs
#
# `meta-llama/Llama-3.1-8B` with 2 layers, one sequence of 32,768 tokens per step, bf16, AdamW. First plain FSDP over 4 H100s (`dp_shard`: each GPU holds a quarter of the weights and runs a whole sequence of its own), then context parallel over the same 4 (`cp`: the weights sharded the same way, torchtitan's FSDP over `dp_shard x cp`, but one sequence split four ways).

# %%
dense = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=2)
SEQ = 32768
dp4 = fv.plan(dense, gpus="4xH100", parallel={"dp_shard": 4}, batch=1, seq=SEQ, train=True)
cp4 = fv.plan(dense, gpus="4xH100", parallel={"cp": 4}, batch=1, seq=SEQ, train=True)
print(cp4)
side_by_side(**{"dp_shard 4": dp4, "cp 4": cp4})

# %% [markdown]
# The weights and optimizer state are the same: both shard them four ways. The activations and the temporaries (the attention's and the MLP's working buffers, the logits of 128,256 words per token) shrink four times: each rank now holds 8,192 tokens of the sequence. `context_parallel` shards the step's inputs, labels and position ids along the sequence with torch's load balancing (rank r holds chunks r and 7 - r of eight, so every rank has the same causal work), and replaces SDPA with ring attention. Each rank's hidden states:

# %%
ops = cp4.trace(0).ops
emb = ops[(ops.op == "aten.embedding.default") & (ops.phase == "forward")].iloc[0]
print(f"embedding output on rank 0: [{emb['shape']}], {emb['nbytes'] / MiB:.0f} MiB")

# %% [markdown]
# What the ring moves: in forward, each attention layer all-gathers every rank's K and V (torch's default rotate method, `"allgather"`, which torchtitan and accelerate keep); in backward it gathers them again and passes the K/V gradients (float32 accumulators) around the ring, one all-to-all per ring step. The first layer's collectives on rank 0:

# %%
coll = cp4.collectives(0)
coll[coll.module.astype(str).str.contains("layers.0.self_attn")][["kind", "phase", "group_size", "bytes_in", "bytes_out"]]

# %% [markdown]
# Llama-3.1-8B has 8 key/value heads of 128: the local K and V of 8,192 tokens in bf16 are `2 x 8 x 8192 x 128 x 2` bytes = 32 MiB, and the all-gather returns four times that. The ring's work is not the same on every rank (with load balancing, rank r attends to half of what it receives at some steps, runs half its queries at others), so the four ranks record different ops: four classes, each recorded:

# %%
cp4.classes

# %% [markdown]
# ## 2. Expert parallel: experts stay, tokens travel
#
# `Qwen/Qwen3-30B-A3B` has 128 experts per layer, each token taking 8 of them. With FSDP alone (`dp_shard`), every GPU holds 1/8 of every expert's weights and all-gathers each layer's experts before using them. With `ep=8` (borrowing the ranks of `dp_shard`, as torchtitan does), each GPU holds 16 whole experts and sends each token to the GPUs of its experts with an all-to-all, and the results back with another. fakeviz runs transformers' own expert parallelism (`apply_expert_parallelism` with the model's `base_model_ep_plan`: experts `Shard(0)` over the ep ranks, the all-to-all dispatch).

# %%
moe = fv.models.config("Qwen/Qwen3-30B-A3B", num_hidden_layers=2)
fs8 = fv.plan(moe, gpus="8xH100", parallel={"dp_shard": 8}, batch=1, seq=4096, train=True)
ep8 = fv.plan(moe, gpus="8xH100", parallel={"ep": 8}, batch=1, seq=4096, train=True)
print(ep8)
side_by_side(**{"dp_shard 8": fs8, "ep 8": ep8})

# %% [markdown]
# Each GPU holds the same bytes of weights either way (1/8 of each expert, or 1/8 of the experts). What differs is the traffic: rank 0's collectives by kind, in GiB per step:

# %%
pd.DataFrame({name: s.collectives(0).groupby("kind").bytes_in.sum() / GiB
              for name, s in {"dp_shard 8": fs8, "ep 8": ep8}.items()}).fillna(0).round(3)

# %% [markdown]
# With ep the experts are never all-gathered and their gradients never reduce-scattered; the tokens move instead. One layer's forward dispatch on rank 0: the per-expert token counts (128 int64), the tokens sent to their experts' ranks, and the experts' outputs coming back:

# %%
coll = ep8.collectives(0)
coll[coll.module.astype(str).str.contains("layers.0.mlp") & (coll.phase == "forward")][
    ["op", "kind", "group_size", "bytes_in", "bytes_out"]]

# %% [markdown]
# 4,096 tokens x 8 experts each x 2,048 hidden x 2 bytes = 128 MiB each way. How many tokens a GPU receives depends on where the router sends them, which fake tensors cannot know: fakeviz assumes balanced routing (every expert gets `tokens x 8 / 128` of each rank's tokens), so each rank receives what it sends. The record says so:

# %%
for op, text in ep8.trace(0).fidelity()["assumptions"].groupby("op").assumption.first().items():
    print(f"- {op}: {text}")

# %% [markdown]
# A plan assumes balanced routing; a single-GPU record takes `fv.record(routing="skewed")` for the worst case (every token to the same 8 experts). The ep ranks hold the same shapes and run the same ops, so one rank was recorded and seven stand in for it (`ep8.stand_ins`).

# %% [markdown]
# ## 3. Pipeline parallel: four stages under 1F1B
#
# `meta-llama/Llama-3.1-8B` with 6 layers split into 4 stages the way torchtitan splits it (the embedding and the norm + head each count as a layer: 8 units, 2 per stage), 8 microbatches of one 2,048-token sequence, torch's `Schedule1F1B`:

# %%
deep = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=6)
pp4 = fv.plan(deep, gpus="4xH100", parallel={"pp": 4}, batch=8, seq=2048, train=True, microbatches=8,
              schedule="1F1B")
print(pp4)
(pp4.peaks.set_index("rank")[KINDS].astype(float) / GiB).round(2)

# %% [markdown]
# Stage 0 holds the embedding and one layer, stages 1 and 2 two layers each, stage 3 one layer and the head: their weights follow (a layer of Llama-3.1-8B is 218,112,000 parameters, the embedding and the head 525,336,576 each). A stage's activations are the microbatches it has run forward and not yet backward, times the layers it holds: 1F1B runs more warm-up forwards on the early stages, so stage 1 holds more than stage 2 with the same two layers. The last stage runs each microbatch's backward right after its forward; what it holds is the head's: the logits of a microbatch over 128,256 words (2,048 x 128,256 x 2 bytes = 0.49 GiB in bf16) and the loss's float32 copies of them.

# %% [markdown]
# ## 4. How far to trust it
#
# * **What runs is the real recipe.** torch's `context_parallel` and ring attention, transformers' expert parallelism, torch's pipeline stages and schedules, FSDP2: each rank's record is what that code allocates on that rank, with the collectives and their bytes.
# * **Tests against hand bytes** (`tests/frontends/test_cp_ep.py`, `test_pipeline_plan.py`, and this notebook's test): each cp rank's sequence shard and ring bytes, each ep rank's expert weights and all-to-all bytes, each stage's weights, against sums computed from the configs.
# * **Routing is an assumption** (balanced unless you say otherwise), stated in `fidelity()`; a skewed batch sends more tokens to some GPUs than the record shows.
# * **Not in the record**: NCCL's own buffers, the CUDA context, and the time the ring's or the all-to-all's messages take beyond the time model's estimate (notebook 09).

# %% [markdown]
# ## Exercises
#
# 1. Plan section 1 with `parallel={"dp_shard": 2, "cp": 2}`. How do the weights and the activations per rank compare with `cp 4` and `dp_shard 4`, and how many classes are recorded?
# 2. Try `seq=32767` with `cp=4`. What does fakeviz refuse, and why does torch's load balancing need it?
# 3. Plan `mistralai/Mixtral-8x7B-v0.1` (2 layers) with `parallel={"ep": 8}`. How many experts does each GPU hold, and how large is one layer's dispatch all-to-all at 4,096 tokens?
# 4. Run section 3 with `schedule="GPipe"`. Which stage's peak changes most, and why?
# 5. `parallel={"ep": 3}` on Qwen3-30B-A3B: read the error. Which degrees would work on 8 GPUs?
