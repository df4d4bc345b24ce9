# Tutorial 09: how long a training step takes on a GPU you do not have (issue 32).
#
# A published model by its hub id (fakeviz's catalog of configs: nothing is downloaded), one AdamW step recorded after
# a warm-up step, `trace.step_time("H100")` (step time, tokens per second, MFU), H100 / A100 / L40S and four
# precisions side by side, `trace.time()` by module and by kernel class, what bounds a step (compute, memory, the
# host), the explorer's time axis, and how far to trust it: the README's H100 figures and what the model leaves out.
#
# `python notebooks/build.py 09 --execute` writes `notebooks/09_how_long.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_09.py`) check its figures against hand computations and the datasheets.

# %% [markdown]
# # 09 · How long will it take? Step time, tokens per second and MFU
#
# The other notebooks answer *does it fit?*. The other half of every planning question is *how long?*: which of two configurations that both fit is faster, is an H100 worth it over an A100 for this model, what throughput and MFU should a training run expect. fakeviz answers from the same record: every op the step dispatched, with its shapes, dtypes and FLOPs, gets an estimated time on a GPU you name, and the step's time is the critical path of the host issuing those ops and the GPU running them.
#
# In this notebook you will learn:
#
# * how to record one training step of a published model by its hub id (`meta-llama/Llama-3.2-1B`, from fakeviz's catalog of configs: no download, no weights) after a warm-up step, as a GPU is timed;
# * what `trace.step_time("H100")` says: the step's time, the GPU, host and communication seconds, what bounds the step, and from it tokens per second and MFU;
# * how the same step compares on an H100, an A100 and an L40S, in bf16, fp32, TF32 and mixed precision;
# * where the time goes: `trace.time()` per op, summed by module and by kernel class, and which ops are compute, memory or launch bound;
# * how far to trust the figures: what the estimate was checked against on a real H100, and what the model does not know.
#
# Every figure below is an **estimate** computed on this machine, which has no GPU. The model behind it is a roofline per op with achieved fractions measured on a real H100 (section 6 says how close it came there).

# %%
import pandas as pd
import torch
import transformers

import fakeviz as fv
from fakeviz import models

transformers.logging.set_verbosity_error()
pd.set_option("display.width", 150)
NAME = "meta-llama/Llama-3.2-1B"
BATCH, SEQ = 4, 2048
TOKENS = BATCH * SEQ  # tokens per step
GiB = 2**30


# %% [markdown]
# ## 1. One training step, recorded after a warm-up step
#
# A GPU benchmark never times the first step: it allocates memory, picks kernels, and AdamW makes its state (two tensors per parameter) the first time it runs. So we do what a benchmark does. A `fv.FakeSession` is one fake mode that lasts across several `fv.record` blocks: the first block builds the model and the optimizer and makes a batch, the second runs a warm-up step, and the third records the step we time. Objects made in one block are used in the next, as in consecutive notebook cells.
#
# `train_step` below is ordinary training code; `autocast=True` runs the forward under `torch.autocast("cuda", dtype=torch.bfloat16)` (mixed precision, used in section 3). The model is Llama-3.2-1B at its full depth (16 layers, 1.24 billion parameters), in bfloat16 as published, at batch 4 x 2048 tokens.

# %%
def train_step(name, *, dtype=torch.bfloat16, batch=BATCH, seq=SEQ, autocast=False, gpu="H100"):
    """The record of one AdamW training step of `name`, after a warm-up step (fake cuda:0 on `gpu`)."""
    session = fv.FakeSession()
    where = dict(session=session, device="cuda:0", gpu=gpu)
    with fv.record(**where):
        model = models.build(name, dtype=dtype)  # the published config, by hub id
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        inputs = models.inputs(model, batch=batch, seq=seq)  # token ids and labels

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with fv.record(**where):
        step()  # warm-up: AdamW makes its state
    with fv.record(**where) as trace:
        step()  # the step we time
    return trace


trace = train_step(NAME)
print(f"{trace.num_ops:,} ops recorded; peak {trace.peak()['cuda:0'].bytes / GiB:.1f} GiB on cuda:0")

