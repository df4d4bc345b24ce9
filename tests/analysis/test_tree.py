"""The layer tree (trace.modules) and its folded view, on real model code."""

from __future__ import annotations

import warnings

import pytest
import torch

import fakeviz as fv
from fakeviz._analysis.tree import FIGURES

warnings.filterwarnings("ignore", message=".*loss_type=None.*")


def _gpt2_trace(fake: bool = True):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0)
    with fv.record(fake=fake) as trace:
        torch.manual_seed(0)
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 1000, (1, 8))
        m(ids, labels=ids).loss.backward()
    return trace, m


def test_tied_weights_counted_once_gpt2():
    trace, m = _gpt2_trace()
    mt = trace.modules.set_index("path")
    wte, lm_head = m.transformer.wte.weight, m.lm_head.weight
    assert wte is lm_head  # GPT-2 ties its output projection to the embedding
    unique = sum(p.numel() for p in m.parameters())  # parameters() dedups by identity
    all_names = sum(p.numel() for _, p in m.named_parameters(remove_duplicate=False))
    assert all_names == unique + wte.numel()
    root = mt.loc["GPT2LMHeadModel"]
    assert root.params == unique and root.param_bytes == unique * 4
    # each side of the tie shows the tensor and says where else it lives
    assert mt.loc["GPT2LMHeadModel.lm_head"].params == wte.numel()
    assert mt.loc["GPT2LMHeadModel.transformer.wte"].params == wte.numel()
    assert mt.loc["GPT2LMHeadModel.lm_head"].tied_with == "GPT2LMHeadModel.transformer.wte.weight"
    assert mt.loc["GPT2LMHeadModel.transformer.wte"].tied
    assert not mt.loc["GPT2LMHeadModel.transformer.wpe"].tied
    # the gradient of the tied weight is one storage, counted once at the root
    assert root.grad_bytes == unique * 4
    # the per device/dtype split adds up
    split = [c for c in mt.columns if c.startswith("param_bytes:")]
    assert split == ["param_bytes:cpu:f32"] and (mt[split[0]] == mt.param_bytes).all()


def test_tree_figures_are_inclusive_and_consistent():
    trace, m = _gpt2_trace()
    mt = trace.modules
    by_path = mt.set_index("path")
    for _, row in mt.iterrows():
        if not isinstance(row.parent, str):
            continue
        parent = by_path.loc[row.parent]
        for k in ("act_bytes", "act_saved_bytes", "ops_fwd", "ops_bwd", "params", "grad_bytes"):
            assert parent[k] >= row[k], (row.path, k)
    ops = trace.ops
    root = by_path.loc["GPT2LMHeadModel"]
    assert root.ops_fwd == (ops.phase == "forward").sum()
    assert root.ops_bwd == ((ops.phase == "backward") & ops.module.notna()).sum()
    # activation bytes saved by a module are storages of category Activation created in it
    st = trace.storages
    saved = st[(st.category == "Activation") & (st.phase == "forward")]
    assert root.act_saved_bytes == saved.nbytes.sum()
    assert list(mt["class"].iloc[:2]) == ["GPT2LMHeadModel", "GPT2Model"]
    assert mt.depth.max() >= 4


def test_modules_fake_equals_real():
    fake, _ = _gpt2_trace(fake=True)
    real, _ = _gpt2_trace(fake=False)
    assert fake.modules.equals(real.modules)


def _llama_with_odd_layer():
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    m = LlamaForCausalLM(cfg)
    wide = LlamaConfig(**{**cfg.to_dict(), "intermediate_size": 512})
    m.model.layers[3].mlp = LlamaMLP(wide)  # one layer with a wider MLP: the odd one out
    return m


def test_folding_llama_with_one_odd_layer():
    with fv.record() as trace:
        torch.manual_seed(0)
        m = _llama_with_odd_layer()
        ids = torch.randint(0, 256, (2, 16))
        m(ids, labels=ids).loss.backward()
    mt = trace.modules
    f = trace.folded_modules()
    layers = f[f.parent == "LlamaForCausalLM.model.layers"]
    assert list(layers.name) == ["0-2,4-5 x5", "3"]
    assert list(layers["count"]) == [5, 1]
    assert list(layers.odd) == [False, True]
    # nothing is lost: the folded rows' figures are the sums over their members
    by_path = mt.set_index("path")
    for _, row in f.iterrows():
        members = row.members.split("|")
        for k in FIGURES:
            assert row[k] == by_path.loc[members, k].sum(), (row.path, k)
    # children of a fold add up to the fold (no figure dropped between levels)
    dense = layers.iloc[0]
    kids = f[f.parent == dense.path]
    assert set(kids.name) == {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
    assert kids.params.sum() == dense.params
    assert (
        f[f.parent == "LlamaForCausalLM.model.layers"].params.sum()
        == by_path.loc["LlamaForCausalLM.model.layers"].params
    )
    # the odd layer has more parameters than a dense one
    odd = layers.iloc[1]
    assert odd.params > dense.params / dense["count"]


def test_init_only_run_still_has_a_tree():
    # a model that is built but never called: the modules are found from their registration
    with fv.record(device="cuda:0", dtype=torch.bfloat16) as trace:
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 2)))
    mt = trace.modules
    assert list(mt.path) == ["Sequential", "Sequential.0", "Sequential.1", "Sequential.1.0"]
    assert mt.params.iloc[0] == sum(p.numel() for p in m.parameters())
    assert mt.param_bytes.iloc[0] == sum(p.numel() for p in m.parameters()) * 2
    assert "param_bytes:cuda:0:bf16" in mt.columns


def test_buffer_bytes_split_by_device_and_dtype():
    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        m(torch.randn(4, 8))
    mt = trace.modules.set_index("path")
    bn = mt.loc["Sequential.0"]
    # running_mean, running_var (f32) and num_batches_tracked (i64)
    assert bn.buffer_bytes == 8 * 4 * 2 + 8
    assert bn["buffer_bytes:cuda:0:f32"] == 64 and bn["buffer_bytes:cuda:0:i64"] == 8
    assert mt.loc["Sequential"].buffer_bytes == bn.buffer_bytes


@pytest.mark.parametrize("script", ["<script>alert(1)</script>"])
def test_odd_module_names_survive(script):
    class Weird(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.layer(x)

    Weird.__qualname__ = script
    with fv.record() as trace:
        Weird()(torch.ones(1, 2))
    assert trace.modules["class"].iloc[0] == script
