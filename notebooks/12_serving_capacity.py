# Tutorial 12: how many requests vLLM serves at once on one GPU (issue 33).
#
# What vLLM does at start-up (weights, the profile run, `gpu_memory_utilization x` the GPU, KV cache blocks), checked
# by hand for Llama-3.1-8B on one H100; the profile run's record; bf16 against 8-bit and NF4 weights and an fp8 KV
# cache; sliding-window layers (Gemma-2-9B) against the same model with full attention everywhere, and why they help
# only past `window + max_num_batched_tokens`; what `gpu_memory_utilization` and `max_model_len` do, and vLLM's own
# error when one request does not fit; how far to trust the figures.
#
# `python notebooks/build.py 12 --execute` writes `notebooks/12_serving_capacity.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_12.py`) check its figures against hand computations from the published
# configs.

# %% [markdown]
# # 12 · Serving capacity: how many requests fit on one GPU
#
# When you start `vllm serve`, it prints two lines that answer the question every deployment asks: `GPU KV cache size: N tokens` and `Maximum concurrency for 8,192 tokens per request: X.XXx`. To get them vLLM loads the weights, runs a *profile run* (one forward over its largest scheduler step) to measure the activation peak, and hands what is left of `gpu_memory_utilization x` the GPU's memory to the KV cache, in blocks of 16 tokens. `fv.serve` follows the same steps from vLLM's own code, on a GPU you do not have: the profile run is recorded under fake tensors, the rest is vLLM's arithmetic.
#
# In this notebook you will learn:
#
# * what vLLM's start-up budget is made of for `meta-llama/Llama-3.1-8B` on one H100, checked by hand: weights, the profile run's peak, the KV bytes of one block, the blocks and the concurrency;
# * what the profile run is and why its peak is mostly the sampler's float32 logits;
# * how much 8-bit or NF4 weights, and an fp8 KV cache, add to the number of 8k requests served at once;
# * how sliding-window layers (Gemma 2/3, Mistral) change the count, and why they do not at 8k with vLLM's default scheduler step;
# * what `gpu_memory_utilization` and `max_model_len` do, vLLM's own error when one request does not fit, and how far to trust the figures.
#
# Nothing is downloaded: the model is built from its published config, with fake weights. Each `fv.serve` call records one forward of the model (a few seconds on a laptop CPU).

# %%
# bitsandbytes (fakeviz[quant]) quantizes the weights of section 3: Binder has it; elsewhere (Colab) this installs it
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("bitsandbytes") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "bitsandbytes>=0.48"])

# %%
import logging

import pandas as pd
import transformers

import fakeviz as fv

transformers.logging.set_verbosity_error()
for logger in ("bitsandbytes", "torchao", "torch.utils._pytree"):  # notices printed at import
    logging.getLogger(logger).setLevel(logging.ERROR)
pd.set_option("display.width", 150)
NAME = "meta-llama/Llama-3.1-8B"
GiB = 2**30


def figures(s):
    """The start-up figures of one fv.serve answer."""
    return {
        "weights GiB": round(s.weights / GiB, 2), "profile peak GiB": round(s.profile_peak / GiB, 2),
        "KV cache GiB": round(s.available_kv / GiB, 2), "KV blocks": s.kv_blocks,
        "KV tokens": s.kv_tokens, "8k requests at once": round(s.max_concurrency, 2),
    }


# %% [markdown]
# ## 1. vLLM's start-up budget, on one H100
#
# `fv.serve(model, gpus="1xH100", max_model_len=8192)` answers with `vllm serve`'s defaults: `gpu_memory_utilization=0.9`, `block_size=16`, and on a GPU of at least 70 GiB a scheduler step of `max_num_batched_tokens=8192` tokens over at most `max_num_seqs=1024` requests.

# %%
base = fv.serve(NAME, gpus="1xH100", max_model_len=8192)
print(base.text)
pd.Series(figures(base), dtype=object)

# %% [markdown]
# Every figure but one can be checked by hand from the published config (32 layers, 8 KV heads of 128 dimensions, bf16):
#
# * the budget is `ceil(0.9 x 81,559 MiB)` (an H100 80GB reports 81,559 MiB);
# * one block holds 16 tokens of keys and values of every layer: `2 x 32 x 8 x 128 x 16 x 2` bytes = 2 MiB;
# * the blocks are what is left after the weights and the profile run's peak, in whole blocks, and one request of 8,192 tokens needs 512 of them.
#
# The one figure that needs the profile run is its peak.

