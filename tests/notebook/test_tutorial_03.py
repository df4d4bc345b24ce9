"""Tutorial 03 (training memory): what it shows is true.

The notebook runs once (``nbrun.execute``, in the Binder-like environment). Its figures are checked here against
independent computations: the parameter bytes by hand from the published config (the formula checked against the
published parameter total), the peak's categories as hand sums of ``P`` (gradients = parameters, AdamW state = 2x
parameters in their dtype, the multi-tensor ``sqrt`` temporaries = parameters, which a real CPU run of PyTorch's
AdamW shows too), checkpointing lowering the saved activations (also in a real CPU run of a small Llama), and the
largest batch of ``fv.max_batch`` recorded directly here as a plain two-step training loop at ``b`` (fits) and
``b + 1`` (does not).
"""

from __future__ import annotations

import re

import pytest
import torch
from nbrun import cell, execute, text
from nbrun import find_int as _int

import fakeviz as fv
from fakeviz import models

tf = pytest.importorskip("transformers")

NB = "03_training_memory.ipynb"
NAME = "meta-llama/Llama-3.1-8B"
GIB = 2**30
KIB = 1024


@pytest.fixture(scope="module")
def nb():
    return execute(NB)


def llama_params(cfg) -> int:
    """Parameters of LlamaForCausalLM by hand from its config (untied head, no biases, RMSNorm weights only)."""
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    attn = h * cfg.num_attention_heads * hd + 2 * h * cfg.num_key_value_heads * hd + cfg.num_attention_heads * hd * h
    layer = attn + 3 * h * i + 2 * h
    head = 0 if cfg.tie_word_embeddings else v * h
    return v * h + cfg.num_hidden_layers * layer + h + head


def test_hand_formula_is_the_published_total() -> None:
    published = models.catalog().set_index("name").loc[NAME, "parameters"]
    assert llama_params(models.config(NAME)) == published == 8_030_261_248


# ------------------------------------------------------------------------------------ section 1 and 3: the peak
def _P(nb) -> int:
    return _int(r"P = ([\d,]+) bytes", text(cell(nb, "n_params = ")))


@pytest.mark.slow
def test_parameter_bytes_are_the_hand_count(nb) -> None:
    out = text(cell(nb, "n_params = "))
    cfg = models.config(NAME, num_hidden_layers=2)
    n = llama_params(cfg)
    assert _int(r"([\d,]+) parameters in torch.bfloat16", out) == n
    assert _P(nb) == 2 * n  # bf16


def _peak(nb) -> tuple[re.Match, dict[str, int]]:
    out = text(cell(nb, 'pk = trace.peak()["cuda:0"]'))
    head = re.search(r"peak ([\d,]+) bytes .* in the (\w+) phase at op (\d+): (\S+)", out)
    assert head, out
    cats = {
        m.group(1).strip(): int(m.group(2).replace(",", ""))
        for m in re.finditer(r"^  (\w[\w ]*?)\s+([\d,]+)  =", out, re.M)
    }
    return head, cats


@pytest.mark.slow
def test_peak_is_the_optimizer_step_and_its_categories_are_hand_sums(nb) -> None:
    """At AdamW's foreach sqrt: parameters P, gradients P, exp_avg + exp_avg_sq 2P (bf16 like the parameters),
    the sqrt temporaries P (plus AdamW's scalars), no activation."""
    P = _P(nb)
    head, cats = _peak(nb)
    assert head.group(2) == "optimizer" and head.group(4) == "aten._foreach_sqrt.default"
    assert cats["Parameter"] == P
    assert cats["Gradient"] == P
    assert cats["Optimizer state"] == 2 * P  # AdamW's step counters are on the cpu, not cuda:0
    assert P <= cats["Temporary"] < P + KIB
    assert "Activation" not in cats  # printed only when non-zero: all freed by backward
    rotary = tf.models.llama.modeling_llama.LlamaRotaryEmbedding(models.config(NAME))  # real, on the cpu
    assert cats["Buffer"] == sum(b.numel() * b.element_size() for b in rotary.buffers())  # the model's only buffers
    total = _int(r"peak ([\d,]+) bytes", text(cell(nb, 'pk = trace.peak()["cuda:0"]')))
    assert total == sum(cats.values()) and 5 * P <= total < 5 * P + 64 * KIB
    # the phase table agrees: parameters from init on, gradients from backward, state only in the optimizer
    table = text(cell(nb, 'mem = trace.memory(device="cuda:0")'))
    p_gib = f"{round(P / GIB, 2):.2f}"
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line.split()[:1] and
            line.split()[0] in ("init", "forward", "backward", "optimizer")}  # fmt: skip
    assert rows["init"][:3] == [p_gib, "0.00", "0.00"] and rows["forward"][1:3] == ["0.00", "0.00"]
    assert rows["backward"][1] == p_gib and rows["optimizer"][2] == f"{round(2 * P / GIB, 2):.2f}"


def _tiny_llama(**kw) -> tf.LlamaForCausalLM:
    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, **kw)  # fmt: skip
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg)


