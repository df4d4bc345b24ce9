"""Tutorial 09 (how long will it take): what it shows about step time is true.

The notebook runs once (``nbrun.execute``). Its figures are checked against computations that do not go through the
time model:

* the step's FLOPs against a hand count from Llama-3.2-1B's published widths (6 x linear parameters x tokens, plus
  attention's 4 b h s^2 d forward and 2.5 times that backward, PyTorch's formula for SDPA);
* tokens per second and MFU as the notebook's own arithmetic on its printed step time, with the peaks it quotes equal
  to NVIDIA's datasheets (and to the table the time model reads);
* each claim of the prose about the GPU and precision table (H100 about twice the A100 in bf16, between the two
  GPUs' bandwidth and compute ratios; TF32 wins most of fp32's loss back; mixed precision close to bf16 but with more
  memory; fp32 fits on none of the three) against the printed table and the GPUs' datasheet capacities;
* the per-class and per-module tables add up to the GPU time ``step_time`` printed, and the small step is host bound
  with about the same host time;
* every accuracy figure section 6 quotes is the documentation's (``docs/guide/time.md``, once the README's).
"""

from __future__ import annotations

import re

import pytest
from nbrun import ROOT, cell, execute, plain, text

NB = "09_how_long.ipynb"
NAME = "meta-llama/Llama-3.2-1B"
BATCH, SEQ = 4, 2048
TOKENS = BATCH * SEQ
# NVIDIA datasheets, dense bf16 tensor-core FLOP/s and HBM bytes/s (H100 SXM5, A100 SXM4 80GB, L40S)
DATASHEET_BF16 = {"H100": 989.4e12, "A100": 312e12, "L40S": 362.05e12}
DATASHEET_HBM = {"H100": 3.35e12, "A100": 2.039e12, "L40S": 0.864e12}
DATASHEET_MEMORY_GB = {"H100": 80, "A100": 80, "L40S": 48}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def _num(pattern: str, s: str) -> float:
    m = re.search(pattern, s)
    assert m, f"{pattern!r} not in:\n{s[:3000]}"
    return float(m.group(1).replace(",", ""))


def _h100(nb) -> dict[str, float]:
    out = plain(cell(nb, "# dense bf16 tensor-core peaks"))
    return {
        "step_ms": _num(r"step time\s+([\d.]+) ms on H100 \(gpu bound\)", out),
        "gpu_ms": _num(r"GPU busy\s+([\d.]+) ms", out),
        "host_ms": _num(r"host issuing ([\d.]+) ms", out),
        "flops": _num(r"FLOPs\s+([\d.e+]+)", out),
        "tokens_per_s": _num(r"tokens/s\s+([\d,]+)", out),
        "mfu": _num(r"MFU\s+([\d.]+)%", out) / 100,
    }


def _table(nb) -> dict[tuple[str, str], dict]:
    """The printed GPU x precision table: (precision, gpu) -> step_ms, tokens_per_s, bound, fits, peak_GiB."""
    out = plain(cell(nb, 'table.set_index(["precision", "gpu"])'))
    rows, precision = {}, None
    line_re = re.compile(
        r"^(bf16|fp32 \+ TF32|fp32|mixed \(autocast bf16\))?\s+(H100|A100|L40S)\s+([\d.]+)\s+(\d+)\s+(\w+)\s+"
        r"(True|False)\s+([\d.]+)\s*$"
    )
    for line in out.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        precision = m.group(1) or precision
        rows[(precision, m.group(2))] = {
            "step_ms": float(m.group(3)), "tokens_per_s": int(m.group(4)), "bound": m.group(5),
            "fits": m.group(6) == "True", "peak_GiB": float(m.group(7)),
        }  # fmt: skip
    assert len(rows) == 12, out
    return rows


def llama_training_flops() -> float:
    """FLOPs of one training step by hand from the published config (tied head: the embedding's matrix)."""
    from fakeviz import models

    cfg = models.config(NAME)
    h, i, v, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = h // heads
    linear = L * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * i) + v * h  # + the head
    matmuls = 6 * linear * TOKENS  # forward 2, backward 4 (input and weight gradients)
    attention_fwd = L * 4 * BATCH * heads * SEQ * SEQ * hd  # QK^T and PV, the full product (causal or not)
    return matmuls + attention_fwd * (1 + 2.5)


