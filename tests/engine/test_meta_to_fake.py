"""Meta to fake: a model built on ``torch.device("meta")`` made fake on ``cuda:0``, against a real CPU model.

``fakeify(meta_model, device=...)`` keeps tied weights; ``to_empty(device=...)`` under ``fakeviz.record``
records one storage per parameter and buffer entry, untying tied weights exactly as PyTorch does on a real
device; ``torch.load(map_location="meta")`` state dicts go into a fake model with ``assign=True``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fakeviz as fv


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("pos", torch.arange(8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.emb(ids)))


def entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer entry, tied ones under each of their names."""
    return list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))


def real_storages(model: nn.Module, root: str) -> dict[str, int]:
    """A real model's distinct storages: ``"|"``-joined names (as the trace writes them) -> nbytes."""
    names: dict[int, list[str]] = defaultdict(list)
    nbytes = {}
    for name, t in entries(model):
        key = t.untyped_storage().data_ptr()
        names[key].append(f"{root}.{name}")
        nbytes[key] = t.untyped_storage().nbytes()
    return {"|".join(ns): nbytes[k] for k, ns in names.items()}


def fake_storage_groups(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = defaultdict(list)
    for name, t in entries(model):
        groups[t.untyped_storage()._cdata].append(name)
    return sorted(groups.values())


def real_storage_groups(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = defaultdict(list)
    for name, t in entries(model):
        groups[t.untyped_storage().data_ptr()].append(name)
    return sorted(groups.values())


def trace_weights(trace: Any, device: str = "cuda:0") -> dict[str, int]:
    """The trace's parameter and buffer storages on ``device``, alive at the end: name -> nbytes."""
    st = trace.storages
    live = st[(st.device == device) & st.category.isin(["Parameter", "Buffer"]) & (st.free_seq < 0)]
    return dict(zip(live.name, live.nbytes))


def test_fakeify_meta_model_keeps_ties() -> None:
    with torch.device("meta"):
        meta = TiedLM()
    fake = fv.fakeify(meta, device="cuda:0")
    assert fake.head.weight is fake.emb.weight
    for name, t in entries(fake):
        assert fv.is_fake(t) and t.device == torch.device("cuda:0"), name
    assert isinstance(fake.emb.weight, nn.Parameter) and fake.emb.weight.requires_grad
    assert all(t.device.type == "meta" and not fv.is_fake(t) for _, t in entries(meta)), "the meta model is untouched"
    real = TiedLM()
    assert fake_storage_groups(fake) == real_storage_groups(real)
    for (name, f), (_, r) in zip(entries(fake), entries(real)):
        assert (f.shape, f.stride(), f.dtype) == (r.shape, r.stride(), r.dtype), name

    with fv.record(device="cuda:0") as trace:
        fake(torch.zeros(2, 8, dtype=torch.long))
    assert trace_weights(trace) == real_storages(real, "TiedLM")
    tied = trace.modules.set_index("path").tied
    assert tied["TiedLM.emb"] and tied["TiedLM.head"] and not tied["TiedLM.ln"]


def test_fakeify_meta_gpt2_keeps_ties() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=16, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(cfg)
    fake = fv.fakeify(meta, device="cuda:0")
    assert fake.lm_head.weight is fake.transformer.wte.weight
    assert all(fv.is_fake(t) and t.device == torch.device("cuda:0") for _, t in entries(fake))
    real = transformers.GPT2LMHeadModel(cfg)
    assert fake_storage_groups(fake) == real_storage_groups(real)
    with fv.record(device="cuda:0") as trace:
        fake(torch.zeros(2, 8, dtype=torch.long))
    assert trace_weights(trace) == real_storages(real, "GPT2LMHeadModel")
    assert "GPT2LMHeadModel.transformer.wte.weight|GPT2LMHeadModel.lm_head.weight" in trace_weights(trace)


def test_to_empty_under_record_matches_a_real_to_empty() -> None:
    with torch.device("meta"):
        real = TiedLM()
    real.to_empty(device="cpu")
    assert real.head.weight is not real.emb.weight, "PyTorch's to_empty unties"
    with torch.device("meta"):
        model = TiedLM()
    with fv.record(device="cuda:0") as trace:
        model.to_empty(device="cuda:0")
    assert model.head.weight is not model.emb.weight  # as in the real run
    assert all(fv.is_fake(t) and t.device == torch.device("cuda:0") for _, t in entries(model))
    assert fake_storage_groups(model) == real_storage_groups(real)
    st = trace.storages
    made = st[st.device == "cuda:0"]
    assert set(made.op) == {"aten.empty_like.default"}
    assert sorted(made.nbytes) == sorted(real_storages(real, "TiedLM").values())  # one per entry, 5 here

    # a model the recording knows (modules=[...]): the storages to_empty makes carry the parameters' names
    with torch.device("meta"):
        model = TiedLM()
    with fv.record(device="cuda:0", modules=[model]) as trace:
        model.to_empty(device="cuda:0")
    assert trace_weights(trace) == real_storages(real, "TiedLM")

    # re-tied and run in the block: the parameters are named, the untied copy is freed
    with torch.device("meta"):
        model = TiedLM()
    with fv.record(device="cuda:0") as trace:
        model.to_empty(device="cuda:0")
        model.head.weight = model.emb.weight
        model(torch.zeros(2, 8, dtype=torch.long))
    retied = TiedLM()  # a real model with the tie
    assert trace_weights(trace) == real_storages(retied, "TiedLM")
    st = trace.storages
    made = st[(st.device == "cuda:0") & (st.op == "aten.empty_like.default")]
    assert len(made) == 5 and (made.free_seq >= 0).sum() == 1, "the orphaned head weight is freed"


def test_meta_state_dict_into_a_fake_model(tmp_path: Path) -> None:
    real = TiedLM()
    path = tmp_path / "sd.pt"
    torch.save(real.state_dict(), path)
    sd = torch.load(path, map_location="meta", weights_only=True)
    assert all(t.device.type == "meta" for t in sd.values())
    with fv.fake_mode(device="cuda:0") as mode:
        model = TiedLM()
    fake_sd = fv.fakeify(sd, mode=mode, device="cuda:0")
    assert type(fake_sd) is type(sd) and list(fake_sd) == list(sd)
    assert all(fv.is_fake(t) and t.device == torch.device("cuda:0") for t in fake_sd.values())
    result = model.load_state_dict(fake_sd, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert model.emb.weight.untyped_storage()._cdata == fake_sd["emb.weight"].untyped_storage()._cdata
    assert all(fv.is_fake(t) and t.device == torch.device("cuda:0") for _, t in entries(model))
    for (name, f), (_, r) in zip(entries(model), entries(real)):
        assert (f.shape, f.dtype) == (r.shape, r.dtype), name
    model.head.weight = model.emb.weight  # loading assigns each key its own tensor: re-tie
    assert fake_storage_groups(model) == real_storage_groups(real)


def test_fakeify_container_moves_each_object_once() -> None:
    t = torch.randn(4, 4)
    other = torch.randn(2)
    out = fv.fakeify({"a": t, "b": t, "rest": [other, (other,)]}, device="cuda:0")
    assert out["a"] is out["b"]
    assert out["rest"][0] is out["rest"][1][0]
    assert all(fv.is_fake(x) and x.device == torch.device("cuda:0") for x in (out["a"], out["rest"][0]))
    assert out["a"].shape == (4, 4) and not fv.is_fake(t)
    param = fv.fakeify(nn.Parameter(torch.randn(3)), device="cuda:0")
    assert isinstance(param, nn.Parameter) and fv.is_fake(param) and param.device == torch.device("cuda:0")
    if fv.fake_cuda_status().mode == "shim":
        with pytest.raises(ValueError, match="cuda:0 .. cuda:63"):
            fv.fakeify(t, device="cuda:99")


def test_example_meta_to_fake() -> None:
    """``examples/meta_to_fake.py`` runs and shows the tie, the layer tree and the memory on cuda:0."""
    script = Path(__file__).resolve().parents[2] / "examples" / "meta_to_fake.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "built on: meta | tied: True" in out
    assert "fake on: cuda:0 | fake: True | tied: True" in out
    assert "logits: (4, 32, 1000) cuda:0" in out
    assert re.search(r"TinyLM\.head\s+Linear\s+64000\s+256000\s+True", out), out
    assert "cuda:0  256000 Parameter TinyLM.embed.weight|TinyLM.head.weight" in out
    assert re.search(r"cuda:0: peak [\d,]+ B at aten\.mm\.default in TinyLM\.head \(Parameter 522,240 B", out), out


def test_torch_tensor_under_a_meta_device_context_in_a_recording() -> None:
    """transformers asks ``torch.tensor([]).device`` for the device context a model is built under; torch >= 2.15
    makes the data on the context's device, so the lifted tensor's source is a meta tensor with no values to
    keep (the README's parallel plan failed there: 'Cannot copy out of meta tensor')."""

    def made() -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        with torch.device("meta"):
            ts = [torch.tensor([]), torch.tensor([1.0, 2.0]), torch.tensor(3, dtype=torch.int64)]
        return [(t.device.type, tuple(t.shape), t.dtype) for t in ts]

    real = made()
    with fv.record() as trace:
        fake = made()
    assert fake == real and trace.error is None
