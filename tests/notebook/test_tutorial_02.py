"""Tutorial 02 (a 70B model on a laptop): what it shows is true.

The notebook runs once (``nbrun.execute``, in the Binder-like environment). Its figures are checked against
computations here that do not use fakeviz's record: Llama-3.1-70B's parameters and bytes by hand from the
published config (the formula itself checked on a real CPU model), the KV cache and the rotary tables by hand,
FLOPs by the 2 x parameters x tokens rule plus attention, the capacity of an H100 (81,559 MiB, what the card
reports), and the verdicts against those numbers: weights per GPU are the parameters the printed device map put
there, inference fits on 2 H100s, one H100 cannot hold the weights, and training cannot fit on 2.
"""

from __future__ import annotations

import ast
import re

import pytest
from nbrun import cell, execute, text

from fakeviz import models

pytest.importorskip("transformers")

NB = "02_70b_on_a_laptop.ipynb"
NAME = "meta-llama/Llama-3.1-70B"
GIB = 2**30
H100 = 81559 * 2**20  # nvidia-smi's total for an H100 80GB HBM3
SEQ = 512


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


@pytest.fixture(scope="module")
def cfg():
    return models.config(NAME)


def _ints(s: str) -> int:
    return int(s.replace(",", ""))


def _search(pattern: str, s: str) -> re.Match:
    m = re.search(pattern, s)
    assert m, f"{pattern!r} not in:\n{s[:3000]}"
    return m


def module_params(cfg) -> dict[str, int]:
    """Parameters of each top-level unit of LlamaForCausalLM, by hand (no biases; embedding and head not tied)."""
    h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
    q = cfg.num_attention_heads * cfg.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size + 2 * h
    return {"layer": layer, "model.embed_tokens": cfg.vocab_size * h, "lm_head": cfg.vocab_size * h,
            "model.norm": h, "model.rotary_emb": 0}  # fmt: skip


def total_params(cfg) -> int:
    p = module_params(cfg)
    return cfg.num_hidden_layers * p["layer"] + p["model.embed_tokens"] + p["lm_head"] + p["model.norm"]


def test_hand_count_is_a_real_models_count() -> None:
    """The formula, checked on a real (small, same architecture) Llama built on the CPU."""
    from transformers import LlamaForCausalLM

    small = models.config(NAME, hidden_size=64, intermediate_size=96, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=8, num_hidden_layers=3, vocab_size=100)  # fmt: skip
    real = LlamaForCausalLM(small)
    assert sum(p.numel() for p in real.parameters()) == total_params(small)
    assert sum(p.numel() for p in real.model.layers[0].parameters()) == module_params(small)["layer"]


@pytest.mark.slow
def test_parameters_and_bytes_by_hand(nb, cfg) -> None:
    out = text(cell(nb, "t0 = time.perf_counter()"))
    n = _ints(_search(r"parameters: ([\d,]+)", out).group(1))
    assert n == total_params(cfg) == models.resolve(NAME).parameters == 70_553_706_496
    assert "dtype torch.bfloat16, device cuda:0, fake: True" in out
    assert _ints(_search(r"parameter bytes: ([\d,]+)", out).group(1)) == 2 * n  # bf16: 2 bytes each
    rss = float(_search(r"this process: ([\d.]+) GiB peak RSS", out).group(1))
    assert rss < 1.5  # the laptop claim: the process holds a fraction of one GiB, not 131 GiB
    hand = text(cell(nb, "c = model.config"))
    assert f"per layer: {module_params(cfg)['layer']:,}" in hand
    assert f"by hand: {n:,}" in hand and "equal: True" in hand


@pytest.mark.slow
def test_single_gpu_forward_peak(nb, cfg) -> None:
    """At the peak: the parameters (2 bytes each), the KV cache by hand; one H100 cannot hold the weights."""
    out = text(cell(nb, 'peak = trace.peak()["cuda:0"]'))
    cats = {k: _ints(v) for k, v in re.findall(r"^  (\w[\w ]*?) +([\d,]+) bytes", out, re.M)}
    n = total_params(cfg)
    assert cats["Parameter"] == 2 * n
    kv = 2 * cfg.num_hidden_layers * 1 * cfg.num_key_value_heads * cfg.head_dim * SEQ * 2  # K and V, batch 1, bf16
    assert cats["KV cache"] == kv
    logits = SEQ * cfg.vocab_size * 2
    assert logits <= cats["Temporary"] < 2 * logits
    assert "lm_head" in out and "aten.mm.default" in out
    assert 2 * n > H100
    shown = text(cell(nb, 'with fv.record(device="cuda:0", gpu="H100") as trace:'))
    assert "does not fit 79.6 GiB" in shown
    # the model is built inside the record: a real H100 runs out while __init__ makes the weights
    m = _search(r"first fails at op ([\d,]+) aten\.empty\.memory_format .*? in __init__, with ([\d.]+) GiB live", shown)
    assert float(m.group(2)) * GIB <= H100 < 2 * n