def test_peaks_quoted_are_the_datasheets_and_the_models() -> None:
    from fakeviz._core.gpu_specs import gpu_spec

    src = "\n".join(c.source for c in __import__("nbformat").read(ROOT / "notebooks" / NB, as_version=4).cells)
    assert 'PEAK_BF16 = {"H100": 989.4e12, "A100": 312.0e12, "L40S": 362.05e12}' in src
    for gpu, peak in DATASHEET_BF16.items():
        spec = gpu_spec(gpu)
        assert spec.peak_flops("torch.bfloat16") == peak
        assert spec.hbm_bytes_per_s == DATASHEET_HBM[gpu]
    assert round(989.4e12 / 3.35e12) == 295  # the ridge point exercise 4 quotes


def test_flops_tokens_and_mfu(nb) -> None:
    h = _h100(nb)
    hand = llama_training_flops()
    assert h["flops"] == pytest.approx(hand, rel=2e-3)  # elementwise FLOPs add a few hundredths of a percent
    assert h["tokens_per_s"] == pytest.approx(TOKENS / (h["step_ms"] / 1e3), rel=1e-3)
    assert h["mfu"] == pytest.approx(h["flops"] / (h["step_ms"] / 1e3) / DATASHEET_BF16["H100"], abs=1e-3)
    assert 0.25 < h["mfu"] < 0.40  # "about a third"
    assert h["gpu_ms"] <= h["step_ms"] and h["host_ms"] < h["gpu_ms"]
    out = plain(cell(nb, 'n_params = models.catalog().set_index("name")'))
    assert "1,235,814,400 parameters" in out
    rule = _num(r"6 x N x tokens = ([\d.e+]+)", out)
    assert rule == pytest.approx(6 * 1_235_814_400 * TOKENS, rel=1e-3)


def test_gpus_and_precisions_as_the_prose_says(nb) -> None:
    t = _table(nb)
    ms = {k: r["step_ms"] for k, r in t.items()}
    # bf16: the H100 about twice the A100, between the bandwidth and compute ratios; the L40S the slowest
    ratio = ms["bf16", "A100"] / ms["bf16", "H100"]
    assert 1.7 < ratio < 2.5
    assert DATASHEET_HBM["H100"] / DATASHEET_HBM["A100"] < ratio < DATASHEET_BF16["H100"] / DATASHEET_BF16["A100"]
    assert ms["bf16", "L40S"] > ms["bf16", "A100"] > ms["bf16", "H100"]
    assert DATASHEET_BF16["L40S"] > DATASHEET_BF16["A100"] and DATASHEET_HBM["L40S"] < DATASHEET_HBM["A100"] / 2
    for gpu in ("H100", "A100", "L40S"):
        assert ms["fp32", gpu] > 3 * ms["bf16", gpu]  # "several times slower"
        assert ms["fp32 + TF32", gpu] < ms["fp32", gpu]
        assert ms["mixed (autocast bf16)", gpu] < 1.35 * ms["bf16", gpu]  # "close to bf16"
        for precision in ("bf16", "fp32", "fp32 + TF32", "mixed (autocast bf16)"):
            row = t[precision, gpu]
            assert row["tokens_per_s"] == pytest.approx(TOKENS / (row["step_ms"] / 1e3), rel=2e-3)
            # fits: the step's peak under the GPU's memory (datasheet GB; the peak is printed in GiB)
            assert row["fits"] == (row["peak_GiB"] * 2**30 < DATASHEET_MEMORY_GB[gpu] * 1e9 * 0.99), (precision, gpu)
    assert ms["fp32", "A100"] == max(ms.values())  # the worst case
    assert ms["fp32", "L40S"] < ms["fp32", "A100"]  # the L40S's fp32 CUDA cores beat the A100's
    for gpu in ("H100", "A100"):  # TF32 wins most of the loss back
        assert (ms["fp32", gpu] - ms["fp32 + TF32", gpu]) > 0.5 * (ms["fp32", gpu] - ms["bf16", gpu])
    # memory: fp32 fits on none, bf16 and mixed on all; mixed keeps fp32 weights and states: more than bf16
    assert not any(t["fp32", g]["fits"] or t["fp32 + TF32", g]["fits"] for g in ("H100", "A100", "L40S"))
    assert all(t["bf16", g]["fits"] and t["mixed (autocast bf16)", g]["fits"] for g in ("H100", "A100", "L40S"))
    assert t["mixed (autocast bf16)", "H100"]["peak_GiB"] > t["bf16", "H100"]["peak_GiB"]


