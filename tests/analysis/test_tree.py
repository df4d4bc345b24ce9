"""The layer tree (trace.modules) and its folded view, on real model code."""

from __future__ import annotations

import warnings

import pytest
import torch

import fakeviz as fv
from fakeviz._analysis.tree import FIGURES, weight_precisions

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


# ---- the precision of the weights (Note: [weight precision] in fakeviz/_engine/precision.py)
def _llama_int8_layers(fake: bool) -> fv.Trace:
    """A 2-layer Llama in bf16 whose decoder layers torchao quantizes (int8 weight-only), run forward."""
    torchao = pytest.importorskip("torchao.quantization")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256)  # fmt: skip
    with fv.record(fake=fake, device="cpu") as trace:
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torchao.quantize_(m.model.layers, torchao.Int8WeightOnlyConfig())
        m(torch.randint(0, 256, (1, 8)))
    return trace


def test_precision_column_fake_equals_real_torchao():
    real, fake = _llama_int8_layers(False), _llama_int8_layers(True)
    assert real.modules["precision"].tolist() == fake.modules["precision"].tolist()
    mt = fake.modules.set_index("path")["precision"]
    root = "LlamaForCausalLM.model"
    assert mt[f"{root}.layers.1.self_attn.q_proj"] == "int8 weight-only"
    assert mt[f"{root}.layers.1.mlp"] == "int8 weight-only"  # its children share it
    assert mt[f"{root}.layers.1.input_layernorm"] == mt[f"{root}.embed_tokens"] == "bf16"
    assert mt[f"{root}.layers.1"] == mt["LlamaForCausalLM"] == "mixed"
    assert mt[f"{root}.layers.1.mlp.act_fn"] == mt[f"{root}.rotary_emb"] == ""  # no weights
    folded = fake.folded_modules().set_index("path")
    assert folded.loc[f"{root}.layers.0-1.mlp.down_proj", "precision"] == "int8 weight-only"
    assert folded.loc[f"{root}.layers.0-1", "count"] == 2


class _Block(torch.nn.Module):
    def __init__(self, bnb, quantized: bool) -> None:
        super().__init__()
        if quantized:
            self.q = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4")
        else:
            self.q = torch.nn.Linear(64, 64, dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(64, dtype=torch.bfloat16)

    def forward(self, x):
        return self.norm(self.q(x))


class _Stack(torch.nn.Module):
    """Three NF4 blocks and a last one kept in bf16 (as a user keeping the last layer unquantized)."""

    def __init__(self, bnb) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 64, dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList([_Block(bnb, i < 3) for i in range(4)])
        self.head = torch.nn.Linear(64, 16, dtype=torch.bfloat16)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def test_precision_with_qlora_and_folding():
    bnb = pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_Stack(bnb).to("cpu"), peft.LoraConfig(r=4, target_modules=["q"]))
    with fv.record(fake=False) as trace:
        model(torch.tensor([[1, 2, 3]])).float().sum().backward()
    mt = trace.modules.set_index("path")["precision"]
    root = "PeftModel.base_model.model"
    # peft wraps each q: its base layer keeps its precision, the adapters are fp32 (peft's default)
    assert mt[f"{root}.layers.0.q"] == "nf4+dq + LoRA fp32" and mt[f"{root}.layers.3.q"] == "bf16 + LoRA fp32"
    assert mt[f"{root}.layers.0.q.base_layer"] == "nf4+dq" and mt[f"{root}.layers.0.q.lora_A"] == "fp32"
    assert mt[f"{root}.layers.0"] == "mixed" and mt[f"{root}.layers.3.norm"] == "bf16"
    folded = trace.folded_modules().set_index("path")
    # layers quantized differently never fold together: the bf16 one is its own row, the odd one out
    assert folded.loc[f"{root}.layers.0-2", "count"] == 3 and folded.loc[f"{root}.layers.3", "odd"]
    assert folded.loc[f"{root}.layers.0-2.q", "precision"] == "nf4+dq + LoRA fp32"
    assert folded.loc[f"{root}.layers.3.q", "precision"] == "bf16 + LoRA fp32"
    rows = {r["precision"]: r for r in weight_precisions(trace)}
    assert set(rows) == {"nf4+dq", "bf16", "LoRA fp32"}
    assert rows["nf4+dq"]["kinds"] == "3 linear" and rows["LoRA fp32"]["kinds"] == "4 adapted layers"
    assert rows["bf16"]["kinds"] == "4 norm, 2 linear, emb"  # layers.3.q.base_layer and head; the embedding alone
    own = {n: p for n, p in model.named_parameters()}
    lora_bytes = sum(p.numel() * p.element_size() for n, p in own.items() if ".lora_" in n)
    assert rows["LoRA fp32"]["param_bytes"] == lora_bytes and rows["LoRA fp32"]["modules"] == 8


def test_records_without_precision_read_the_parameter_dtypes():
    """A record made before the recorder noted precision (an old .fvz) reads each module's parameter dtypes."""
    trace, _ = _gpt2_trace()
    noted = trace.modules["precision"].tolist()
    assert set(noted) == {"fp32", ""}
    trace.meta.pop("weight_precision")
    trace.clear_memo()
    assert trace.modules["precision"].tolist() == noted
    trace.meta["weight_precision"] = {"GPT2LMHeadModel.lm_head": 7, "GPT2LMHeadModel.transformer.ln_f": "x" * 200}
    trace.clear_memo()  # a file's labels are data: what is not a string is no label, a long one is cut
    mt = trace.modules.set_index("path")["precision"]
    assert mt["GPT2LMHeadModel.lm_head"] == "" and mt["GPT2LMHeadModel.transformer.ln_f"] == "x" * 80


def test_precision_of_a_dora_layer():
    peft = pytest.importorskip("peft")
    base = torch.nn.Sequential(torch.nn.Linear(16, 16, dtype=torch.bfloat16), torch.nn.LayerNorm(16))
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["0"], use_dora=True))
    with fv.record(fake=False) as trace:
        model(torch.ones(1, 16, dtype=torch.bfloat16)).float().sum().backward()
    mt = trace.modules.set_index("path")["precision"]
    root = "PeftModel.base_model.model"
    assert mt[f"{root}.0"] == "bf16 + DoRA fp32" and mt[f"{root}.0.lora_magnitude_vector"] == "fp32"
    assert mt[f"{root}.1"] == "fp32" and mt[root] == "mixed"
