# Tutorial 08: many GPUs. Your own training step run once per rank by `fv.simulate` in torch.distributed's fake
# process group: FSDP2 (`fully_shard`) over 8 fake H100s with its padded shards, per-rank peaks, classes of ranks and
# collectives; then tensor parallel (`parallelize_module`) on a TP-only mesh and on a 2-D (dp, tp) mesh.
#
# `python notebooks/build.py 08 --execute` writes `notebooks/08_many_gpus.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_08.py`) check every rank's shards, the sharded parameter and optimizer
# bytes, the collectives' bytes and the tensor-parallel shapes against hand computations from the models' shapes.

# %% [markdown]
# # 08 · Many GPUs: FSDP2 and tensor parallel, rank by rank
#
# Distributed training code is the code you can least afford to debug on the real thing: a job waits for 8 or 64 GPUs, then fails in the optimizer step after the forward and backward, or runs out of memory on one rank only. `fv.simulate` runs **your own step** (build, `fully_shard` or `parallelize_module`, optimizer, train) once per rank, in torch.distributed's own *fake* process group, on fake GPUs. Every collective completes at once and moves no data, but everything rank dependent is torch's own: the shard each rank owns, FSDP2's padding, the all-gather buffers, tensor parallel's local shapes.
#
# In this notebook you will learn:
#
# * how to write a step for `fv.simulate(step, world_size, mesh_shape=..., mesh_dim_names=...)` and read its result: `sim.peaks` (one row per rank), `sim.classes` (ranks whose records are the same), `sim.fits`, `sim.collectives(rank)` and `sim.explore()`;
# * what FSDP2 keeps on each rank: padded shards of the parameters, gradients and optimizer state, and the gathered parameters of the block that is running, and how to check the bytes by hand;
# * which collectives a step issues (all-gather, reduce-scatter, all-reduce), in which group, and how many bytes each sends;
# * how tensor parallelism halves the weights (`ColwiseParallel`, `RowwiseParallel`), the error a tensor-parallel job hits in `optimizer.step()` found on a laptop, and FSDP x TP on a 2-D mesh.
#
# The models are published architectures at their real width but with 2 blocks (`num_hidden_layers=2`): the per-rank figures of a block are the same at full depth, and the notebook runs in well under a minute on a laptop CPU.

# %%
import math

import pandas as pd
import torch
import transformers
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import fakeviz as fv
from fakeviz import models

transformers.logging.set_verbosity_error()
pd.set_option("display.width", 160)
MiB = 2**20

# %% [markdown]
# ## 1. FSDP2 over 8 GPUs
#
# A step is a function of `(rank, mesh)`. `fv.simulate` calls it once per rank inside a recording on that rank's fake GPU (`cuda:{rank}`, made current as a launcher would), with `mesh` the rank's `DeviceMesh`. The step below is what an FSDP2 training script does: build the model, `fully_shard` each transformer block (each becomes one all-gather / reduce-scatter group) and then the root (the embeddings and the final norm), make AdamW, run forward, backward and `step()`.
#
# The model is GPT-2 small's width (768, vocabulary 50,257) with 2 of its 12 blocks. Inside the step we also keep what torch itself says about each rank's shards (`to_local()`: the rows this rank owns, and the size of the storage behind them), to compare with fakeviz's record below. `use_cache=False`: in training there is no point keeping a KV cache (transformers fills one unless told not to).

# %%
WORLD, BATCH, SEQ = 8, 4, 512
shards = {}  # rank -> {parameter: (local shape, bytes of its storage)}, as torch reports them