def test_foreach_sqrt_temporaries_are_the_parameters_in_a_real_run() -> None:
    """What the notebook explains, in real PyTorch: AdamW's multi-tensor step computes ``exp_avg_sq.sqrt()`` for
    every parameter in one ``_foreach_sqrt``, whose outputs are as large as all the parameters together (a real
    CPU run with ``foreach=True``, the implementation PyTorch picks on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model = _tiny_llama()
    ids = torch.randint(0, 256, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._foreach_sqrt.default:
                seen.append(sum(t.numel() * t.element_size() for t in out))
            return out

    with Log():
        opt.step()
    P = sum(p.numel() * p.element_size() for p in model.parameters())
    assert seen == [P]


# ------------------------------------------------------------------------- section 4: sweep, checkpointing
def _rows(out: str, first: str) -> list[list[str]]:
    return [line.split()[1:] for line in out.splitlines() if re.match(rf"^\d+\s+{first}", line)]


@pytest.mark.slow
def test_sweep_figures_are_hand_sums_of_the_published_count(nb) -> None:
    """Full depth: weights, gradients and AdamW state = 1, 1, 2 x 8,030,261,248 x the dtype's bytes; fp32 cannot
    fit an H100 (16 bytes per parameter before any activation) and bf16 does; the live peak is 5P."""
    n = models.catalog().set_index("name").loc[NAME, "parameters"]
    rows = _rows(text(cell(nb, "df = fv.sweep(")), r"(bf16|fp32)")
    assert [(r[0], r[1]) for r in rows] == [("bf16", "False"), ("bf16", "True"), ("fp32", "False"), ("fp32", "True")]
    capacity = 81559 * 2**20  # an H100 as the driver reports it
    for dtype, _ckpt, weights, grads, opt, acts, _tmp, _peak, fits in rows:
        P = n * (2 if dtype == "bf16" else 4)
        assert float(weights) == round(P / GIB, 2) and float(grads) == round(P / GIB, 2)
        assert float(opt) == round(2 * P / GIB, 2)
        assert float(acts) == 0.0
        assert fits == str(4 * P < capacity)  # by hand: weights + gradients + AdamW state alone
    acts = _rows(text(cell(nb, "rows = []")), r"torch\.(bfloat16|float32)")
    assert len(acts) == 4
    for dtype, ckpt, _act_bytes, _gib, live_peak, phase, op in acts:
        P = n * (2 if dtype == "torch.bfloat16" else 4)
        assert 5 * P <= int(live_peak) < 5 * P + 64 * KIB, (dtype, ckpt)
        assert (phase, op) == ("optimizer", "aten._foreach_sqrt.default")
    for no, yes in ((acts[0], acts[1]), (acts[2], acts[3])):
        assert no[1] == "False" and yes[1] == "True"
        assert int(yes[2]) < int(no[2]) / 5  # checkpointing: saved activations much smaller
        assert no[4] == yes[4]  # the live peak does not move: it is the optimizer step
        # each of the 32 checkpointed layers still keeps its input: batch 1 x 2048 x 4096 in the dtype
        assert int(yes[2]) >= 32 * 2048 * 4096 * (2 if no[0] == "torch.bfloat16" else 4)


def _saved_activations(checkpointing: bool, fake: bool) -> int:
    with fv.record(fake=fake) as trace:  # the model built inside: real in the real run, fake in the fake one
        model = _tiny_llama(use_cache=False)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        torch.manual_seed(1)
        ids = torch.randint(0, 256, (2, 64))
        model(input_ids=ids, labels=ids).loss.backward()
    return int(trace.memory(allocator=False)["Activation"].max())


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
def test_checkpointing_lowers_saved_activations_in_a_real_run() -> None:
    """The notebook's claim on a real CPU run of a small Llama, and the fake run of the same code agrees."""
    real = {c: _saved_activations(c, fake=False) for c in (False, True)}
    assert 0 < real[True] < real[False]
    assert {c: _saved_activations(c, fake=True) for c in (False, True)} == real


# ------------------------------------------------------------------------------------- section 5: max_batch
def _two_steps_fit(batch: int, checkpointing: bool) -> bool:
    """A plain training loop recorded directly: two AdamW steps (the second with the first's state alive)."""
    with fv.record(device="cuda:0", gpu="H100") as trace:
        model = models.build(NAME)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, model.config.vocab_size, (batch, 2048))
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert trace.error is None
    return bool(trace.verdict("H100")["fits"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
def test_max_batch_is_b_fits_and_b_plus_one_does_not(nb) -> None:
    out = text(cell(nb, "plain = fv.max_batch("))
    found = dict(re.findall(r"^(without checkpointing|with checkpointing): largest batch (\d+)", out, re.M))
    plain, ckpt = int(found["without checkpointing"]), int(found["with checkpointing"])
    assert 1 <= plain < ckpt
    for b, on in ((plain, False), (ckpt, True)):
        assert _two_steps_fit(b, on), (b, on)
        assert not _two_steps_fit(b + 1, on), (b + 1, on)
    assert re.search(
        rf"batch {plain + 1} fails in forward at op [\d,]+ aten\.mm\.default in \S+\.layers\.\d+\.mlp", out
    )
    assert f"batch {ckpt + 1} fails in backward at op" in out and "_log_softmax_backward_data" in out