@pytest.mark.slow
def test_tree_and_flops(nb, cfg) -> None:
    tree = text(cell(nb, 'print(f"{len(trace.modules)} modules'))
    assert "0-79 x80" in tree
    assert f"{cfg.num_hidden_layers * module_params(cfg)['layer']}" in tree  # the folded layers' parameters
    out = text(cell(nb, 'flops = trace.flops()["forward"]'))
    tflop, rule = map(float, re.findall(r"([\d.]+) TFLOP", out))
    n_dense = total_params(cfg) - cfg.vocab_size * cfg.hidden_size
    attention = cfg.num_hidden_layers * 2 * (2 * SEQ * SEQ * cfg.head_dim * cfg.num_attention_heads)
    assert rule == pytest.approx(2 * n_dense * SEQ / 1e12, abs=0.01)
    assert tflop == pytest.approx((2 * n_dense * SEQ + attention) / 1e12, rel=2e-3)


@pytest.mark.slow
def test_no_grad_keeps_no_activations(nb) -> None:
    out = text(cell(nb, 'with fv.record(device="cuda:0") as with_grad:'))
    (no_act, no_peak), (act, peak) = [tuple(map(float, m)) for m in re.findall(
        r"Activation at the peak: +([\d.]+) GiB, peak +([\d.]+) GiB", out)]  # fmt: skip
    assert no_act == 0 and act > 10
    assert peak - no_peak == pytest.approx(act, abs=0.5)  # the saved activations are the difference


@pytest.mark.slow
def test_two_h100_placement_weights_transfers_and_verdict(nb, cfg) -> None:
    """Weights per device are the parameters of the modules the printed map put there (by hand), plus the rotary
    buffers (a real rotary embedding's); the verdict follows from the printed peaks and the H100's capacity."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary_buffers = sum(b.numel() * b.element_size() for b in LlamaRotaryEmbedding(cfg).buffers())
    params = module_params(cfg)
    placement = text(cell(nb, 'for dev in ("cuda:0", "cuda:1"):\n    names ='))
    maps = re.findall(r"(cuda:\d): (\d+) decoder layers \(model\.layers\.(\d+) \.\.\. model\.layers\.(\d+)\) \+ (\[.*\])",
                      placement)  # fmt: skip
    assert [m[0] for m in maps] == ["cuda:0", "cuda:1"]
    weights_line = text(cell(nb, "placed = plan.module"))
    hand, layers_seen, others_seen = {}, 0, []
    for dev, n_layers, first, last, others in maps:
        n_layers, others = int(n_layers), ast.literal_eval(others)
        assert int(last) - int(first) + 1 == n_layers
        layers_seen += n_layers
        others_seen += others
        p_bytes = 2 * (n_layers * params["layer"] + sum(params[o] for o in others))
        b_bytes = rotary_buffers if "model.rotary_emb" in others else 0
        m = _search(rf"{dev}: weights ([\d,]+) bytes = parameters ([\d,]+) \+ buffers ([\d,]+): True", weights_line)
        assert (_ints(m.group(1)), _ints(m.group(2)), _ints(m.group(3))) == (p_bytes + b_bytes, p_bytes, b_bytes), dev
        hand[dev] = p_bytes
        assert p_bytes < H100  # each half fits; the whole does not (test_single_gpu_forward_peak)
    assert layers_seen == cfg.num_hidden_layers
    assert sorted(others_seen) == sorted(["model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"])
    assert sum(hand.values()) == 2 * total_params(cfg)

    # transfers: the rotary tables back to each layer on cuda:0, the hidden states forward to cuda:1
    t = text(cell(nb, 'for dev in ("cuda:0", "cuda:1"):\n    names ='))
    rows = {(a, b): (int(c), int(d)) for a, b, c, d in re.findall(r"(cuda:\d) +(cuda:\d) +(\d+) +(\d+)", t)}
    layers0 = int(maps[0][1])
    assert rows[("cuda:1", "cuda:0")] == (2 * layers0, 2 * layers0 * SEQ * cfg.head_dim * 2)
    assert rows[("cuda:0", "cuda:1")][1] >= SEQ * cfg.hidden_size * 2

    # the verdict against the printed peaks and the H100's capacity
    bars = text(cell(nb, "def bars(peaks, width=60):"))
    shown = {d: (float(p), float(c)) for d, p, c in re.findall(r"(cuda:\d) .*? +([\d.]+) GiB of ([\d.]+)", bars)}
    assert set(shown) == {"cuda:0", "cuda:1"}
    for dev, (peak, cap) in shown.items():
        assert cap == round(H100 / GIB, 1)
        assert peak * GIB >= hand[dev]  # the weights are part of the peak
        assert peak < cap
    verdict = text(cell(nb, 'print("fits:", plan.fits)'))
    assert "fits: True" in verdict and "of 79.6 GiB" in verdict


@pytest.mark.slow
def test_training_does_not_fit_and_why(nb, cfg) -> None:
    """Weights + gradients + AdamW's two states, bf16: 4 x the weights per GPU, over an H100 before any activation."""
    half = 2 * total_params(cfg) / 2
    assert 4 * half > H100
    out = text(cell(nb, 'train = fv.plan("meta-llama/Llama-3.1-70B"'))
    assert "fits: False" in out
    for dev in ("cuda:0", "cuda:1"):
        w, g, o = map(float, _search(rf"{dev} +([\d.]+) +([\d.]+) +([\d.]+)", out).groups())
        assert w == pytest.approx(half / GIB, abs=0.1) and g == w and o == pytest.approx(2 * w, abs=0.1)
    bars = text(cell(nb, "bars(train_peaks)"))
    for peak, cap in re.findall(r"([\d.]+) GiB of ([\d.]+)", bars):
        assert float(peak) > float(cap) and float(peak) * GIB >= 4 * half * 0.99
    assert "fails before the first op" in bars