# %% [markdown]
# ## 2. The step's time on an H100
#
# `trace.step_time("H100")` estimates the recorded step on an H100 SXM. It returns a `StepTime`:
#
# * `step_s`: the step's time, the critical path of the host (Python and the dispatcher issue the ops one after another) and the GPU (which runs them in order, and can only start an op once it was issued);
# * `gpu_s`: the sum of the GPU's time per op, `host_s`: the sum of the host's time per op, `comm_s`: collectives (none in a one-GPU step);
# * `bound`: `gpu` when the GPU is busy most of the step, `host` when it waits for the host to issue ops (launch bound), `communication` when it waits for collectives;
# * `flops`: the step's FLOPs, from PyTorch's own formulas for every op the step dispatched.
#
# Tokens per second is the batch's tokens over the step's time. **MFU** (model FLOPs utilisation) is the FLOPs the step does over what the GPU could do in that time at its dense bf16 peak; the peaks below are NVIDIA's datasheet figures (dense, no sparsity), the same ones fakeviz's time model uses.

# %%
# dense bf16 tensor-core peaks (FLOP/s) from NVIDIA's datasheets: H100 SXM, A100 SXM, L40S
PEAK_BF16 = {"H100": 989.4e12, "A100": 312.0e12, "L40S": 362.05e12}

st = trace.step_time("H100")
print(f"step time    {st.step_s * 1e3:8.1f} ms on {st.gpu} ({st.bound} bound)")
print(f"GPU busy     {st.gpu_s * 1e3:8.1f} ms   host issuing {st.host_s * 1e3:.1f} ms")
print(f"FLOPs        {st.flops:.4g}")
print(f"tokens/s     {TOKENS / st.step_s:8,.0f}")
print(f"MFU          {st.flops / st.step_s / PEAK_BF16['H100']:8.1%}")

# %% [markdown]
# About a third of the H100's peak, for an eager PyTorch step of a small model: typical. A 1B model's matrices are small (hidden size 2048), so a good share of the step is element-wise work (norms, activations, the optimizer) that is bound by memory bandwidth, not by the tensor cores. Section 4 shows it op by op.
#
# A sanity check on the FLOPs: the usual rule of thumb for a training step is 6 x parameters x tokens (2 for the forward, 4 for the backward); attention adds its own term, which at 2048 tokens is significant for a model this narrow.

# %%
n_params = models.catalog().set_index("name").loc[NAME, "parameters"]
rule = 6 * n_params * TOKENS
print(f"{n_params:,} parameters; 6 x N x tokens = {rule:.4g} FLOPs; recorded {st.flops:.4g} "
      f"({st.flops / rule - 1:+.1%})")

# %% [markdown]
# ## 3. Other GPUs and other precisions
#
# One record gives the estimate on any GPU fakeviz knows (`step_time(gpu)`), and `trace.verdict(gpu)` says whether the step fits in its memory. Precision is a different record: the same step with fp32 weights dispatches fp32 matrix multiplies. Three records, four variants:
#
# * **bf16**: weights, gradients and AdamW state in bfloat16 (the step above);
# * **fp32**: everything in float32, matrix multiplies on the CUDA cores (PyTorch's default: TF32 is off for matmuls);
# * **fp32 + TF32**: the same record, with `tf32=True` (`torch.backends.cuda.matmul.allow_tf32 = True` on the GPU): fp32 matmuls on the tensor cores at TF32 precision;
# * **mixed** (`torch.autocast` to bf16): fp32 weights and optimizer, the forward's matmuls in bf16.

# %%
variants = {
    "bf16": (trace, False),
    "fp32": (train_step(NAME, dtype=torch.float32), False),
}
variants["fp32 + TF32"] = (variants["fp32"][0], True)
variants["mixed (autocast bf16)"] = (train_step(NAME, dtype=torch.float32, autocast=True), False)

rows = []
for precision, (tr, tf32) in variants.items():
    for gpu in ("H100", "A100", "L40S"):
        s = tr.step_time(gpu, tf32=tf32)
        rows.append({
            "precision": precision, "gpu": gpu, "step_ms": round(s.step_s * 1e3, 1),
            "tokens_per_s": round(TOKENS / s.step_s), "bound": s.bound,
            "fits": tr.verdict(gpu)["fits"], "peak_GiB": round(tr.peak()["cuda:0"].bytes / GiB, 1),
        })
table = pd.DataFrame(rows)
table.pivot(index="precision", columns="gpu", values="step_ms").loc[list(variants), ["H100", "A100", "L40S"]]

# %%
table.set_index(["precision", "gpu"])