def fsdp_step(rank, mesh):
    model = models.build("gpt2", num_hidden_layers=2)  # fake, on this rank's GPU
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shards[rank] = {
        name: (tuple(p.to_local().shape), p.to_local().untyped_storage().nbytes())
        for name, p in model.named_parameters()
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()


sim = fv.simulate(fsdp_step, WORLD, gpu="H100")
sim

# %% [markdown]
# Eight ranks recorded, **two classes**, everything fits. Before the memory, look at the shards. FSDP2 splits every parameter along its first dimension into `world_size` chunks of `ceil(rows / world_size)` rows. Most of GPT-2's dimensions divide by 8, but the vocabulary does not: 50,257 = 7 × 6,283 + 6,276. Ranks 0 to 6 own 6,283 rows of the embedding, rank 7 owns 6,276, and every rank's storage holds 6,283 rows (FSDP2 *pads* the last shard, so that the all-gather can use equal chunks).

# %%
wte, c_fc = "transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"
pd.DataFrame([
    {
        "rank": rank,
        "wte rows owned": shards[rank][wte][0][0],
        "wte storage (bytes)": shards[rank][wte][1],
        "c_fc rows owned": shards[rank][c_fc][0][0],
        "c_fc storage (bytes)": shards[rank][c_fc][1],
    }
    for rank in sorted(shards)
])

# %% [markdown]
# fakeviz records the same storages. The sum of all padded shards, by hand from the unsharded model's shapes, against the **Parameter** bytes each rank's record holds at the end of initialisation (before the first forward gathers anything), and AdamW's state at the end of the step: two tensors (`exp_avg`, `exp_avg_sq`) per parameter, each the size of the rows the rank *owns* (the optimizer works on the local tensor, not on the padding).

# %%
reference = models.build("gpt2", num_hidden_layers=2)  # unsharded, fake: only its shapes are used


def padded_shard_bytes(params, world):
    return sum(math.ceil(p.shape[0] / world) * p[0].numel() * p.element_size() for p in params)


def cuda_memory(trace):
    """Live bytes per category after every op, on the rank's GPU."""
    mem = trace.memory(allocator=False)
    return mem[mem.device.astype(str).str.startswith("cuda")]


print(f"padded shards by hand: {padded_shard_bytes(reference.parameters(), WORLD):,} bytes per rank")
for rank in (0, 7):
    mem = cuda_memory(sim.trace(rank))
    init = int(mem[mem.phase == "init"].Parameter.iloc[-1])
    state = int(mem["Optimizer state"].iloc[-1])
    print(f"rank {rank}: Parameter after init {init:,} bytes, AdamW state after the step {state:,} bytes")


# %% [markdown]
# Every rank holds the same 26.8 MB of parameters, 1/8 of GPT-2's 214 MB plus the padding. Rank 7's AdamW state is smaller than rank 0's by exactly 2 × 7 rows × 768 × 4 bytes: it owns 7 fewer rows of the embedding.
#
# ### Per-rank peaks
#
# `sim.peaks` has one row per rank: the bytes by kind at that rank's peak, the peak as the CUDA caching allocator would reserve it (`peak`) and the bytes the verdict judged against the GPU's capacity (`judged`: the same, unless the rank fits only by freeing cached blocks). In MiB:

# %%
def in_mib(peaks):
    kinds = ["weights", "gradients", "optimizer", "activations", "temporaries", "peak", "judged"]
    df = peaks[["rank", "device", *kinds, "fits", "class"]].copy()
    df[kinds] = (df[kinds] / MiB).round(1)
    return df


peak = sim.trace(0).peak()["cuda:0"]
print(f"rank 0 peaks in the {peak.phase} at {peak.op} ({peak.module})")
in_mib(sim.peaks)

# %% [markdown]
# The peak is in the backward of the first step, where the cross-entropy's `log_softmax` is differentiated: the loss over 4 × 512 positions × 50,257 logits (activations and temporaries) dwarfs a 2-block model's weights. The weights at the peak, 175.8 MiB, are the 25.5 MiB of shards plus the root's parameters (the embeddings), gathered to their full (padded) 150.3 MiB for the forward and, as FSDP2 does for the root, kept until the backward is done. The gradients and optimizer columns are 0: in a first step, gradients are reduce-scattered after the peak and AdamW's state is made in `step()`.
#
# To see what sharding buys, record the same step on a single GPU, without FSDP, and compare what is alive when the step ends:

# %%
with fv.record(device="cuda:0", gpu="H100") as single:
    model = models.build("gpt2", num_hidden_layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()

kinds = ["Parameter", "Gradient", "Optimizer state"]
pd.DataFrame({
    "one GPU": cuda_memory(single)[kinds].iloc[-1],
    "FSDP rank 0": cuda_memory(sim.trace(0))[kinds].iloc[-1],
    "FSDP rank 7": cuda_memory(sim.trace(7))[kinds].iloc[-1],
}).astype(int)

# %% [markdown]
# Parameters, gradients and optimizer state are each an eighth (plus padding) of the single GPU's: that is the whole point of FSDP (ZeRO-3). The activations are not sharded: each rank runs its own batch through the whole model.
#
# ### Classes of ranks
#
# Two ranks are in one class when their records are the same op for op (op, output shapes, dtypes, bytes, phase), devices and group members aside. With 64 or 512 ranks this is what you look at: how many *different* ranks there are, and which.

# %%
sim.classes

# %% [markdown]
# Rank 7 is alone because its embedding shard is 6,276 rows, not 6,283: at `fully_shard` it copies fewer rows into its padded storage, so some ops have other shapes. Its record also has a few more ops at the first forward, and that part is a limit of fake tensors worth knowing: FSDP2's lazy initialisation checks whether a padded shard is still the same memory by comparing `data_ptr()`, which a fake tensor does not have (it is 0), so on rank 7 it copies the shard into a fresh padded storage of the same size. A real run skips that copy; the bytes are the same.
#
# ### Collectives
#
# Each collective is an op in the rank's record, with its process group and bytes. `bytes_in` is what this rank contributes, `bytes_out` what it receives into its output buffer, and `sent` / `received` the bytes a ring algorithm (what NCCL uses for large messages) moves over this rank's links: `(n - 1) × shard` for an all-gather or reduce-scatter over `n` ranks.

# %%
col = sim.collectives(0)
col[["seq", "kind", "phase", "module", "group_size", "ranks", "bytes_in", "bytes_out", "sent"]]

# %% [markdown]
# Read it in order: the forward all-gathers the root's parameters, then each block's just before it runs; the backward all-gathers the blocks again (FSDP2 frees a block's gathered parameters after its forward, `reshard_after_forward=True`) and reduce-scatters each group's gradients, so that each rank keeps only the gradient of its own shard. The bytes follow from the shards:

# %%
groups = {
    "FSDPGPT2LMHeadModel.transformer.h.0": list(reference.transformer.h[0].parameters()),
    "FSDPGPT2LMHeadModel": [p for n, p in reference.named_parameters() if not n.startswith("transformer.h.")],
}
for module, params in groups.items():
    gather = col[(col.kind == "all_gather") & (col.module == module)].iloc[0]
    shard = padded_shard_bytes(params, WORLD)
    print(f"{module}: all-gather in {int(gather.bytes_in):,} out {int(gather.bytes_out):,} "
          f"sent {int(gather.sent):,}; by hand: shard {shard:,}, x {WORLD} = {WORLD * shard:,}, "
          f"x {WORLD - 1} = {(WORLD - 1) * shard:,}")
print(f"per step, rank 0 sends {int(col.sent.sum()):,} bytes")

# %% [markdown]
# `sim.explore()` puts it together in a live kernel: the classes, every rank's peak by category side by side, and a rank picker that opens the chosen rank's explorer (layer tree, memory timeline, ops). Saved without a kernel (on GitHub, nbviewer) the cell shows a static summary instead: the classes table and rank 0's trace summary.

# %%
sim.explore()

# %% [markdown]
# ## 2. Tensor parallel
#
# FSDP shards the *storage* of the parameters and gathers them to compute. Tensor parallelism (TP) splits the *computation*: each rank keeps a slice of every weight for good and computes with it. Megatron's pattern for a transformer block: the first linear layers of attention and MLP are split by output columns (`ColwiseParallel`: each rank computes some heads, some hidden units), the second by input rows (`RowwiseParallel`: each rank's partial sums are added by an **all-reduce**). So one all-reduce per attention and one per MLP in the forward.
#
# The model now is Llama-3.2-1B's width (hidden 2,048, 32 query and 8 key/value heads, MLP 8,192) with 2 of its 16 layers, in bf16 as published.

# %%
TP_PLAN = {
    "self_attn.q_proj": ColwiseParallel(),
    "self_attn.k_proj": ColwiseParallel(),
    "self_attn.v_proj": ColwiseParallel(),
    "self_attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(),
    "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(),
}
local = {}  # rank -> {parameter: local shape} of the parallelized weights


def build_parallel(mesh):
    model = models.build("meta-llama/Llama-3.2-1B", num_hidden_layers=2)
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], TP_PLAN)
    return model


