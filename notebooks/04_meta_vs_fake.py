# Tutorial 04: meta-device idioms, what the meta device loses, and what fake tensors keep.
#
# `python notebooks/build.py 04 --execute` writes `notebooks/04_meta_vs_fake.ipynb` from these cells and runs it.
# `tests/notebook/test_tutorial_04.py` checks what it teaches.

# %% [markdown]
# # 04 · Meta versus fake
#
# PyTorch has had a way to build models without memory for years: the **meta** device. A meta tensor has a shape and a dtype and nothing else, so `with torch.device("meta"):` builds a 70B model in seconds. fakeviz uses **fake** tensors instead (`torch._subclasses.FakeTensor`, what `torch.compile` and `torch.export` trace with). In this notebook you will learn the three meta idioms you meet in real code (`torch.device("meta")`, `torch.load(..., map_location="meta")`, `module.to_empty(...)`), exactly what the meta device throws away (the device, the way storages are usually compared, and every value), and how fake tensors keep the first two and often the third: a model placed on `cuda:0` on a machine without a GPU, device bugs caught before you rent one, storages shown as tables, and data-dependent code that crashes on meta tensors but runs under fake mode with the same results as a real run.

# %%
import os

import pandas as pd
import torch
from torch import nn

import fakeviz as fv

pd.set_option("display.width", 140)
print("torch", torch.__version__, "| a real GPU here:", torch.cuda.is_available())
print("fake cuda:", fv.fake_cuda_status().mode)


# %% [markdown]
# Our model is tiny on purpose: every idea here is about *what a tensor knows*, not about size. It has a **tied** weight, as most language models do: the output head reuses the embedding matrix (one parameter, two modules).

# %%
class TinyLM(nn.Module):
    def __init__(self, vocab=100, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids):
        return self.head(self.ln(self.emb(ids)))


def weights(model):
    """Each parameter entry (a tied one under each of its names): shape, dtype, device."""
    rows = [(n, tuple(p.shape), p.dtype, str(p.device)) for n, p in model.named_parameters(remove_duplicate=False)]
    return pd.DataFrame(rows, columns=["name", "shape", "dtype", "device"])


# %% [markdown]
# ## 1. The meta device: build without memory
#
# Inside `with torch.device("meta"):` every tensor a constructor makes lands on the meta device. Module `__init__` code runs unchanged; the initialisers (`normal_`, `zeros_`, ...) do nothing, since there is nothing to write to.

# %%
with torch.device("meta"):
    meta_model = TinyLM()
print("tied:", meta_model.head.weight is meta_model.emb.weight)
weights(meta_model)

# %% [markdown]
# Meta tensors have *meta kernels*: rules that compute an op's output shape and dtype from its inputs' without touching data. So a forward pass works, as long as you only want shapes:

# %%
logits = meta_model(torch.zeros(2, 8, dtype=torch.long, device="meta"))
print(logits.shape, logits.dtype, logits.device)

# %% [markdown]
# ## 2. A checkpoint read as meta: `torch.load(..., map_location="meta")`
#
# `map_location="meta"` reads a checkpoint's *structure* (the keys, shapes and dtypes) without its bytes. We save a small real checkpoint in the notebook's working folder and read it back both ways:

# %%
torch.manual_seed(0)
real = TinyLM()  # a real model on the cpu, with data
torch.save(real.state_dict(), "tiny_lm.pt")
print("checkpoint:", os.path.getsize("tiny_lm.pt"), "bytes on disk")

sd = torch.load("tiny_lm.pt", map_location="meta", weights_only=True)
pd.DataFrame([(k, tuple(t.shape), t.dtype, str(t.device)) for k, t in sd.items()], columns=["key", "shape", "dtype", "device"])


