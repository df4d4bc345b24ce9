# Tutorial 05: aliasing. Views share a storage, tied weights are one storage with two names, in-place writes allocate
# nothing; all of it as rows of `trace.storages` and edges of the alias graph.
#
# `python notebooks/build.py 05 --execute` writes `notebooks/05_aliasing.ipynb` from these cells and runs it.
#
# The tests (`tests/notebook/test_tutorial_05.py`) run the notebook's own `views_and_writes` on real CPU tensors and
# count storages by `untyped_storage().data_ptr()`, and check the GPT-2 counts against the published total and a real
# CPU GPT-2.

# %% [markdown]
# # 05 · Aliasing: views, tied weights and in-place writes
#
# A PyTorch tensor is a *view* onto memory: a **storage** (the bytes) plus an offset, a shape and a stride saying how to read them. Many tensors can share one storage, and memory is spent per storage, not per tensor. Fake tensors keep that structure exactly (they carry a fake storage with an identity, only without data), so fakeviz can tell you which tensors are the same memory without allocating any.
#
# In this notebook you will learn:
#
# * why `view`, `t()`, slicing and `x[0]` make new tensors but no new memory, and how to see that in `trace.storages` (one row per storage) and `trace.aliases(...)` (every tensor on a storage);
# * how in-place writes (`add_`, `x[...] = ...`) show up: as *write* edges with the op that wrote, and why autograd refuses some of them (fake tensors refuse them too, before you spend a GPU-hour);
# * what **tied weights** are (GPT-2's input embedding and output projection are one tensor), why a per-layer summary counts GPT-2 as 163 M parameters when it has 124,439,808, and how the alias graph and the layer tree show the tie;
# * how to read the alias graph: `trace.alias_graph(around=...)` as tables, the explorer's alias panel and `fakeviz.views.alias_graph_figure` as pictures.
#
# Everything runs on a laptop CPU in a few seconds; the GPU is fake (`cuda:0`).

# %%
import pandas as pd
import torch

import fakeviz as fv
from fakeviz import models

pd.set_option("display.width", 140)
pd.set_option("display.max_colwidth", 60)


# %% [markdown]
# ## 1. Views: new tensors, the same storage
#
# Here is a small function that makes one tensor, takes three views of it, writes into it twice and finally makes a new tensor out of place. It takes the device as an argument, so that we can run the very same code on fake `cuda:0` and on real CPU tensors and compare. Read the comments: each line says whether it should allocate.

# %%
def views_and_writes(device):
    x = torch.zeros(4, 6, device=device)    # new storage: 4 * 6 float32 = 96 bytes
    v = x.view(2, 12)                         # a view: same storage, another shape
    t = x.t()                                 # a view: same storage, strides swapped
    s = x[1:3]                                # a view: same storage, starts at element 6
    s.add_(1.0)                               # in-place write through the slice: no new memory
    r = torch.arange(6.0, device=device)      # new storage: 24 bytes
    x[0] = r                                  # setitem = select (a view) + copy_ (a write)
    y = x * 2                                 # out of place: new storage, 96 bytes
    return {"x": x, "v": v, "t": t, "s": s, "r": r, "y": y}


with fv.record(device="cuda:0") as trace:
    tensors = views_and_writes("cuda:0")
print(trace.oplog())

# %% [markdown]
# The op log names every tensor `$N` as it appears. Look at the view ops (`view`, `t`, `slice`, `select`): each makes a new `$N` with its own shape, but they all read `$0`'s memory. The in-place ops (`add_`, `copy_`) write into a tensor that already exists: their output is their input (`$3 = add_($3, 1.0)`).
#
# `trace.storages` has one row per *storage*, the unit that costs memory. Six tensors were returned, but count the rows:

# %%
st = trace.storages
display(st[["storage", "device", "nbytes", "category", "op"]])
own = sum(t.numel() * t.element_size() for t in tensors.values())
print(f"{len(st)} storages, {st.nbytes.sum()} bytes on {st.device.iloc[0]}; "
      f"the six tensors' own sizes add up to {own} bytes")

# %% [markdown]
# Three storages (x's 96 bytes, r's 24, y's 96) hold all six tensors. Adding up each tensor's `numel() * element_size()` gives more than twice as much, because `v`, `t` and `s` are counted again although they cost nothing. This is the first reason to count storages, never tensors.
#
# Which tensor lives where? A fake tensor carries its own offset, shape and stride, and `trace.aliases(tensor)` lists every tensor that shares its storage (so its first row's `storage` is the storage id):

# %%
where = pd.DataFrame(
    {
        "name": list(tensors),
        "storage": [int(trace.aliases(t).storage.iloc[0]) for t in tensors.values()],
        "shape": [tuple(t.shape) for t in tensors.values()],
        "stride": [t.stride() for t in tensors.values()],
        "offset": [t.storage_offset() for t in tensors.values()],
        "contiguous": [t.is_contiguous() for t in tensors.values()],
    }
)
where