def train(rank, model, **adamw):
    local[rank] = {n: tuple(p.to_local().shape) for n, p in model.named_parameters() if isinstance(p, DTensor)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **adamw)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()


def tp_step(rank, mesh):
    train(rank, build_parallel(mesh))


# %% [markdown]
# Two ranks, one mesh dimension named `tp`, and the obvious step. It fails:

# %%
try:
    fv.simulate(tp_step, 2, mesh_dim_names=("tp",), gpu="H100")
except fv.SimulationError as e:
    print(e)
    print(f"\nrank {e.rank} recorded {e.simulation.trace(e.rank).num_ops:,} ops before it failed")


# %% [markdown]
# This is a real failure, not a fake-tensor one. On a GPU, AdamW defaults to its multi-tensor (`foreach`) kernels, which process all parameters of a device in one call; the parallelized weights are `DTensor`s, while the embeddings and norms that `TP_PLAN` does not name are plain tensors, and DTensor refuses a foreach call that mixes the two. A real job would get there after a forward and a backward on two GPUs; here it took a few seconds, and the error names your line and keeps the partial record. The usual fixes: `foreach=False` (the per-parameter loop), or make every parameter a DTensor, which FSDP does (section 3).

# %%
def tp_step(rank, mesh):
    train(rank, build_parallel(mesh), foreach=False)


tp = fv.simulate(tp_step, 2, mesh_dim_names=("tp",), gpu="H100")
print(tp.text, "| fits:", tp.fits)

