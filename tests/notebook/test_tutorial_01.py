"""Tutorial 01 (quickstart): what it shows is true.

The notebook runs once (``nbrun.execute``, in the Binder-like environment); each figure it prints is checked
against an independent computation here: Blenderbot's parameter count by hand from its published config (the
formula itself checked on a real CPU model), the fake forward's output shapes against a real CPU forward of the
same code, and the ``%%fake`` cell's ops and peak against ``fv.record`` of the same source in this process.
"""

from __future__ import annotations

import re

import pytest
import torch
from nbrun import cell, code_cells, errors, execute, text
from nbrun import find_int as _int

import fakeviz as fv
from fakeviz import models

pytest.importorskip("transformers")

NB = "01_quickstart.ipynb"
NAME = "facebook/blenderbot-400M-distill"
MIB = 2**20


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def blenderbot_params(cfg) -> int:
    """Parameters of BlenderbotForConditionalGeneration by hand, from the config (the shared embedding counted
    once: the encoder's and decoder's ``embed_tokens`` and ``lm_head`` are tied to it)."""
    d, v, p = cfg.d_model, cfg.vocab_size, cfg.max_position_embeddings
    linear = d * d + d
    layer_norm = 2 * d
    encoder_layer = (
        4 * linear + 2 * layer_norm + (d * cfg.encoder_ffn_dim + cfg.encoder_ffn_dim) + (cfg.encoder_ffn_dim * d + d)
    )
    decoder_layer = (
        8 * linear + 3 * layer_norm + (d * cfg.decoder_ffn_dim + cfg.decoder_ffn_dim) + (cfg.decoder_ffn_dim * d + d)
    )
    return (v * d + 2 * p * d + cfg.encoder_layers * encoder_layer + cfg.decoder_layers * decoder_layer
            + 2 * layer_norm)  # fmt: skip


def test_hand_formula_is_the_real_models_count() -> None:
    """The formula the next test relies on, checked on a real (small) model built on the CPU."""
    from transformers import BlenderbotForConditionalGeneration

    small = models.config(NAME, encoder_layers=1, decoder_layers=2, d_model=64, encoder_ffn_dim=96,
                          decoder_ffn_dim=80, vocab_size=100, encoder_attention_heads=4, decoder_attention_heads=4)  # fmt: skip
    real = BlenderbotForConditionalGeneration(small)
    assert not fv.is_fake(real.lm_head.weight)
    assert sum(p.numel() for p in real.parameters()) == blenderbot_params(small)


@pytest.mark.slow
def test_fake_blenderbot_has_the_published_parameter_count(nb) -> None:
    out = text(cell(nb, 'cfg = models.config("facebook/blenderbot-400M-distill")'))
    n = _int(r"parameters: ([\d,]+)", out)
    entry = models.resolve(NAME)
    assert n == blenderbot_params(models.config(NAME))  # by hand from the published config
    assert abs(n - entry.parameters) <= entry.parameters_unit / 2  # the hub page's 365M, rounded to 1M
    assert _int(r"published: +([\d,]+)", out) == entry.parameters
    assert f"as float32: {n * 4 / 2**30:.2f} GiB" in out
    w = text(cell(nb, "w = model.model.shared.weight"))
    cfg = models.config(NAME)
    assert f"shape ({cfg.vocab_size}, {cfg.d_model})" in w and "fake: True" in w
    assert f"storage bytes: {cfg.vocab_size * cfg.d_model * 4:,}" in w
    assert "lm_head tied to the embedding: True" in w


@pytest.mark.slow
def test_fake_forward_shapes_are_a_real_cpu_runs(nb) -> None:
    """The same forward code, real on the CPU with 1 encoder and 1 decoder layer, gives the shapes and dtypes the
    fake full-size run printed (and the notebook's own real run printed them too)."""
    from transformers import BlenderbotForConditionalGeneration

    fake = dict(
        re.findall(r"fake (\w+): (\(.*\) torch\.\w+) cuda:0", text(cell(nb, 'with fv.fake_mode(device="cuda:0")')))
    )
    shown_real = dict(re.findall(r"real (\w+): (\(.*\) torch\.\w+) cpu \(fake: False\)", text(cell(nb, "small = "))))
    assert set(fake) == {"logits", "encoder_last_hidden_state"}
    torch.manual_seed(0)
    real = BlenderbotForConditionalGeneration(models.config(NAME, encoder_layers=1, decoder_layers=1)).eval()
    ids = torch.randint(0, real.config.vocab_size, (2, 32))
    with torch.no_grad():
        ref = real(input_ids=ids, decoder_input_ids=ids[:, :8])
    for name, shown in fake.items():
        t = ref[name]
        assert not fv.is_fake(t)
        assert shown == f"{tuple(t.shape)} {t.dtype}", name
        assert shown_real[name] == shown, name
    assert "torch.cuda sees: NVIDIA H100" in text(cell(nb, 'with fv.fake_mode(device="cuda:0")'))