# %% [markdown]
# What the table says:
#
# * In bf16 the H100 is about twice as fast as the A100 on this step, not 3.2x as its bf16 peak suggests: much of the step is bound by memory bandwidth, where the H100 has 1.6x the A100's. The L40S has more bf16 FLOP/s than the A100 but less than half its bandwidth (GDDR6, 0.86 TB/s), and is the slowest of the three.
# * Plain fp32 is several times slower: the matmuls leave the tensor cores. On the A100 (19.5 TFLOP/s of fp32) it is the worst case; the L40S's fp32 CUDA cores (91.6 TFLOP/s) beat the A100's here. It also needs twice the memory of bf16 for weights, gradients and optimizer state: at this batch it fits on none of the three (`fits` is False), so its times are what the step would take on a GPU that held it.
# * TF32 wins most of that back on the H100 and A100 with no code change but one flag.
# * Mixed precision is close to bf16 in time, and keeps fp32 master weights and optimizer state: more memory (`peak_GiB`), which the `fits` column checks against each GPU's capacity.

# %% [markdown]
# ## 4. Where the time goes: `trace.time()`
#
# `trace.time(gpu)` is the per-op table behind `step_time`: for every op its kernel class (`cls`: gemm, attention, elementwise, reduction, copy, foreach for the optimizer's multi-tensor kernels, ...), its FLOPs and the bytes it reads and writes, `est_s` (its own time on the GPU), `bound` (`compute` when the FLOPs term wins, `memory` when the bytes term wins, `latency` when the op is so small that the launch cost dominates, `none` for views and metadata ops that launch no kernel), and `start_s` / `end_s`, its place on the step's critical path.

# %%
t = trace.time("H100")
t[["seq", "op", "module", "cls", "flops", "bytes", "est_s", "bound", "end_s"]].sort_values("est_s").tail(8)

# %% [markdown]
# By kernel class and by bound: the share of the GPU's time each takes. GEMMs are the largest single class, but element-wise ops, reductions and copies together take about as long: they move every activation through memory a few times.

# %%
by_class = t.groupby("cls", observed=True)["est_s"].sum()
by_class = by_class[by_class > 0].sort_values(ascending=False)
by_bound = t.groupby("bound", observed=True)["est_s"].sum().drop("none")
print((by_class / by_class.sum()).map("{:.1%}".format).to_string(), "\n")
print((by_bound / by_bound.sum()).map("{:.1%}".format).to_string())

# %% [markdown]
# By module: the `module` column names the module each op ran in. The 16 decoder layers are alike, so we fold their index (`layers.*`) and keep five levels of the path; ops outside any module (the optimizer step) are `(top level)`, and the loss runs in `LlamaForCausalLM` itself.

# %%
t["block"] = (
    t["module"].astype("string")
    .str.replace(r"\.layers\.\d+", ".layers.*", regex=True)  # one row for all 16 layers
    .str.split(".").str[:5].str.join(".")
    .fillna("(top level)")
)
by_module = t.groupby("block")["est_s"].sum().sort_values(ascending=False)
share = (by_module / by_module.sum()).map("{:.1%}".format)
(by_module * 1e3).round(2).rename("ms").to_frame().assign(share=share).head(12)

# %% [markdown]
# The MLPs and the attention blocks take half the step, as expected. Less expected: the two RMSNorms of each layer (`input_layernorm`, `post_attention_layernorm`) together take almost as long as its attention block. Eager RMSNorm upcasts to float32 and passes over the activations several times (a cast, a square, a mean, a multiply or two), each pass a memory-bound kernel: exactly the kind of chain `torch.compile` or a fused RMSNorm kernel turns into one.
#
# The numbers add up: the per-op times summed by any grouping give the GPU's busy time of `step_time` (`gpu_s`); the step itself is a little longer, since the GPU sometimes waits for the host.

# %%
print(f"sum of est_s {t['est_s'].sum() * 1e3:.2f} ms = gpu_s {st.gpu_s * 1e3:.2f} ms; "
      f"last op ends at {t['end_s'].max() * 1e3:.2f} ms; step {st.step_s * 1e3:.2f} ms")

# %% [markdown]
# ## 5. What bounds a step
#
# The same model at batch 1 x 128 tokens does 1/64 of the work, but its step is not 64 times shorter: the host still issues the same ~5,000 ops, each costing tens of microseconds of Python and dispatch, and the GPU finishes each op before the host has issued the next. The step is **host bound** (launch bound): a faster GPU would not help, CUDA graphs or `torch.compile` (fewer, fused launches) would. `host_scale` says how fast your host is relative to the one the constants were measured on (0.5: twice as fast).