# %% [markdown]
# Everything is `meta`, whatever device the tensors were saved from. Now a subtler loss. The tied weight is **one** storage in the checkpoint (`torch.save` writes a shared storage once). A real load gives it back as one storage. A meta load does too from torch 2.15 on; before (2.13, 2.14) it gave two, and the reason is instructive: `torch.load` recognised a storage it had already loaded by its data pointer, and every meta tensor's data pointer is 0 (there is no memory to point to), so nothing was recognised. Comparing storage *objects* (`a.untyped_storage() is b.untyped_storage()`) is the test that works on meta and fake tensors; comparing `data_ptr()` never does. (The first line of the notebook says which torch you run.)

# %%
def shared(d):
    return d["emb.weight"].untyped_storage() is d["head.weight"].untyped_storage()


real_sd = torch.load("tiny_lm.pt", weights_only=True)
print("real load: emb.weight and head.weight share a storage:", shared(real_sd))
print("meta load: emb.weight and head.weight share a storage:", shared(sd))
print("meta data pointers:", {t.data_ptr() for t in sd.values()})
os.remove("tiny_lm.pt")  # the checkpoint has served

# %% [markdown]
# The usual next step loads the meta state dict into a meta model with `assign=True` (the model takes the dict's tensors instead of copying into its own). Each key gets its own tensor, so the tie is gone and must be restored by hand (transformers models do it in `model.tie_weights()`):

# %%
result = meta_model.load_state_dict(sd, assign=True)
print(result, "| tied after assign:", meta_model.head.weight is meta_model.emb.weight)
meta_model.head.weight = meta_model.emb.weight  # re-tie
print("tied again:", meta_model.head.weight is meta_model.emb.weight)

# %% [markdown]
# ## 3. `to_empty`: from meta to a device
#
# A meta model cannot run: there is no data, and `.to("cpu")` refuses ("Cannot copy out of meta tensor"). `module.to_empty(device=...)` allocates **uninitialised** memory of the right shapes on the device; you then load the weights (or call the initialisers). It makes one new tensor per parameter *entry*, so it unties tied weights too:

# %%
with torch.device("meta"):
    model = TinyLM()
model.to_empty(device="cpu")  # real memory, garbage values
print("tied after to_empty:", model.head.weight is model.emb.weight)
model.head.weight = model.emb.weight
model.load_state_dict(real.state_dict())
print("equal to the saved model:", all(torch.equal(a, b) for a, b in zip(model.parameters(), real.parameters())))

# %% [markdown]
# The same `to_empty` onto a fake device is how large models are materialised on a GPU (FSDP and torchtitan build on meta, shard, then `to_empty`). Under `fv.record`, fakeviz records it: each storage `to_empty` makes is a row, on `cuda:0`, with its bytes, the op that made it (`empty_like`) and the parameter names it holds (`modules=[model]` tells the recorder which model's names to use).

# %%
with torch.device("meta"):
    model = TinyLM()
with fv.record(device="cuda:0", modules=[model]) as trace:
    model.to_empty(device="cuda:0")
    model.head.weight = model.emb.weight  # re-tie: the head's own copy is freed
    logits = model(torch.randint(0, 100, (2, 8)))
print("logits:", tuple(logits.shape), logits.device, "| fake:", fv.is_fake(logits))
st = trace.storages
st[st.op == "aten.empty_like.default"][["storage", "device", "nbytes", "category", "name", "alloc_seq", "free_seq"]]


# %% [markdown]
# Four storages, one per entry, as on a real device: the embedding (6,400 bytes, named after both modules once re-tied), the two LayerNorm vectors, and the head's own copy, which nothing names and which is freed (`free_seq`) as soon as the tie replaces it. A real `to_empty` on a GPU would allocate, and free, exactly these.
#
# ## 4. What meta loses: the device
#
# A model split over devices is common (a large embedding on the CPU, the rest on a GPU; pipeline stages). Here is one with a classic bug: the hidden state is not moved to the second layer's device.

# %%
class Hybrid(nn.Module):
    def __init__(self, first="cpu", second="cpu", move=False):
        super().__init__()
        self.fc1 = nn.Linear(64, 256, device=first)
        self.fc2 = nn.Linear(256, 10, device=second)
        self.move = move

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.move:
            h = h.to(self.fc2.weight.device)  # the fix
        return self.fc2(h)


