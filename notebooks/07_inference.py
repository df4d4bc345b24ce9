# Tutorial 07: inference. A Llama-3.1-8B checkpoint folder opened from its safetensors headers only, the KV cache over
# `generate`'s prefill and decode steps, and the model placed on four GPUs by accelerate's `device_map="auto"` and by
# fakeviz's `"balanced"`.
#
# `python notebooks/build.py 07 --execute` writes `notebooks/07_inference.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_07.py`) check the bytes read against the checkpoint's size, the KV cache
# against `2 * layers * kv_heads * head_dim * tokens * 2` from the config, the "auto" map against accelerate's own
# `infer_auto_device_map`, and the failing request against the logits' size.

# %% [markdown]
# # 07 · Inference: checkpoints, the KV cache and placement on GPUs
#
# Before you rent GPUs to serve or evaluate a model, three questions come up: what is in this checkpoint, how much memory does generation take as the answer gets longer, and how do I split the model over the GPUs I have? All three can be answered on a laptop with fake tensors: the model is built with every shape, dtype and device it would have, but no data.
#
# In this notebook you will learn:
#
# * how a safetensors checkpoint is laid out, and how `models.from_pretrained(folder)` builds the fake model from a 16 GB Llama-3.1-8B checkpoint by reading about 100 KB of it (the headers);
# * how the **KV cache** grows over `generate()`'s prefill and decode steps, and how to compute it from the config: `2 × layers × kv_heads × head_dim × tokens × bytes per element`;
# * what long prompts and large batches cost (a sweep over batch and sequence length);
# * how to place a model on several GPUs: accelerate's `device_map="auto"` (what `from_pretrained(device_map="auto")` uses) balances the *weights*, and fails here where fakeviz's `"balanced"`, which balances the measured *peaks*, fits.
#
# The model is the published Llama-3.1-8B at full size (32 layers): fake tensors cost nothing, so there is no reason to shrink it. The whole notebook runs in well under a minute on a laptop CPU.

# %%
import json
import re
import shutil
import struct
from pathlib import Path

import pandas as pd
import torch
import transformers

import fakeviz as fv
from fakeviz import models

transformers.logging.set_verbosity_error()  # keep generate()'s advice about attention masks out of the way
pd.set_option("display.width", 140)
GiB = 2**30

# %% [markdown]
# ## 1. A checkpoint folder, read from its headers
#
# A Hugging Face checkpoint is a folder: `config.json` (the architecture and its sizes), the weights in one or more `.safetensors` files, and, when there are several, `model.safetensors.index.json` saying which file holds which tensor. A safetensors file is three things in a row:
#
# 1. 8 bytes: the length `N` of the header, a little-endian integer;
# 2. `N` bytes of JSON: for every tensor its dtype, shape and the byte range of its data;
# 3. the data: every tensor's bytes, back to back.
#
# Everything a fake model needs (names, shapes, dtypes) is in the first two parts. We have no weights here (no network, and 16 GB), so we write such a folder ourselves from the published config: the `config.json` and the headers for real, and the data region left as a *hole*. The file gets its full size, but a sparse file takes no disk space for bytes that were never written. A real download has the same headers and sizes; only the holes are filled.

# %%
config = models.config("meta-llama/Llama-3.1-8B")  # the published config.json, shipped with fakeviz
folder = Path("llama-3.1-8b-checkpoint")
folder.mkdir(exist_ok=True)
config.to_json_file(folder / "config.json")

shapes = models.build(config, device="meta").state_dict()  # every tensor's name, shape and dtype
print(len(shapes), "tensors, for example:")
for name in list(shapes)[:3]:
    print(f"  {name}: {tuple(shapes[name].shape)} {shapes[name].dtype}")

# %% [markdown]
# Writing one shard follows the three parts above. `f.truncate` extends the file to its full length without writing the data bytes: that is the hole.

# %%
DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def write_shard(path, tensors):
    """A safetensors file: the header length, the JSON header, then the data region (left as a hole)."""
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to a multiple of 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(f.tell() + offset)  # the full size; the data bytes are never written