@pytest.mark.slow
def test_fake_cell_equals_fv_record_of_the_same_code(nb) -> None:
    """The ``%%fake`` cell's trace (ops, peak, categories, verdict as printed) equals ``fv.record`` of its source
    here; the parameters and gradients at the peak are 4 bytes per parameter counted by hand."""
    src = cell(nb, "%%fake --device cuda:0 --gpu T4 -o trace").source
    body = src.split("\n", 1)[1]
    with fv.record(device="cuda:0", gpu="T4") as t:
        exec(body, {"torch": torch, "models": models})
    assert t.error is None
    out = text(cell(nb, 'print(f"ops: {trace.num_ops:,}"'))
    assert _int(r"ops: ([\d,]+)", out) == t.num_ops
    peak = t.peak()["cuda:0"]
    assert _int(r"peak on cuda:0: ([\d,]+) bytes", out) == peak.bytes
    assert f"{peak.phase} phase" in out
    n = blenderbot_params(models.config(NAME))
    for category in ("Parameter", "Gradient"):
        assert peak.by_category[category] == 4 * n
        assert re.search(rf"{category} +{4 * n / MIB:,.1f} MiB", out), category
    v = t.verdict("T4")
    assert v["fits"] and v["text"] in out
    assert v["devices"]["cuda:0"]["peak"] <= 15360 * MIB  # a T4 reports 15360 MiB
    # the cell's own display: the static summary with the same verdict
    shown = text(cell(nb, "%%fake --device cuda:0 --gpu T4 -o trace"))
    assert "fakeviz trace</b>: " + f"{t.num_ops:,} ops" in shown and "fits: cuda:0" in shown


@pytest.mark.slow
def test_adamw_cell_does_not_fit_4gb_and_says_where(nb) -> None:
    """Weights, gradients and AdamW's two states are 4 x 4 bytes per parameter (hand count): over 4 GB."""
    n = blenderbot_params(models.config(NAME))
    assert 4 * (4 * n) > 4e9
    out = text(cell(nb, 'v = step.verdict("4GB")'))
    assert "fits: False" in out
    m = re.search(r"peaks at ([\d.]+) GiB reserved of ", out)  # the bytes the verdict judged (Note: [the verdict])
    assert m and float(m.group(1)) * 2**30 >= 4 * (4 * n) * 0.99
    assert "first fails at op" in out and "Cell In[" in out
    shown = text(cell(nb, "%%fake --device cuda:0 --capacity 4GB -o step"))
    assert "does not fit" in shown and "Optimizer state" in shown


@pytest.mark.slow
def test_data_dependent_cell_fails_cleanly(nb) -> None:
    c = cell(nb, "%%fake --device cuda:0 -o broken")
    err = errors(c)
    assert "DataDependentError" in err and "if x.sum() > 0:" in err
    assert len(err.splitlines()) <= 25 and "site-packages" not in err  # torch internals hidden
    out = text(cell(nb, 'print("stopped at:"'))
    assert "stopped at: aten._local_scalar_dense.default" in out
    assert "fake mode still active? False" in out and "tensor([2., 2.])" in out


@pytest.mark.slow
def test_explorer_cells(nb) -> None:
    shown = text(cell(nb, 'explorer = trace.explore("H100"'))
    assert "fakeviz trace" in shown and "79.6 GiB" in shown  # an H100 reports 81559 MiB
    sel = text(cell(nb, "explorer.selected_module ="))
    assert "selected: BlenderbotForConditionalGeneration.model.decoder.layers.0-11" in sel
    m = re.search(r"quickstart_explorer\.html ([\d.]+) MB", text(cell(nb, "report = trace.to_html")))
    assert m and float(m.group(1)) > 0.05
    tree = text(cell(nb, "tree = trace.folded_modules()"))
    assert "0-11 x12" in tree and "0-1 x2" in tree
    assert all(c.execution_count is not None for c in code_cells(nb)[1:])