# %% [markdown]
# On the meta device there is only one device, so the placement cannot even be written down, and the bug is invisible: the forward pass runs.

# %%
meta_hybrid = Hybrid(first="meta", second="meta")
out = meta_hybrid(torch.randn(8, 64, device="meta"))
print(out.shape, out.device)

# %% [markdown]
# Fake tensors keep their device, `cuda:0` included on this CPU-only machine (fakeviz registers a data-less CUDA device with torch). The same code fails as it would on the real machine, with the message torch gives there ("Expected all tensors to be on the same device"), before you have paid for a GPU:

# %% tags=["raises-exception"]
with fv.fake_mode():
    hybrid = Hybrid(first="cuda:0", second="cpu")
    hybrid(torch.randn(8, 64, device="cuda:0"))

# %% [markdown]
# With the fix, the run is recorded, and the memory is counted per device: the first layer's weights and activations on `cuda:0`, the second's on the `cpu`, and the recorded copy between them.

# %%
with fv.record(device="cuda:0") as trace:
    hybrid = Hybrid(first="cuda:0", second="cpu", move=True)
    out = hybrid(torch.randn(8, 64, device="cuda:0"))
print("output:", tuple(out.shape), out.device)
for device, peak in trace.peak().items():
    print(f"{device}: peak {peak.bytes:,} bytes")
trace.ops[trace.ops.op == "aten._to_copy.default"][["seq", "op", "device", "shape", "nbytes"]]

# %% [markdown]
# ## 5. Storage identity, shown as tables
#
# Inside one process a fake tensor keeps storage identity the way a meta tensor does (a fake tensor wraps a meta one): a view shares its base's storage object, a tied parameter is one object. What neither has is a meaningful data pointer: `data_ptr()` is 0 for both, so code that finds shared memory by pointers (like `torch.load` above) is fooled by both. What fake mode adds is a *record*: fakeviz tracks every storage from the op that made it to the one that freed it, with the names and views on it. For a model built and run on fake `cuda:0`:

# %%
with fv.record(device="cuda:0") as trace:
    fake_model = TinyLM()
    logits = fake_model(torch.randint(0, 100, (2, 8)))
    flat = logits.view(-1, 100)  # a view: no new storage
    flat.mul_(0.5)  # an in-place write through the view
st = trace.storages
st[st.category == "Parameter"][["storage", "device", "nbytes", "name", "alloc_seq", "free_seq"]]

# %% [markdown]
# One row for the tied weight, carrying both names: 6,400 bytes counted once, as on a GPU. (The row without a name is the head's own weight that `nn.Linear` made before the tie replaced it; its `free_seq` shows it freed as soon as the assignment dropped it.) `trace.aliases(...)` lists every tensor that viewed a storage, with the op that made the view (`base` is the tensor it viewed), and `writes` counts in-place writes. The logits' storage is made by `mm` and viewed as `[2, 8, 100]`; `flat` is a view of that, written once by `mul_`; the last row is autograd re-creating the view after the write, as it does in a real run.

# %%
trace.aliases(flat)[["tensor", "storage", "op", "shape", "stride", "base", "writes"]]


# %% [markdown]
# (Notebook 05 is all about aliasing: views, tied weights and in-place writes in the alias graph.)
#
# ## 6. Data-dependent code: meta crashes, fake runs
#
# Real code reads values: `.item()`, `int(t)`, `if t.any():`, a boolean mask whose count sets a shape. A meta tensor has no values, so such code cannot run on it. A fake tensor has no *storage*, but fakeviz keeps the values it can know exactly: small tensors made from Python numbers, real tensors you pass in, and random draws on the CPU generator, which it replays in step with the real run (see `fakeviz/_engine/values.py`). Here is typical batching code: pad sequences of different lengths to the longest, and pick the real tokens with a mask.