def test_where_the_time_goes_adds_up(nb) -> None:
    h = _h100(nb)
    out = plain(cell(nb, 'by_class = t.groupby("cls"'))
    shares = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s+([\d.]+)%[ \t]*$", out, re.M)}
    classes = {k: v for k, v in shares.items() if k not in ("compute", "memory", "latency")}
    bounds = {k: shares[k] for k in ("compute", "memory", "latency")}
    assert sum(classes.values()) == pytest.approx(100, abs=0.5) and sum(bounds.values()) == pytest.approx(100, abs=0.5)
    assert max(classes, key=classes.get) == "gemm"  # "the largest single class"
    others = classes["elementwise"] + classes["reduction"] + classes["copy"]
    assert 0.7 < others / classes["gemm"] < 1.4  # "about as long"
    mods = plain(cell(nb, 't["block"] = ('))
    rows = {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+(?: level\))?)\s+([\d.]+)\s+[\d.]+%$", mods, re.M)
    }
    assert "LlamaForCausalLM.model.layers.*.mlp" in rows and "(top level)" in rows, mods
    assert not any(re.search(r"layers\.\d", k) for k in rows)  # the layer index is folded
    # "the MLPs and the attention blocks take half the step"; the two norms "almost as long as" the attention
    layer = "LlamaForCausalLM.model.layers.*."
    assert 0.4 < (rows[layer + "mlp"] + rows[layer + "self_attn"]) / h["gpu_ms"] < 0.6
    norms = sum(v for k, v in rows.items() if k.startswith((layer + "input_layernorm", layer + "post_attention")))
    assert 0.7 < norms / rows[layer + "self_attn"] < 1.0
    total = _num(r"sum of est_s ([\d.]+) ms", plain(cell(nb, 'print(f"sum of est_s')))
    assert total == pytest.approx(_num(r"= gpu_s ([\d.]+) ms", plain(cell(nb, 'print(f"sum of est_s'))), abs=0.01)
    assert total == pytest.approx(h["gpu_ms"], abs=0.1)
    assert sum(rows.values()) <= total + 0.1  # the head(12) of the module table


def test_a_small_step_is_host_bound(nb) -> None:
    out = plain(cell(nb, "small = train_step(NAME, batch=1, seq=128)"))
    big = re.search(r"batch 4 x 2048: step\s+([\d.]+) ms, GPU busy\s+([\d.]+) ms, host\s+([\d.]+) ms -> gpu bound", out)
    small = re.search(
        r"batch 1 x 128: step\s+([\d.]+) ms, GPU busy\s+([\d.]+) ms, host\s+([\d.]+) ms -> host bound", out
    )
    assert big and small, out
    assert float(small.group(3)) == pytest.approx(float(big.group(3)), rel=0.02)  # the same ops to issue
    assert float(small.group(3)) > float(small.group(2))  # the host takes longer than the GPU
    assert float(small.group(1)) > float(big.group(1)) / 64  # not 64 times shorter
    faster = _num(r"on a host twice as fast: ([\d.]+) ms", out)
    assert faster < float(small.group(1))


def test_accuracy_figures_are_the_readmes(nb) -> None:
    readme = (ROOT / "docs" / "guide" / "time.md").read_text()  # the README's time-model section moved there
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    section = prose[prose.index("## 6. How far to trust it") :]
    for quoted, in_readme in (
        ("median |error| of **7.4 %**", "median |error| **7.4 %**"),
        ("worst **9.1 %**", "worst **9.1 %**"),
        ("**-5.8 % to +9.5 %**", "-5.8 % to +9.5 %"),
        ("**+5.9 %, -1.3 %, -9.4 %**", "+5.9 %, -1.3 %, -9.4 %"),
        ("30-40 %", "30-40 %"),
        ("6 held-out real H100 training steps", "6 held-out real H100 training steps"),
    ):
        assert quoted in section, quoted
        assert in_readme in " ".join(readme.split()), in_readme
    assert "Other GPUs are an extrapolation" in section and "Eager PyTorch only" in section


def test_explorer_cell_leaves_its_static_summary(nb) -> None:
    out = text(cell(nb, 'trace.explore(x_axis="time")'))
    assert "data-fv-static" in out and "fakeviz explorer" in out