# %%
small = train_step(NAME, batch=1, seq=128)
for label, tr in ((f"batch {BATCH} x {SEQ}", trace), ("batch 1 x 128", small)):
    s = tr.step_time("H100")
    print(f"{label:>14}: step {s.step_s * 1e3:6.1f} ms, GPU busy {s.gpu_s * 1e3:6.1f} ms, "
          f"host {s.host_s * 1e3:6.1f} ms -> {s.bound} bound")
s = small.step_time("H100", host_scale=0.5)
print(f"batch 1 x 128 on a host twice as fast: {s.step_s * 1e3:.1f} ms ({s.bound} bound)")

# %% [markdown]
# The explorer shows the time too: its memory timeline has an x-axis control, *op index* or *estimated time* on a GPU (here the record's, an H100), and hovering an op shows its estimated time and bound. `x_axis="time"` opens it on the time axis; `gpu=` picks another GPU (setting `explorer.gpu` later re-estimates). A saved notebook keeps a static summary in its place; run the cell to use the panel.

# %%
trace.explore(x_axis="time")

# %% [markdown]
# ## 6. How far to trust it
#
# The time model's achieved fractions (what a GEMM, an attention kernel, an element-wise op reaches of the GPU's peaks, and what each launch costs) were fitted on a real H100 SXM from the kernels of 13 real training steps (`benchmarks/gpu_time.py`, `benchmarks/fit_time.py`). The README's figures for steps the fit **never saw**:
#
# * on 6 held-out real H100 training steps (Llama-3.1-8B layers at batch 4 x 4096, Mistral-7B with AdamW, Qwen2.5-1.5B, Phi-3-mini eager, Llama-3.2-1B under autocast with fused AdamW, GPT-2 medium eager) the estimate was within a median |error| of **7.4 %**, worst **9.1 %** per step;
# * estimated end to end from fake records made on a CPU-only machine, the same steps come out **-5.8 % to +9.5 %** (median |error| 6.1 %);
# * three more steps were predicted from fake records before the H100 ran them: **+5.9 %, -1.3 %, -9.4 %**.
#
# For comparison, PyTorch's own `RuntimeEstimator` roofline accepts 30-40 % error in its tests.
#
# What the model does **not** know:
#
# * **Other GPUs are an extrapolation.** Only the H100 was measured; the A100 and L40S figures above use the H100's achieved fractions of their own datasheet peaks. Real kernels reach different fractions on other architectures, and consumer or PCIe cards may clock lower under sustained load.
# * **Eager PyTorch only.** Each recorded op is one kernel launch. `torch.compile` fuses element-wise chains, CUDA graphs remove launch cost, and fused kernels (Liger, Apex, FlashAttention's own packages) do less memory traffic: the model prices the ops that were dispatched, not what a compiler would make of them.
# * **The host it was measured on.** Host (launch) costs come from one machine and torch version; `host_scale` adjusts them, but a launch-bound estimate is only as good as that guess.
# * **Not in the record, not in the time:** data loading, the Python around the step, logging, checkpoint saving, the first step's warm-up (allocator growth, cuDNN and cuBLAS autotuning), GPU clock throttling, other jobs on the GPU.
# * **Kernel choice.** cuBLAS picks GEMM algorithms by shape; the model knows alignment (shapes that are not multiples of 16 bytes are measured to run at a fraction of the aligned speed) but not every heuristic. Convolutions were not measured at all.
# * **Many GPUs.** Collectives are modelled with ring alpha-beta costs on NVLink within a node and the network across nodes, overlapping until an op reads their result; network contention, NCCL's protocol choice and stragglers are not.
#
# Use the figures to compare configurations (which GPU, which precision, which batch) and to find what bounds a step; when a decision hinges on a few percent, measure one step on the real GPU.

# %% [markdown]
# ## Exercises
#
# 1. Record the step at batch 8 x 2048 and at batch 1 x 8192 (the same tokens per step). Which is faster on an H100, and which kernel class (`by_class`) makes the difference? (Hint: attention's FLOPs grow with the square of the sequence.)
# 2. Compare `step_time("H200")` and `step_time("B200")` with the H100 for the bf16 step. Which of the two speeds up the memory-bound ops more, and why (look at their HBM bandwidth)?
# 3. Replace `torch.optim.AdamW(model.parameters(), lr=1e-4)` with `fused=True` and record again. How many ops does the optimizer phase dispatch now, and what happens to the host time of the small batch-1 step?
# 4. From the per-op table `t`, find the single most expensive op of one decoder layer and compute its arithmetic intensity (`flops / bytes`). Is it above or below the H100's ridge point (989.4e12 / 3.35e12, about 295 FLOP per byte)? Does that match its `bound`?