# %%
def pack(lengths, dim=4):
    width = int(lengths.max())  # a value decides a shape
    mask = torch.arange(width, device=lengths.device) < lengths[:, None]
    x = torch.randn(len(lengths), width, dim, device=lengths.device)
    tokens = x[mask]  # as many rows as mask has True values
    return width, mask, tokens


def show(width, mask, tokens):
    print("width:", width)
    print("mask:", mask.tolist())
    print("tokens:", tuple(tokens.shape), tokens.dtype, tokens.device)
    print("first token:", [round(v, 4) for v in tokens[0].tolist()])


# %% [markdown]
# The real run, on CPU tensors with data, for reference:

# %%
torch.manual_seed(0)
show(*pack(torch.tensor([3, 5, 2])))

# %% [markdown]
# On the meta device the first line fails: there is no value to read.

# %% tags=["raises-exception"]
pack(torch.tensor([3, 5, 2], device="meta"))

# %% [markdown]
# Under fake tensors the same code runs, and every figure equals the real run's: the width (5), the mask, the number of selected tokens (3 + 5 + 2 = 10) and even the random values, because the draw was replayed on the CPU generator seeded as before. Nothing had to be assumed:

# %%
torch.manual_seed(0)
with fv.record() as dd:
    result = pack(torch.tensor([3, 5, 2]))
    show(*result)
print("fake:", fv.is_fake(result[2]), "| assumptions:", len(dd.fidelity()["assumptions"]))

# %% [markdown]
# On fake `cuda:0` the lengths, built from Python numbers, are still known, so the shapes and the mask are exact. The random draw is not: on a real GPU it would come from the GPU's generator, which fakeviz does not simulate, so the token values are unknown (the shapes do not depend on them).

# %%
with fv.record(device="cuda:0"):
    width, mask, tokens = pack(torch.tensor([3, 5, 2], device="cuda:0"))
    print("width:", width, "| mask:", mask.device, mask.tolist())
    print("tokens:", tuple(tokens.shape), tokens.dtype, tokens.device)

# %% [markdown]
# And where a value really is unknown, fakeviz says so instead of guessing: lengths drawn on the GPU have no value in a fake run, so `int(lengths.max())` stops with a `DataDependentError` that names the line, the op that made the value and what to do (here: pass the lengths as real numbers).

# %% tags=["raises-exception"]
with fv.record(device="cuda:0"):
    pack(torch.randint(1, 9, (3,), device="cuda:0"))

# %% [markdown]
# ## Summary
#
# | | meta | fake (fakeviz) |
# |---|---|---|
# | shapes, dtypes, strides | yes | yes |
# | device | always `meta` | kept (`cuda:N` without a GPU) |
# | device mismatches | invisible | torch's own error |
# | storage identity | same object, `data_ptr()` 0 | same object, `data_ptr()` 0, plus a record of every storage |
# | values | none (`.item()` raises) | small known tensors and CPU draws exact; otherwise a clear error |
# | memory | none | every storage, per device and phase |
#
# ## Exercises
#
# 1. Build `TinyLM` on meta, then `fv.fakeify(meta_model, device="cuda:0")` (as `examples/meta_to_fake.py` does). Is the head still tied to the embedding? Compare with `to_empty` in section 3.
# 2. In section 2, replace the meta load by `fv.fakeify(torch.load("tiny_lm.pt", map_location="meta", weights_only=True), device="cuda:0")` and load it into a fake model with `assign=True`. On which device are the weights, and is the tie there?
# 3. Change `pack` to draw `x` with `torch.randn(..., generator=g)` for your own `g = torch.Generator().manual_seed(1)`. Do the fake run's values still equal the real run's?
# 4. Add `if mask.sum() > 8: tokens = tokens[:8]` to `pack`. Does it run on meta? Under `fv.record()` on the CPU? With lengths drawn by `torch.randint` on `cuda:0`?
# 5. Move `hybrid.fc2` to `"cuda:1"` instead of the CPU (and `move=True`). What does `trace.peak()` show for each device?