# %% [markdown]
# Every parallelized weight is halved along the dimension its style splits: output rows for colwise (`q_proj`: 2,048 → 1,024 rows, 16 of the 32 heads), input columns for rowwise (`o_proj`: 2,048 → 1,024 columns). The embedding, the norms and `lm_head` (tied to the embedding) stay whole on every rank.

# %%
reference_tp = models.build("meta-llama/Llama-3.2-1B", num_hidden_layers=2)
full = dict(reference_tp.named_parameters())
tp_local = dict(local)  # kept: the 2-D run below fills `local` again
layer0 = [n for n in local[0] if n.startswith("model.layers.0.")]
pd.DataFrame({
    "full": [tuple(full[n].shape) for n in layer0],
    "rank 0": [local[0][n] for n in layer0],
    "rank 1": [local[1][n] for n in layer0],
}, index=layer0)

# %%
tcol = tp.collectives(0)
tcol.groupby(["kind", "phase"], observed=True).agg(count=("seq", "size"), bytes_in=("bytes_in", "sum"),
                                                 first_bytes_in=("bytes_in", "first"))

# %% [markdown]
# Three kinds of collectives:
#
# * **scatter** at init: `parallelize_module` builds each full weight on every rank and scatters rank 0's slices (so that all ranks start from the same values): 14 weights, one scatter each;
# * **all-reduce** in the forward: after each rowwise layer (attention's `o_proj`, the MLP's `down_proj`), the partial sums of the hidden states, batch × seq × hidden × 2 bytes = 4 × 512 × 2,048 × 2 = 8 MiB each, 4 for 2 layers;
# * **all-reduce** in the backward: the gradient of the input of each colwise layer is a partial sum too (`q`, `k`, `v`, `gate`, `up`: 5 per layer).
#
# `tp.peaks` per rank (both ranks are one class):

# %%
in_mib(tp.peaks)


# %% [markdown]
# ## 3. FSDP × TP on a 2-D mesh
#
# Large jobs combine both: tensor parallel inside a node (fast links), FSDP across nodes. A 2-D mesh `(dp=2, tp=2)` of 4 ranks: ranks `[[0, 1], [2, 3]]`, so ranks 0 and 1 split each weight by TP, and ranks 0 and 2 hold FSDP shards of the same TP slice. Every parameter is now a DTensor, so the default `foreach` AdamW works.

# %%
def fsdp_tp_step(rank, mesh):
    model = build_parallel(mesh)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    train(rank, model)


twod = fv.simulate(fsdp_tp_step, 4, mesh_shape=(2, 2), mesh_dim_names=("dp", "tp"), gpu="H100")
print(twod.text, "| fits:", twod.fits)
pd.DataFrame({
    "full": [tuple(full[n].shape) for n in layer0],
    "TP only (rank 0)": [tp_local[0][n] for n in layer0],
    "FSDP x TP (rank 0)": [local[0][n] for n in layer0],
}, index=layer0)

# %% [markdown]
# Each weight is now a quarter: TP halves it as before, and FSDP splits that half again along its first dimension over the `dp` ranks (`o_proj`: 2,048 × 1,024 after TP, 1,024 × 1,024 after FSDP). The collectives fall into the mesh's groups: TP's all-reduces (and init scatters) between ranks 0 and 1, FSDP's all-gathers and reduce-scatters between ranks 0 and 2. Summed per kind and group on rank 0:

# %%
dcol = twod.collectives(0)
dcol.groupby(["kind", "ranks"], observed=True).agg(count=("seq", "size"), bytes_in=("bytes_in", "sum"))

# %% [markdown]
# ## Exercises
#
# 1. **Padding.** Run the FSDP step with `WORLD = 6` (and `mesh_shape` left out). Which ranks own fewer embedding rows, how many classes are there, and what does the padded-shard formula give now?
# 2. **`reshard_after_forward=False`.** Pass it to every `fully_shard` call. How many all-gathers does rank 0 issue now (`sim.collectives(0)`), and what happens to the weights at the peak?
# 3. **A steady-state step.** Run two training steps in `fsdp_step` (forward, backward, `step()`, `zero_grad()`, twice). Where is the peak now, and which columns of `sim.peaks` are no longer 0?
# 4. **Fewer ranks recorded.** `fv.simulate(fsdp_step, 64, ranks=[0, 63])` records only the first and the last rank of 64. Predict the embedding rows of rank 63 before you run it.
# 5. **Sequence parallel.** Add `SequenceParallel()` for the norms to `TP_PLAN` (see `torch.distributed.tensor.parallel`) and compare the collectives of the TP run: which all-reduces become all-gathers and reduce-scatters?