# %%
per_block = 2 * 32 * 8 * 128 * 16 * 2
budget = -(-81559 * 2**20 * 9 // 10)
blocks = (budget - base.weights - base.profile_peak) // per_block
print(f"KV bytes per block: {per_block:,} by hand, {base.kv_bytes_per_block:,} from fv.serve")
print(f"blocks: {blocks:,} by hand, {base.kv_blocks:,} from fv.serve")
print(f"8k requests at once: {blocks / 512:.2f} by hand, {base.max_concurrency:.2f} from fv.serve")

# %% [markdown]
# ## 2. The profile run
#
# vLLM's profile run (`gpu_model_runner.py`, `profile_run`) is one forward over `max_num_batched_tokens` tokens as `max_num_seqs` dummy requests (8 tokens each here), without a KV cache, then the sampler over the last token of each request. `base.trace` is its record: explore it like any other (`base.explore()`). Where is the peak?

# %%
peak = base.trace.peak()["cuda:0"]
print(f"peak at op {peak.seq:,} of {base.trace.num_ops:,}: {peak.op} ({peak.module or 'the sampler'})")
print(f"profile run shape: {base.settings['profile_shape']}")
logits32 = 1024 * 128256 * 4
print(f"one float32 logits tensor of 1024 requests x 128,256 tokens: {logits32 / GiB:.2f} GiB; the peak over the weights: {base.profile_peak / GiB:.2f} GiB")

# %% [markdown]
# The peak is in the sampler: vLLM turns the logits of 1,024 requests into float32 (0.49 GiB for Llama-3's 128,256-token vocabulary), then softmax probabilities and the exponential draws of its random sampling are alive at the same time. A model with a larger vocabulary (Gemma: 256,000) has a larger profile peak for the same reason; the forward's own activations over 8,192 tokens are smaller.

# %% [markdown]
# ## 3. Smaller weights, smaller KV cache
#
# `quantization=` quantizes the weights with their library's own code, as `fv.plan` does: `"int8"` and `"nf4"` with bitsandbytes (installed here), `"fp8"` with torchao where it is installed (on an H100 its weights take the same bytes as int8's). `kv_cache_dtype="fp8"` stores keys and values in one byte instead of two: every block halves.

# %%
rows = {"bf16": figures(base)}
for label, kw in (("int8 weights", {"quantization": "int8"}), ("nf4 weights", {"quantization": "nf4"}),
                  ("bf16, fp8 KV cache", {"kv_cache_dtype": "fp8"})):
    rows[label] = figures(fv.serve(NAME, gpus="1xH100", max_model_len=8192, **kw))
quant = pd.DataFrame(rows).T.astype({"KV blocks": int, "KV tokens": int})
quant

# %% [markdown]
# Quantizing the weights frees 6.5 GiB (int8) or 9.3 GiB (NF4), and each freed GiB is 512 blocks: the 8k requests served at once grow from 55 to about 62 and 64. The embeddings and the output head stay in bf16 either way (2 GiB of Llama-3.1-8B). An fp8 KV cache does more for serving: every request's cache is half the size, so twice the requests fit, at some cost in accuracy.

# %% [markdown]
# ## 4. Sliding-window layers
#
# Gemma-2-9B alternates sliding-window layers (a 4,096-token window) with full-attention layers. vLLM groups the layers by kind (its *hybrid* KV cache manager: here two groups of 21 layers, sharing one pool of blocks) and budgets a sliding layer for at most `window - 1 + max_num_batched_tokens` tokens (the window plus one chunked-prefill step, `SlidingWindowSpec.max_memory_usage_bytes`). The same config with every layer full attention is the comparison.

# %%
gemma = fv.models.config("google/gemma-2-9b")
full_only = fv.models.config("google/gemma-2-9b", layer_types=["full_attention"] * gemma.num_hidden_layers)
rows = {}
for step in (8192, 2048):
    for label, cfg in (("sliding + full", gemma), ("full everywhere", full_only)):
        s = fv.serve(cfg, gpus="1xH100", max_model_len=8192, max_num_batched_tokens=step)
        rows[(step, label)] = {"KV groups": len(s.layout.groups), "KV blocks": s.kv_blocks,
                               "blocks per request": s.layout.blocks_per_request(),
                               "8k requests at once": round(s.max_concurrency, 2)}
sliding = pd.DataFrame(rows).T.astype({"KV groups": int, "KV blocks": int, "blocks per request": int})
sliding = sliding.rename_axis(["max_num_batched_tokens", "layers"])
sliding

# %% [markdown]
# With vLLM's default step of 8,192 tokens, a sliding layer's budget is `min(4,095 + 8,192, 8,192)` = 8,192 tokens plus one block: no saving at 8k, the two layouts serve the same. With a step of 2,048 tokens the sliding layers need only `ceil(6,143 / 16) + 1` = 385 blocks against 512, and the model serves about 14 % more 8k requests. The longer `max_model_len` is against the window, the larger the gain: it is what makes Gemma and Mistral cheap at long contexts.

# %% [markdown]
# ## 5. `gpu_memory_utilization` and `max_model_len`
#
# `gpu_memory_utilization` is the share of the GPU vLLM may use *in total*: the weights and the profile peak come out of it first, the KV cache gets the rest. The weights do not shrink with it, so the KV cache falls faster than the utilization.

# %%
rows = {}
for util in (0.95, 0.9, 0.7, 0.5, 0.3):
    s = fv.serve(NAME, gpus="1xH100", max_model_len=8192, gpu_memory_utilization=util)
    rows[util] = {"KV cache GiB": round(s.available_kv / GiB, 2), "KV blocks": s.kv_blocks,
                  "8k requests at once": round(s.max_concurrency, 2), "longest context": s.max_context}
table = pd.DataFrame(rows).T.astype({"KV blocks": int, "longest context": int})
table.rename_axis("gpu_memory_utilization")

# %% [markdown]
# When one request of `max_model_len` tokens does not fit, vLLM refuses to start, with an error that names the longest context that would. `fv.serve` does not raise: it returns `fits=False` and vLLM's own text in `error`. Llama-3.1-8B's full context of 131,072 tokens at a utilization of 0.3:

# %%
s = fv.serve(NAME, gpus="1xH100", max_model_len=131072, gpu_memory_utilization=0.3)
print("fits:", s.fits)
print(s.error)

# %% [markdown]
# The estimate in the message is vLLM's binary search over `max_model_len` (one request's blocks against the KV cache), and `s.max_context` is the same search up to the model's own context. Asking for more than the model's context is refused before anything runs, as vLLM refuses it:

# %%
try:
    fv.serve(NAME, gpus="1xH100", max_model_len=200_000)
except ValueError as e:
    print(f"{type(e).__name__}: {e}")

# %% [markdown]
# ## 6. How far to trust it
#
# The arithmetic after the profile run (the KV bytes per block and per layer kind, the groups of a hybrid model, the blocks, the concurrency, the error) follows vLLM's V1 code and is checked by hand in the tests (`tests/frontends/test_serve.py`). The profile run is where the figures can differ: vLLM runs its own model code with fused kernels, fakeviz runs transformers' model over the same tokens. Against vLLM's own log lines for Llama-3.1-8B-Instruct on an RTX 3090 (vLLM issue #10517, `benchmarks/serve_capacity.py`), the recorded profile peak is 7-8 % above vLLM's measured one and the block count within 3-7 %. What the record cannot hold is listed in its `fidelity()`:

# %%
for row in base.trace.fidelity()["assumptions"].itertuples():
    if row.op.startswith("vllm"):
        print(f"- {row.op}: {row.assumption}")

# %% [markdown]
# In practice: leave a margin of a few hundred MiB (the non-torch memory vLLM measures and fakeviz does not see, and CUDA graphs unless you run with `--enforce-eager`), and read `max_concurrency` as vLLM reads it: the requests of `max_model_len` tokens that fit *at once* in the worst case. Shorter requests share the same blocks, so a real server runs many more of them.
#
# ## Exercises
#
# 1. Serve `"Qwen/Qwen2.5-7B"` on one H100. It has 28 layers and 4 KV heads: check its KV bytes per block by hand, and explain why it serves more than twice as many 8k requests as Llama-3.1-8B.
# 2. Serve Llama-3.1-8B on an `"L4"` (24 GB) with `max_model_len=8192`. Which default changes on a GPU under 70 GiB (look at `s.settings`), and what does that do to the profile peak?
# 3. Serve `"mistralai/Mistral-7B-v0.1"` (a 4,096-token window on every layer) at `max_model_len=32768`. How many blocks does one request need, against `32768 / 16` for full attention?
# 4. Find the smallest `gpu_memory_utilization` at which Llama-3.1-8B still starts with `max_model_len=131072`, first from the table in section 5, then with `fv.serve`.
# 5. `base.explore()` opens the profile run in the explorer: find the op at the peak and the tensors alive there.