# %% [markdown]
# `x`, `v`, `t` and `s` are storage 0. `t` reads it with strides `(1, 6)` (so it is not contiguous: a later `.contiguous()` would copy), and `s` starts 6 elements in (the second row). None of this needed a value: shape, stride, offset and storage identity are exactly what a fake tensor carries.
#
# Is that what real PyTorch does? Run the same function on real CPU tensors and group the tensors by the address of their storage, `untyped_storage().data_ptr()`:

# %%
real = views_and_writes("cpu")
groups = {}
for name, t in real.items():
    groups.setdefault(t.untyped_storage().data_ptr(), []).append(name)
for names in groups.values():
    first = real[names[0]]
    print(f"{first.untyped_storage().nbytes():4d} bytes shared by {names}")
print("the values the fake run never computed:")
print(real["x"])

# %% [markdown]
# The same three groups and the same bytes. The real run also has values (row 0 is `arange`, rows 1-2 got the `+1`); the fake run skipped that arithmetic but kept everything about memory.
#
# ## 2. Every tensor on a storage: `trace.aliases`
#
# `trace.aliases(x)` takes a recorded tensor, a `$N` id or a parameter name and returns every tensor on the same storage, in the order they were made, with the op that made it, the tensor it views (`base`, a `$N` id, -1 for none) and how many in-place ops wrote to it (`writes`). It includes `$5`, the row `x[0] = r` selected internally: you never named it, but it is how setitem writes.

# %%
trace.aliases(tensors["x"])[["tensor", "op", "shape", "stride", "storage_offset", "base", "writes"]]

# %% [markdown]
# ## 3. The alias graph
#
# `trace.alias_graph(around=...)` returns the same facts as two DataFrames, `nodes` and `edges`. Node ids are `s0` for storage 0 and `t3` for tensor `$3`. Edges have a kind:
#
# * **storage**: a tensor lives in a storage;
# * **view**: base tensor -> the view made from it, with the view op;
# * **write**: an in-place op wrote through a tensor into the storage, with the op and its position `seq` in the op log;
# * **name** / **tied**: a parameter name points at its tensor (tied when one tensor has several names; see part 5).

# %%
nodes, edges = trace.alias_graph(around=tensors["x"])
print(edges[edges.kind != "storage"].to_string(index=False))

# %% [markdown]
# Four view edges (`view`, `t`, `slice`, `select`) fan out of `$0`, and two write edges land on storage 0: `add_` through the slice `$3` and `copy_` through the row `$5`.
#
# The same graph is drawn in the explorer's alias panel (`trace.explore()`, part 5 opens it on GPT-2) and by `views.alias_graph_figure(trace, around="$0")`, a plotly figure to put in your own dashboards: squares are storages (coloured by memory category), circles tensors, diamonds parameter names; a red ring marks a tensor written in place, orange edges a tie, and hovering an edge names its op.

# %% [markdown]
# ## 4. In-place writes: free memory, but autograd has opinions
#
# An in-place op allocates nothing, which is why optimizers and `torch.no_grad()` initialisers use them. But autograd needs the old values of anything it saved, so it refuses some writes. A classic: writing into a *view of a leaf* that requires grad (a slice of a weight, outside `torch.no_grad()`). Fake tensors run autograd's checks too, so the mistake shows up here, on a laptop, with PyTorch's own message:

# %% tags=["raises-exception"]
with fv.fake_mode(device="cuda:0"):
    layer = torch.nn.Linear(4, 4)
    layer.weight[0].add_(1.0)  # a view of a leaf that requires grad, written in place

# %% [markdown]
# The fix is what initialisers do: `with torch.no_grad(): layer.weight[0].add_(1.0)`. Part 5 shows GPT-2's initialiser doing exactly that to its embedding, twice.
#
# ## 5. Tied weights: one storage, two names
#
# GPT-2 reads tokens through an embedding `wte` (50257 x 768) and turns the last hidden state back into 50257 logits through `lm_head`, a linear layer whose weight has the same shape. GPT-2 *ties* them: `lm_head.weight` **is** `transformer.wte.weight`, one tensor registered under two names. Let us build the real-size GPT-2 (124 M parameters, 0.5 GB in float32) on fake `cuda:0` and run one forward and backward on 64 tokens; it takes about a second and allocates nothing.

# %%
with fv.record(device="cuda:0") as gpt2:
    model = models.build("openai-community/gpt2")
    ids = torch.randint(0, model.config.vocab_size, (1, 64), device="cuda:0")
    model(ids, labels=ids).loss.backward()
print(model.lm_head.weight is model.transformer.wte.weight)

# %% [markdown]
# How many parameters does GPT-2 have? It depends on whether you count the tie once. `trace.modules` (the layer tree) counts each tensor once; so does `model.parameters()`, which skips a tensor it has already yielded. But a per-layer summary (torchinfo-style tables add up each module's own parameters) and a sum over `state_dict()` meet the shared tensor twice, once as `wte` and once as `lm_head`:

# %%
published = models.catalog().set_index("name").at["openai-community/gpt2", "parameters"]
once = int(gpt2.modules.params.iloc[0])
per_module = sum(p.numel() for m in model.modules() for p in m.parameters(recurse=False))
in_state_dict = sum(v.numel() for v in model.state_dict().values())
print(f"published (Hugging Face):          {published:,}")
print(f"counted once (trace.modules):      {once:,}")
print(f"model.parameters():                {sum(p.numel() for p in model.parameters()):,}")
print(f"per-module sum (torchinfo-style):  {per_module:,}")
print(f"state_dict() sum:                  {in_state_dict:,}")
print(f"overcount = {per_module - once:,} = vocab {model.config.vocab_size} x width {model.config.n_embd}")

# %% [markdown]
# The published 124,439,808 is the count with the tie counted once. The per-module figure is too high by exactly one 50257 x 768 matrix (38.6 M parameters, 154 MB in float32), and a memory estimate built on it would be too.
#
# In the record the tie is a single storage carrying both names. Look at the Parameter storages, and at the one Parameter storage that did *not* survive:

# %%
gst = gpt2.storages
params = gst[gst.category == "Parameter"]
alive, dropped = params[params.free_seq < 0], params[params.free_seq >= 0]
grads = gst[gst.category == "Gradient"]
print(f"Parameter storages alive: {len(alive)} ({alive.nbytes.sum():,} bytes)")
print(f"Gradient storages:        {len(grads)} ({grads.nbytes.sum():,} bytes)")
print(f"Parameter storages made and dropped while building: {len(dropped)} ({dropped.nbytes.sum():,} bytes)")
tied = gst[gst.name.astype(str).str.contains("|", regex=False)]
tied[["storage", "nbytes", "name", "roles"]]

# %% [markdown]
# Read the four numbers:
#
# * 148 parameter storages alive, 497,759,232 bytes = 4 bytes x 124,439,808: the tie costs its matrix once;
# * 148 gradients of the same total: autograd accumulates both uses of the tied weight (the embedding lookup and the output projection) into **one** `.grad`;
# * one 154 MB parameter storage made and dropped: `nn.Linear`'s constructor gave `lm_head` a weight of its own, and tying replaced it (a real build allocates and frees it just the same; on a real GPU that is a transient 154 MB);
# * the surviving storage has two names, `wte.weight|lm_head.weight`.
#
# `aliases` accepts a parameter name (or its last part) and shows every tensor on that storage: the `$0` that `torch.empty` made in `nn.Embedding`'s constructor; `$1`, the `nn.Parameter` wrapping it (a new tensor object on the same storage, not a view, so its `base` is -1), written twice by `normal_` (once by `nn.Embedding`'s own initialiser, once by transformers' `_init_weights`, both under `no_grad`); and the `t()` view `lm_head` takes of it in the forward pass, transposed back in the backward pass.

# %%
gpt2.aliases("lm_head.weight")[["tensor", "op", "module", "shape", "base", "names", "writes"]]

# %% [markdown]
# The alias graph around `lm_head.weight` shows the tie as two **tied** edges (one per name) into the same tensor, plus its views and the two `normal_` writes:

# %%
nodes, edges = gpt2.alias_graph(around="lm_head.weight")
print(edges[edges.kind != "storage"].to_string(index=False))

# %% [markdown]
# The layer tree knows about the tie too: `tied` marks every module whose parameters are shared with another, and `tied_with` says where else they live. Since both `transformer` and `lm_head` contain the shared matrix, each module's `params` includes it, and the root counts it once:

# %%
gpt2.modules.query("tied")[["path", "params", "param_bytes", "tied_with"]]

# %% [markdown]
# Finally, all of it in one picture. The explorer opens here with `lm_head` selected: its alias panel is redrawn around that module's parameters (the tied matrix with its two names, its gradient, its views), linked to the layer tree, the memory bars and the op table; click another module to move the graph. On GitHub, or in a notebook saved without widget state, you see its static summary instead (the peak memory by category).

# %%
gpt2.explore("H100", selected_module="GPT2LMHeadModel.lm_head")

# %% [markdown]
# ## Exercises
#
# 1. Add `c = t.contiguous()` and `f = x.flatten()` to `views_and_writes`. Which one makes a new storage and which one does not? Check with `trace.storages` and then with `data_ptr()` on the real run (hint: `flatten` of a contiguous tensor is a view; `t` is not contiguous).
# 2. Build `openai-community/gpt2-large` with `models.build` and compute its per-module and counted-once parameter counts as in part 5. Is the difference again vocab x width? Compare the counted-once figure with the catalog's `parameters` column.
# 3. Build a model without tying: `models.build("openai-community/gpt2", tie_word_embeddings=False)`. How many Parameter storages and bytes are alive now, and what does `gpt2.aliases("lm_head.weight")` show?
# 4. Record `torch.optim.AdamW(model.parameters()).step()` after the backward in part 5. How many optimizer-state storages does the tied weight get (`trace.storages.query("category == 'Optimizer state'")`, column `owner`)?
# 5. In part 4, wrap the write in `torch.no_grad()` and look at `trace.alias_graph(around="weight")` of a recording of it: where is the write edge?
