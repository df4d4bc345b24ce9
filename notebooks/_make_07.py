"""Tutorial 07: inference. A Llama-3.1-8B checkpoint folder opened from its safetensors headers only, the KV cache
over ``generate``'s prefill and decode steps, and the model placed on four GPUs by accelerate's ``device_map="auto"``
and by fakeviz's ``"balanced"``.

``python notebooks/_make_07.py --execute`` writes ``notebooks/07_inference.ipynb`` with its outputs; the tests
(``tests/notebook/test_tutorial_07.py``) check the bytes read against the checkpoint's size, the KV cache against
``2 * layers * kv_heads * head_dim * tokens * 2`` from the config, the "auto" map against accelerate's own
``infer_auto_device_map``, and the failing request against the logits' size.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code, md, write  # noqa: E402

cells = [
    md(
        "# 07 · Inference: checkpoints, the KV cache and placement on GPUs\n"
        "\n"
        "Before you rent GPUs to serve or evaluate a model, three questions come up: what is in this checkpoint, "
        "how much memory does generation take as the answer gets longer, and how do I split the model over the "
        "GPUs I have? All three can be answered on a laptop with fake tensors: the model is built with every "
        "shape, dtype and device it would have, but no data.\n"
        "\n"
        "In this notebook you will learn:\n"
        "\n"
        "* how a safetensors checkpoint is laid out, and how `models.from_pretrained(folder)` builds the fake "
        "model from a 16 GB Llama-3.1-8B checkpoint by reading about 100 KB of it (the headers);\n"
        "* how the **KV cache** grows over `generate()`'s prefill and decode steps, and how to compute it from "
        "the config: `2 × layers × kv_heads × head_dim × tokens × bytes per element`;\n"
        "* what long prompts and large batches cost (a sweep over batch and sequence length);\n"
        '* how to place a model on several GPUs: accelerate\'s `device_map="auto"` (what '
        '`from_pretrained(device_map="auto")` uses) balances the *weights*, and fails here where fakeviz\'s '
        '`"balanced"`, which balances the measured *peaks*, fits.\n'
        "\n"
        "The model is the published Llama-3.1-8B at full size (32 layers): fake tensors cost nothing, so there is "
        "no reason to shrink it. The whole notebook runs in well under a minute on a laptop CPU."
    ),
    code(
        "import json\n"
        "import re\n"
        "import shutil\n"
        "import struct\n"
        "from pathlib import Path\n"
        "\n"
        "import pandas as pd\n"
        "import torch\n"
        "import transformers\n"
        "\n"
        "import fakeviz as fv\n"
        "from fakeviz import models\n"
        "\n"
        "transformers.logging.set_verbosity_error()  # keep generate()'s advice about attention masks out of the way\n"
        'pd.set_option("display.width", 140)\n'
        "GiB = 2**30"
    ),
    md(
        "## 1. A checkpoint folder, read from its headers\n"
        "\n"
        "A Hugging Face checkpoint is a folder: `config.json` (the architecture and its sizes), the weights in "
        "one or more `.safetensors` files, and, when there are several, `model.safetensors.index.json` saying "
        "which file holds which tensor. A safetensors file is three things in a row:\n"
        "\n"
        "1. 8 bytes: the length `N` of the header, a little-endian integer;\n"
        "2. `N` bytes of JSON: for every tensor its dtype, shape and the byte range of its data;\n"
        "3. the data: every tensor's bytes, back to back.\n"
        "\n"
        "Everything a fake model needs (names, shapes, dtypes) is in the first two parts. We have no weights "
        "here (no network, and 16 GB), so we write such a folder ourselves from the published config: the "
        "`config.json` and the headers for real, and the data region left as a *hole*. The file gets its full "
        "size, but a sparse file takes no disk space for bytes that were never written. A real download has "
        "the same headers and sizes; only the holes are filled."
    ),
    code(
        'config = models.config("meta-llama/Llama-3.1-8B")  # the published config.json, shipped with fakeviz\n'
        'folder = Path("llama-3.1-8b-checkpoint")\n'
        "folder.mkdir(exist_ok=True)\n"
        'config.to_json_file(folder / "config.json")\n'
        "\n"
        'shapes = models.build(config, device="meta").state_dict()  # every tensor\'s name, shape and dtype\n'
        'print(len(shapes), "tensors, for example:")\n'
        "for name in list(shapes)[:3]:\n"
        '    print(f"  {name}: {tuple(shapes[name].shape)} {shapes[name].dtype}")'
    ),
    md(
        "Writing one shard follows the three parts above. `f.truncate` extends the file to its full length "
        "without writing the data bytes: that is the hole."
    ),
    code(
        'DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}\n'
        "\n"
        "\n"
        "def write_shard(path, tensors):\n"
        '    """A safetensors file: the header length, the JSON header, then the data region (left as a hole)."""\n'
        "    header, offset = {}, 0\n"
        "    for name, t in tensors.items():\n"
        "        size = t.numel() * t.element_size()\n"
        '        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}\n'
        "        offset += size\n"
        "    raw = json.dumps(header).encode()\n"
        '    raw += b" " * (-len(raw) % 8)  # the format pads the header to a multiple of 8 bytes\n'
        '    with open(path, "wb") as f:\n'
        '        f.write(struct.pack("<Q", len(raw)) + raw)\n'
        "        f.truncate(f.tell() + offset)  # the full size; the data bytes are never written\n"
        "\n"
        "\n"
        "names = list(shapes)  # four shards, as the published Llama-3.1-8B has\n"
        'files = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]\n'
        "weight_map = {}\n"
        "for i, file in enumerate(files):\n"
        "    part = names[i * len(names) // 4 : (i + 1) * len(names) // 4]\n"
        "    write_shard(folder / file, {name: shapes[name] for name in part})\n"
        "    weight_map.update(dict.fromkeys(part, file))\n"
        'index = {"metadata": {}, "weight_map": weight_map}\n'
        '(folder / "model.safetensors.index.json").write_text(json.dumps(index))\n'
        "\n"
        "listing = pd.DataFrame(\n"
        "    [(p.name, p.stat().st_size, p.stat().st_blocks * 512) for p in sorted(folder.iterdir())],\n"
        '    columns=["file", "size (bytes)", "on disk (bytes)"],\n'
        ")\n"
        "listing"
    ),
    md(
        "Four shards of 3.5 to 4.5 GB each, a few kilobytes on disk. Now open the folder as you would a "
        "downloaded one. To see what it costs we ask Linux how many bytes this process has read "
        "(`rchar` in `/proc/self/io`, which counts every `read()` call) before and after."
    ),
    code(
        "def bytes_read():\n"
        '    """The bytes this process has read so far, as Linux counts them (None where /proc/self/io is missing)."""\n'
        '    io = Path("/proc/self/io")\n'
        "    if not io.exists():\n"
        "        return None\n"
        '    return int(next(line for line in io.read_text().splitlines() if line.startswith("rchar:")).split()[1])\n'
        "\n"
        "\n"
        "size = int(listing['size (bytes)'].sum())\n"
        "before = bytes_read()\n"
        'model = models.from_pretrained(folder, device="cuda:0")\n'
        "after = bytes_read()\n"
        "if before is not None:\n"
        '    print(f"read {after - before:,} bytes of a {size:,}-byte checkpoint ({(after - before) / size:.4%})")\n'
        "\n"
        "p = next(model.parameters())\n"
        "n = sum(t.numel() for t in model.parameters())\n"
        'print(f"{type(model).__name__}: {n:,} parameters, {n * p.element_size():,} bytes of {p.dtype} on {p.device}")\n'
        'print("fake:", fv.is_fake(p))'
    ),
    md(
        "About 100 KB read out of 16 GB: the index (read twice: once to find the shards, once to check "
        "that every tensor it names is where it says), the first 12 KB of each shard (the header is about "
        "9 KB, and Python reads in 4 KB pages), and `config.json`. No tensor data: `from_pretrained` reads "
        "each shard's 8-byte length and JSON header itself, where `safetensors.safe_open` would map the whole "
        "file. The 8,030,261,248 parameters are Llama-3.1-8B's published total, each shaped, typed (the "
        "dtype comes from the checkpoint's header, not from the config) and placed on the fake `cuda:0`.\n"
        "\n"
        "A checkpoint whose tensors disagree with its `config.json` (a missing tensor, another shape) gets a "
        "`FakeVizWarning` naming them (`strict=True` raises `CheckpointMismatchError` instead), so this is "
        "also a cheap way to check a checkpoint before downloading 16 GB of it: the headers are the first "
        "few kilobytes of each file."
    ),
    md(
        "## 2. The KV cache, step by step\n"
        "\n"
        "`generate()` runs in two phases. The **prefill** runs the whole prompt through the model once and "
        "produces the first new token; each **decode** step then runs one token per sequence and produces the "
        "next. So that a decode step does not recompute attention over the whole prompt, every layer keeps the "
        "keys and values (K and V) of every position seen so far: the KV cache. Its size per token is fixed by "
        "the config:\n"
        "\n"
        "`2 (K and V) × layers × key/value heads × head_dim × bytes per element`\n"
        "\n"
        "Llama-3.1-8B has 32 query heads but only 8 key/value heads (grouped-query attention: four query heads "
        "share one K/V head), which makes its cache four times smaller than it would otherwise be."
    ),
    code(
        "c = model.config\n"
        "per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # K and V, every layer, bf16\n"
        'print(f"{c.num_hidden_layers} layers x {c.num_key_value_heads} KV heads x {c.head_dim} head_dim: "\n'
        '      f"{per_token:,} bytes ({per_token // 2**10} KiB) per token")'
    ),
    md(
        "`fv.plan` runs a model as it would run on the GPUs you name. With `new_tokens=N` the run is "
        "`generate()` of N tokens after a prompt of `seq` tokens, greedy, with transformers' default "
        "`DynamicCache`. Four prompts of 1,000 tokens, 8 new tokens each, on one H100:"
    ),
    code(
        "BATCH, PROMPT, NEW = 4, 1000, 8\n"
        'gen = fv.plan(model, gpus="H100", batch=BATCH, seq=PROMPT, new_tokens=NEW)\n'
        "gen"
    ),
    md(
        'The record knows where each step starts and stops (`trace.meta["steps"]`: first op, stop op, label), '
        "and `trace.memory()` has the live bytes per category after every op. Reading the KV cache at the end "
        "of each step:"
    ),
    code(
        "mem = gen.trace.memory(allocator=False)\n"
        'mem = mem[mem.device == "cuda:0"]\n'
        "rows = []\n"
        'for first, stop, label in gen.trace.meta["steps"]:\n'
        "    step = mem[(mem.seq >= first) & (mem.seq < stop)]\n"
        "    rows.append({\n"
        '        "step": label,\n'
        '        "ops": stop - first,\n'
        '        "KV cache at the end (bytes)": int(step["KV cache"].iloc[-1]),\n'
        '        "tokens per sequence": int(step["KV cache"].iloc[-1]) // (BATCH * per_token),\n'
        '        "KV cache max in the step": int(step["KV cache"].max()),\n'
        '        "live max (GiB)": round(step.total.max() / GiB, 3),\n'
        "    })\n"
        "growth = pd.DataFrame(rows)\n"
        "growth"
    ),
    md(
        "Read it row by row:\n"
        "\n"
        "* the prefill caches the whole prompt: 4 sequences × 1,000 tokens × 128 KiB = 524,288,000 bytes;\n"
        "* each decode step adds one token per sequence, 4 × 128 KiB = 512 KiB;\n"
        "* 8 new tokens take the prefill and **7** decode steps (the prefill already produces the first token), "
        "so the cache ends at 1,007 tokens per sequence;\n"
        "* within a step the cache briefly holds more than at its end: `DynamicCache` appends with "
        "`torch.cat`, which makes the longer tensor before the shorter one is freed, so one layer's K (or V) "
        "exists twice for a moment;\n"
        "* the live maximum is highest in the prefill, which runs 4 × 1,000 positions through every layer at "
        "once; each decode step runs the same 2,456 ops on one position per sequence. The weights (14.96 GiB) "
        "are most of every step's memory here.\n"
        "\n"
        "At 8 tokens the cache is small next to 15 GiB of weights. It grows linearly with both the batch and "
        "the context, though, and Llama-3.1-8B accepts 128K tokens. `fv.sweep` runs one plan per combination "
        "(`new_tokens=1`: the prefill alone, which is where the cache of a long prompt is made):"
    ),
    code(
        'long = fv.sweep(model, gpus="H100", batch=[1, 8], seq=[8192, 65536], new_tokens=1, progress=False)\n'
        'table = long[["batch", "seq", "cuda:0 kv_cache", "fits"]].rename(columns={"cuda:0 kv_cache": "KV cache (bytes)"})\n'
        'table.insert(3, "KV cache (GiB)", long["cuda:0 kv_cache"] / GiB)\n'
        'table.insert(4, "weights (GiB)", (long["cuda:0 weights"] / GiB).round(2))\n'
        'table.insert(5, "peak (GiB)", (long["cuda:0 peak"] / GiB).round(1))\n'
        "table"
    ),
    md(
        "One sequence of 64K tokens holds 8 GiB of cache, as many as eight sequences of 8K; eight of 64K hold "
        "64 GiB, four times the weights, and together with the prefill's activations they no longer fit on an "
        "80 GB H100. This is why serving engines page the cache, quantize it, or cap batch × context. "
        "`fv.max_seq` and `fv.max_batch` search for the largest value that fits (an exercise below).\n"
        "\n"
        "## 3. Placement on several GPUs: accelerate's map against a balanced one\n"
        "\n"
        "Now a different job: score 10 documents of 8,192 tokens each (an evaluation pass: one forward, a "
        "logit for every position) on a machine with four L4s (24 GB each). The weights (16 GB) fit in 96 GB "
        "easily, so the question is only how to split the layers.\n"
        "\n"
        '`transformers`\' `from_pretrained(..., device_map="auto")` asks accelerate: `get_balanced_memory` '
        "gives each GPU a share of the *weights*, then `infer_auto_device_map` fills the GPUs in order. "
        '`fv.plan(..., device_map="auto")` calls those same functions with the GPUs\' capacities, moves every '
        "module to its GPU, hooks each one so its inputs follow (as accelerate's hooks do) and runs the forward:"
    ),
    code('auto = fv.plan(model, gpus="4xL4", device_map="auto", batch=10, seq=8192)\nprint(auto.text)'),
    md(
        "The verdict names the device, the op and the module where the first allocation would fail. Two "
        "helpers make the plan readable: one folds the device map (one entry per module) into runs of layers, "
        "the other shows a plan's peaks per GPU in GiB."
    ),
    code(
        "def layout(device_map):\n"
        '    """Which modules each device holds, consecutive layers folded: model.layers.0-6."""\n'
        "    held = {}\n"
        "    for name, device in device_map.items():\n"
        '        m = re.fullmatch(r"(.*\\.)(\\d+)", name)\n'
        "        items = held.setdefault(device, [])\n"
        "        if m and items and isinstance(items[-1], list) and items[-1][0] == m[1] and items[-1][2] == int(m[2]) - 1:\n"
        "            items[-1][2] = int(m[2])\n"
        "        else:\n"
        "            items.append([m[1], int(m[2]), int(m[2])] if m else name)\n"
        "    for device, items in sorted(held.items()):\n"
        '        folded = [i if isinstance(i, str) else f"{i[0]}{i[1]}" + (f"-{i[2]}" if i[2] > i[1] else "") for i in items]\n'
        '        print(f"{device}: " + ", ".join(folded))\n'
        "\n"
        "\n"
        "def in_gib(plan):\n"
        '    kinds = ["weights", "kv_cache", "temporaries", "peak", "capacity"]\n'
        '    df = plan.peaks[["device", *kinds, "fits"]].copy()\n'
        "    df[kinds] = (df[kinds] / GiB).round(2)\n"
        "    return df\n"
        "\n"
        "\n"
        "layout(auto.device_map)\n"
        "in_gib(auto)"
    ),
    code(
        "oom = auto.first_oom\n"
        "print(f\"{oom['device']}: {oom['op']} in {oom['module']} asks for {oom['request']:,} bytes\")\n"
        'print(f"the logits, by hand: 10 x 8192 x {c.vocab_size:,} x 2 bytes = {10 * 8192 * c.vocab_size * 2:,}")'
    ),
    md(
        "Accelerate sized the split by the weights alone: the first three GPUs get 3.8 to 4.9 GiB of layers "
        "each, and `cuda:3`, filled last, gets what is left: the last layer, the final norm and `lm_head`, "
        "1.4 GiB. By weights it is the emptiest GPU. But `lm_head`'s output is the logits, one bf16 number "
        "per position and vocabulary entry: 10 × 8,192 × 128,256 × 2 bytes = 21 GB. That matrix "
        "multiplication is where `cuda:3` runs out, while the other three GPUs have room to spare. The map "
        "cannot know: it sees the parameters, not what the forward makes.\n"
        "\n"
        "Notice also the `kv_cache` column in a plain forward: in eval mode transformers fills a cache by "
        "default (`use_cache=True`), 10 × 8,192 × 128 KiB = 10 GiB over the four GPUs that a scoring loop "
        "never reads. Pass `use_cache=False` when you only need the logits.\n"
        "\n"
        '`device_map="balanced"` first runs the model placed by weights, measures what each module adds to '
        "its GPU's peak (weights, KV cache, activations, temporaries), then splits the modules so that the "
        "*peaks* are even:"
    ),
    code(
        'balanced = fv.plan(model, gpus="4xL4", device_map="balanced", batch=10, seq=8192)\n'
        "print(balanced.text)\n"
        "layout(balanced.device_map)\n"
        "in_gib(balanced)"
    ),
    md("`lm_head` now has `cuda:3` to itself, and the 32 layers are spread over the other three GPUs. Side by side:"),
    code(
        "pd.DataFrame({\n"
        '    "auto: peak (GiB)": auto.peaks.set_index("device").peak / GiB,\n'
        '    "balanced: peak (GiB)": balanced.peaks.set_index("device").peak / GiB,\n'
        '    "capacity (GiB)": balanced.peaks.set_index("device").capacity / GiB,\n'
        "}).round(2)"
    ),
    md(
        "The price of splitting a model is moving activations between GPUs. `plan.transfers` lists the "
        "recorded copies per device boundary. The hidden states between two layer groups are 10 × 8,192 × "
        "4,096 × 2 bytes = 671 MB per crossing. The copies into the GPU holding `model.rotary_emb` are the "
        "same hooks at work: the rotary module takes the hidden states as an argument (only for their dtype "
        "and device), and the hook moves them anyway, as accelerate's would."
    ),
    code("balanced.transfers"),
    md(
        "The plan's record is a trace like any other: the explorer shows the four GPUs' peaks by category, the "
        "memory timeline of each, and the layer tree (click `lm_head` to see its share of `cuda:3`'s peak). "
        "Without a running kernel (on GitHub) you see its static summary."
    ),
    code("balanced.explore()"),
    md(
        "Finally, delete the checkpoint folder: its files are sparse here, but a copy or an archive of it "
        "would write all 16 GB."
    ),
    code("shutil.rmtree(folder)"),
    md(
        "## Exercises\n"
        "\n"
        "1. **Mixed dtypes.** Write the checkpoint again with the norms' tensors in `F32` (give `write_shard` "
        "`shapes[name].float()` for names containing `norm`). `from_pretrained` takes each tensor's dtype from "
        'the header: check `model.model.norm.weight.dtype`, and what `dtype="bf16"` does.\n'
        '2. **Without grouped-query attention.** Build `models.build("meta-llama/Llama-3.1-8B", '
        "num_key_value_heads=32)` and compute its KV cache per token by the formula. Run the same `fv.plan(..., "
        "new_tokens=8)` and check the last row of the growth table against your number.\n"
        '3. **The longest prompt.** `fv.max_seq(model, gpus="H100", batch=8, new_tokens=1)` searches for the '
        "longest prompt 8 sequences can have on one H100. How much of its peak is KV cache? What does "
        '`gpus="H200"` give?\n'
        "4. **Cheaper scoring.** The scoring job above only needs the logits of each position, often only the "
        'log-probability of the next token. Run `fv.max_batch(model, gpus="4xL4", seq=8192)` with '
        '`device_map="auto"` and with `"balanced"`: how many documents fit at once with each map?\n'
        '5. **Two GPUs.** Repeat section 3 on `"2xL4"` with batch 4. Does the `auto` map fit? Where is the '
        "peak of each GPU, and what sets it (`plan.first_oom`, `plan.peaks`)?"
    ),
]

if __name__ == "__main__":
    write(cells, "07_inference.ipynb")
