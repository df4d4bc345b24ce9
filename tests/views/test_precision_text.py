"""The text report names the precision of the weights (``fakeviz._views.text.precision_text``, in ``summary``)."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv
from fakeviz._views.text import precision_text, summary


def test_gpt2_in_fp32() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0)
    with fv.record(device="cuda:0") as trace:
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 1000, (1, 8), device="cuda:0")
        m(ids, labels=ids).loss.backward()
    # by hand: per block ln_1, ln_2 (LayerNorm) and attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj (transformers'
    # Conv1D); wte, wpe; ln_f; lm_head (tied to wte: its weight is counted once, the module is named)
    assert precision_text(trace) == "fp32 (8 conv, 5 norm, 2 embedding, lm_head)"
    assert "\nweights: fp32 (8 conv, 5 norm, 2 embedding, lm_head)\n" in summary(trace)


class _Mixed(torch.nn.Module):
    def __init__(self, bnb) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 64, dtype=torch.bfloat16)
        self.up = bnb.nn.Linear4bit(64, 256, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=False)
        self.down = bnb.nn.Linear4bit(
            256, 64, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=False
        )
        self.lm_head = torch.nn.Linear(64, 16, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(self.up(self.emb(x))))


def test_nf4_weights_and_the_bf16_rest() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    model = _Mixed(bnb).to("cpu")
    with fv.record(fake=False) as trace:
        model(torch.tensor([[1, 2]]))
    # most bytes first: the packed NF4 weights (64 x 256 / 2 bytes each, 16 KiB) before the bf16 embedding and head
    # (2 KiB each)
    assert precision_text(trace) == "nf4 (2 linear), bf16 (emb, lm_head)"
    assert "weights: nf4 (2 linear), bf16 (emb, lm_head)" in summary(trace)


def test_no_weights_no_line() -> None:
    with fv.record(device="cuda:0") as trace:
        torch.ones(4, device="cuda:0").sum()
    assert precision_text(trace) == "" and "weights:" not in summary(trace)


def test_the_notebook_and_html_summaries_say_it_too() -> None:
    from fakeviz._views.static import static_html
    from fakeviz._views.text import summary_html

    with fv.record(device="cuda:0") as trace:
        torch.nn.Linear(4, 4, dtype=torch.bfloat16, device="cuda:0")(
            torch.ones(1, 4, dtype=torch.bfloat16, device="cuda:0")
        )
    line = "<b>weights</b>: bf16 (1 linear)"  # a root module is counted by its kind: its path is only its class
    assert line in static_html(trace) and line in summary_html(trace) and line in trace._repr_html_()


def test_the_plotly_layer_tree_hover_names_the_weights() -> None:
    from fakeviz import views

    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Sequential(torch.nn.Linear(4, 4).half(), torch.nn.ReLU()).to("cuda:0")
        m(torch.ones(1, 4, dtype=torch.float16, device="cuda:0"))
    data = views.tree_data(trace).table.set_index("path")
    assert "<br>weights: fp16<br>" in data.loc["Sequential.0", "hover"]
    assert "weights:" not in data.loc["Sequential.1", "hover"]  # a ReLU holds none