names = list(shapes)  # four shards, as the published Llama-3.1-8B has
files = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
weight_map = {}
for i, file in enumerate(files):
    part = names[i * len(names) // 4 : (i + 1) * len(names) // 4]
    write_shard(folder / file, {name: shapes[name] for name in part})
    weight_map.update(dict.fromkeys(part, file))
index = {"metadata": {}, "weight_map": weight_map}
(folder / "model.safetensors.index.json").write_text(json.dumps(index))

listing = pd.DataFrame(
    [(p.name, p.stat().st_size, p.stat().st_blocks * 512) for p in sorted(folder.iterdir())],
    columns=["file", "size (bytes)", "on disk (bytes)"],
)
listing


# %% [markdown]
# Four shards of 3.5 to 4.5 GB each, a few kilobytes on disk. Now open the folder as you would a downloaded one. To see what it costs we ask Linux how many bytes this process has read (`rchar` in `/proc/self/io`, which counts every `read()` call) before and after.

# %%
def bytes_read():
    """The bytes this process has read so far, as Linux counts them (None where /proc/self/io is missing)."""
    io = Path("/proc/self/io")
    if not io.exists():
        return None
    return int(next(line for line in io.read_text().splitlines() if line.startswith("rchar:")).split()[1])


size = int(listing['size (bytes)'].sum())
before = bytes_read()
model = models.from_pretrained(folder, device="cuda:0")
after = bytes_read()
if before is not None:
    print(f"read {after - before:,} bytes of a {size:,}-byte checkpoint ({(after - before) / size:.4%})")

p = next(model.parameters())
n = sum(t.numel() for t in model.parameters())
print(f"{type(model).__name__}: {n:,} parameters, {n * p.element_size():,} bytes of {p.dtype} on {p.device}")
print("fake:", fv.is_fake(p))

# %% [markdown]
# About 100 KB read out of 16 GB: the index (read twice: once to find the shards, once to check that every tensor it names is where it says), the first 12 KB of each shard (the header is about 9 KB, and Python reads in 4 KB pages), and `config.json`. No tensor data: `from_pretrained` reads each shard's 8-byte length and JSON header itself, where `safetensors.safe_open` would map the whole file. The 8,030,261,248 parameters are Llama-3.1-8B's published total, each shaped, typed (the dtype comes from the checkpoint's header, not from the config) and placed on the fake `cuda:0`.
#
# A checkpoint whose tensors disagree with its `config.json` (a missing tensor, another shape) gets a `FakeVizWarning` naming them (`strict=True` raises `CheckpointMismatchError` instead), so this is also a cheap way to check a checkpoint before downloading 16 GB of it: the headers are the first few kilobytes of each file.

# %% [markdown]
# ## 2. The KV cache, step by step
#
# `generate()` runs in two phases. The **prefill** runs the whole prompt through the model once and produces the first new token; each **decode** step then runs one token per sequence and produces the next. So that a decode step does not recompute attention over the whole prompt, every layer keeps the keys and values (K and V) of every position seen so far: the KV cache. Its size per token is fixed by the config:
#
# `2 (K and V) × layers × key/value heads × head_dim × bytes per element`
#
# Llama-3.1-8B has 32 query heads but only 8 key/value heads (grouped-query attention: four query heads share one K/V head), which makes its cache four times smaller than it would otherwise be.

# %%
c = model.config
per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # K and V, every layer, bf16
print(f"{c.num_hidden_layers} layers x {c.num_key_value_heads} KV heads x {c.head_dim} head_dim: "
      f"{per_token:,} bytes ({per_token // 2**10} KiB) per token")

# %% [markdown]
# `fv.plan` runs a model as it would run on the GPUs you name. With `new_tokens=N` the run is `generate()` of N tokens after a prompt of `seq` tokens, greedy, with transformers' default `DynamicCache`. Four prompts of 1,000 tokens, 8 new tokens each, on one H100:

# %%
BATCH, PROMPT, NEW = 4, 1000, 8
gen = fv.plan(model, gpus="H100", batch=BATCH, seq=PROMPT, new_tokens=NEW)
gen

# %% [markdown]
# The record knows where each step starts and stops (`trace.meta["steps"]`: first op, stop op, label), and `trace.memory()` has the live bytes per category after every op. Reading the KV cache at the end of each step:

# %%
mem = gen.trace.memory(allocator=False)
mem = mem[mem.device == "cuda:0"]
rows = []
for first, stop, label in gen.trace.meta["steps"]:
    step = mem[(mem.seq >= first) & (mem.seq < stop)]
    rows.append({
        "step": label,
        "ops": stop - first,
        "KV cache at the end (bytes)": int(step["KV cache"].iloc[-1]),
        "tokens per sequence": int(step["KV cache"].iloc[-1]) // (BATCH * per_token),
        "KV cache max in the step": int(step["KV cache"].max()),
        "live max (GiB)": round(step.total.max() / GiB, 3),
    })
growth = pd.DataFrame(rows)
growth

# %% [markdown]
# Read it row by row:
#
# * the prefill caches the whole prompt: 4 sequences × 1,000 tokens × 128 KiB = 524,288,000 bytes;
# * each decode step adds one token per sequence, 4 × 128 KiB = 512 KiB;
# * 8 new tokens take the prefill and **7** decode steps (the prefill already produces the first token), so the cache ends at 1,007 tokens per sequence;
# * within a step the cache briefly holds more than at its end: `DynamicCache` appends with `torch.cat`, which makes the longer tensor before the shorter one is freed, so one layer's K (or V) exists twice for a moment;
# * the live maximum is highest in the prefill, which runs 4 × 1,000 positions through every layer at once; each decode step runs the same 2,456 ops on one position per sequence. The weights (14.96 GiB) are most of every step's memory here.
#
# At 8 tokens the cache is small next to 15 GiB of weights. It grows linearly with both the batch and the context, though, and Llama-3.1-8B accepts 128K tokens. `fv.sweep` runs one plan per combination (`new_tokens=1`: the prefill alone, which is where the cache of a long prompt is made):

# %%
long = fv.sweep(model, gpus="H100", batch=[1, 8], seq=[8192, 65536], new_tokens=1, progress=False)
table = long[["batch", "seq", "cuda:0 kv_cache", "fits"]].rename(columns={"cuda:0 kv_cache": "KV cache (bytes)"})
table.insert(3, "KV cache (GiB)", long["cuda:0 kv_cache"] / GiB)
table.insert(4, "weights (GiB)", (long["cuda:0 weights"] / GiB).round(2))
table.insert(5, "peak (GiB)", (long["cuda:0 peak"] / GiB).round(1))
table

# %% [markdown]
# One sequence of 64K tokens holds 8 GiB of cache, as many as eight sequences of 8K; eight of 64K hold 64 GiB, four times the weights, and together with the prefill's activations they no longer fit on an 80 GB H100. This is why serving engines page the cache, quantize it, or cap batch × context. `fv.max_seq` and `fv.max_batch` search for the largest value that fits (an exercise below).
#
# ## 3. Placement on several GPUs: accelerate's map against a balanced one
#
# Now a different job: score 10 documents of 8,192 tokens each (an evaluation pass: one forward, a logit for every position) on a machine with four L4s (24 GB each). The weights (16 GB) fit in 96 GB easily, so the question is only how to split the layers.
#
# `transformers`' `from_pretrained(..., device_map="auto")` asks accelerate: `get_balanced_memory` gives each GPU a share of the *weights*, then `infer_auto_device_map` fills the GPUs in order. `fv.plan(..., device_map="auto")` calls those same functions with the GPUs' capacities, moves every module to its GPU, hooks each one so its inputs follow (as accelerate's hooks do) and runs the forward:

# %%
auto = fv.plan(model, gpus="4xL4", device_map="auto", batch=10, seq=8192)
print(auto.text)


# %% [markdown]
# The verdict names the device, the op and the module where the first allocation would fail. Two helpers make the plan readable: one folds the device map (one entry per module) into runs of layers, the other shows a plan's peaks per GPU in GiB.

# %%
def layout(device_map):
    """Which modules each device holds, consecutive layers folded: model.layers.0-6."""
    held = {}
    for name, device in device_map.items():
        m = re.fullmatch(r"(.*\.)(\d+)", name)
        items = held.setdefault(device, [])
        if m and items and isinstance(items[-1], list) and items[-1][0] == m[1] and items[-1][2] == int(m[2]) - 1:
            items[-1][2] = int(m[2])
        else:
            items.append([m[1], int(m[2]), int(m[2])] if m else name)
    for device, items in sorted(held.items()):
        folded = [i if isinstance(i, str) else f"{i[0]}{i[1]}" + (f"-{i[2]}" if i[2] > i[1] else "") for i in items]
        print(f"{device}: " + ", ".join(folded))


def in_gib(plan):
    kinds = ["weights", "kv_cache", "temporaries", "peak", "capacity"]
    df = plan.peaks[["device", *kinds, "fits"]].copy()
    df[kinds] = (df[kinds] / GiB).round(2)
    return df


layout(auto.device_map)
in_gib(auto)

# %%
oom = auto.first_oom
print(f"{oom['device']}: {oom['op']} in {oom['module']} asks for {oom['request']:,} bytes")
print(f"the logits, by hand: 10 x 8192 x {c.vocab_size:,} x 2 bytes = {10 * 8192 * c.vocab_size * 2:,}")

# %% [markdown]
# Accelerate sized the split by the weights alone: the first three GPUs get 3.8 to 4.9 GiB of layers each, and `cuda:3`, filled last, gets what is left: the last layer, the final norm and `lm_head`, 1.4 GiB. By weights it is the emptiest GPU. But `lm_head`'s output is the logits, one bf16 number per position and vocabulary entry: 10 × 8,192 × 128,256 × 2 bytes = 21 GB. That matrix multiplication is where `cuda:3` runs out, while the other three GPUs have room to spare. The map cannot know: it sees the parameters, not what the forward makes.
#
# Notice also the `kv_cache` column in a plain forward: in eval mode transformers fills a cache by default (`use_cache=True`), 10 × 8,192 × 128 KiB = 10 GiB over the four GPUs that a scoring loop never reads. Pass `use_cache=False` when you only need the logits.
#
# `device_map="balanced"` first runs the model placed by weights, measures what each module adds to its GPU's peak (weights, KV cache, activations, temporaries), then splits the modules so that the *peaks* are even:

# %%
balanced = fv.plan(model, gpus="4xL4", device_map="balanced", batch=10, seq=8192)
print(balanced.text)
layout(balanced.device_map)
in_gib(balanced)

# %% [markdown]
# `lm_head` now has `cuda:3` to itself, and the 32 layers are spread over the other three GPUs. Side by side:

# %%
pd.DataFrame({
    "auto: peak (GiB)": auto.peaks.set_index("device").peak / GiB,
    "balanced: peak (GiB)": balanced.peaks.set_index("device").peak / GiB,
    "capacity (GiB)": balanced.peaks.set_index("device").capacity / GiB,
}).round(2)

# %% [markdown]
# The price of splitting a model is moving activations between GPUs. `plan.transfers` lists the recorded copies per device boundary. The hidden states between two layer groups are 10 × 8,192 × 4,096 × 2 bytes = 671 MB per crossing. The copies into the GPU holding `model.rotary_emb` are the same hooks at work: the rotary module takes the hidden states as an argument (only for their dtype and device), and the hook moves them anyway, as accelerate's would.

# %%
balanced.transfers

# %% [markdown]
# The plan's record is a trace like any other: the explorer shows the four GPUs' peaks by category, the memory timeline of each, and the layer tree (click `lm_head` to see its share of `cuda:3`'s peak). Without a running kernel (on GitHub) you see its static summary.

# %%
balanced.explore()

# %% [markdown]
# Finally, delete the checkpoint folder: its files are sparse here, but a copy or an archive of it would write all 16 GB.

# %%
shutil.rmtree(folder)

# %% [markdown]
# ## Exercises
#
# 1. **Mixed dtypes.** Write the checkpoint again with the norms' tensors in `F32` (give `write_shard` `shapes[name].float()` for names containing `norm`). `from_pretrained` takes each tensor's dtype from the header: check `model.model.norm.weight.dtype`, and what `dtype="bf16"` does.
# 2. **Without grouped-query attention.** Build `models.build("meta-llama/Llama-3.1-8B", num_key_value_heads=32)` and compute its KV cache per token by the formula. Run the same `fv.plan(..., new_tokens=8)` and check the last row of the growth table against your number.
# 3. **The longest prompt.** `fv.max_seq(model, gpus="H100", batch=8, new_tokens=1)` searches for the longest prompt 8 sequences can have on one H100. How much of its peak is KV cache? What does `gpus="H200"` give?
# 4. **Cheaper scoring.** The scoring job above only needs the logits of each position, often only the log-probability of the next token. Run `fv.max_batch(model, gpus="4xL4", seq=8192)` with `device_map="auto"` and with `"balanced"`: how many documents fit at once with each map?
# 5. **Two GPUs.** Repeat section 3 on `"2xL4"` with batch 4. Does the `auto` map fit? Where is the peak of each GPU, and what sets it (`plan.first_oom`, `plan.peaks`)?
