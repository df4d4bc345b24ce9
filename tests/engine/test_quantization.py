"""``quantization=`` of ``fv.models.build`` / ``from_pretrained`` (``fakeviz/models/_quant.py``, Note: [quantizing a
built model]): the model quantized by bitsandbytes' own code as transformers' loader does it, a fake record equal to
the real CPU record, the parameter bytes the library's formulas give, and the refusals."""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
import torch
from oplog_diff import first_diff, window_diff

import fakeviz as fv
from fakeviz._core.errors import ArgumentError
from fakeviz.models import _quant

bnb = pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")

LLAMA = "meta-llama/Llama-3.1-8B"
TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, bos_token_id=1, eos_token_id=2)  # fmt: skip
STORAGE_COLS = ["storage", "device", "nbytes", "category", "roles", "name", "alloc_seq", "free_seq", "owner"]


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    bnb.functional.name2qmap.setdefault("dynamic", bnb.functional.create_dynamic_map())


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return list(zip(*[df[c].astype(object).where(df[c].notna(), None).tolist() for c in STORAGE_COLS]))


@pytest.mark.parametrize("quantization", ["nf4", "fp4", "int8"])
def test_tiny_llama_fake_equals_real(quantization: str) -> None:
    traces = {}
    for fake in (False, True):
        torch.manual_seed(0)
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake, device="cpu") as t:
                m = fv.models.build(LLAMA, quantization=quantization, dtype="bf16", **TINY)
                ids = torch.randint(0, 256, (2, 16))
                m(ids, labels=ids).loss.backward()
        finally:
            gc.enable()
        assert t.error is None, t.error
        traces[fake] = t
    a, b = traces[False].oplog_lines(), traces[True].oplog_lines()
    i = first_diff(a, b)
    assert i is None, window_diff(a, b, i)
    r, f = _rows(traces[False].storages), _rows(traces[True].storages)
    assert first_diff(r, f) is None
    assert traces[False].peak_bytes() == traces[True].peak_bytes()
    cls = bnb.nn.Linear8bitLt if quantization == "int8" else bnb.nn.Linear4bit
    assert isinstance(m.model.layers[0].mlp.down_proj, cls)
    assert type(m.lm_head) is torch.nn.Linear  # transformers' rule: the output head stays
    assert m.is_loaded_in_4bit == (quantization != "int8") and m.is_loaded_in_8bit == (quantization == "int8")


def _linear_bytes(out_f: int, in_f: int, quantization: str) -> int:
    n = out_f * in_f
    if quantization == "int8":
        return n + out_f * 4  # int8 CB + float32 SCB per row
    return (n + 1) // 2 + math.ceil(n / 64) * 4 + 16 * 4  # packed, float32 absmax per 64, the 16-value code


@pytest.mark.parametrize("quantization", [None, "nf4", "int8"])
def test_build_on_fake_cuda_gives_the_library_bytes(quantization: str | None) -> None:
    cfg = fv.models.config(LLAMA, num_hidden_layers=1)
    with fv.record(device="cuda:0") as t:
        m = fv.models.build(LLAMA, quantization=quantization, num_hidden_layers=1)
    assert t.error is None
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    linears = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    dense = 2 * v * h * 2 + 3 * h * 2  # embeddings and head in bf16, three norms
    if quantization is None:
        want = dense + sum(o * k * 2 for o, k in linears)
    else:
        want = dense + sum(_linear_bytes(o, k, quantization) for o, k in linears)
    s = t.storages
    live = s[(s.free_seq < 0) & (s.device == "cuda:0") & (s.category == "Parameter")]
    assert int(live.nbytes.sum()) == want
    assert all(p.device.type == "cuda" and fv.is_fake(p) for p in m.parameters())


def test_quantized_step_on_fake_cuda_and_patches_undone() -> None:
    from fakeviz._engine import patches

    with fv.record(device="cuda:0") as t:
        m = fv.models.build(LLAMA, quantization="nf4", **TINY)
        ids = torch.randint(0, 256, (2, 16), device="cuda")
        m(ids, labels=ids).loss.backward()
    assert t.error is None
    ops = t.ops["op"].tolist()
    assert "bitsandbytes.gemm_4bit.default" in ops and "bitsandbytes.dequantize_4bit.default" in ops
    assert not any(p.grad is not None for n, p in m.named_parameters() if "proj" in n)  # frozen quantized weights
    assert m.model.embed_tokens.weight.grad is not None  # the gradient flows through them to the input side
    assert not {e for e, _, _ in patches.active()} & {"fake-param-subclass", "bnb-qmap", "bnb-paged"}


def test_from_pretrained_quantizes_the_checkpoint(tmp_path: Any) -> None:
    cfg = fv.models.config(LLAMA, **TINY)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    with fv.record(device="cuda:0") as t:
        m = fv.models.from_pretrained(tmp_path, quantization="nf4")
    assert t.error is None
    assert isinstance(m.model.layers[1].self_attn.q_proj, bnb.nn.Linear4bit)
    w = m.model.layers[1].self_attn.q_proj.weight
    assert w.dtype == torch.uint8 and w.numel() == 64 * 64 // 2 and w.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in m.parameters())
    s = t.storages
    cuda = s[s.device == "cuda:0"]
    final = int(cuda[(cuda.free_seq < 0) & (cuda.category == "Parameter")].nbytes.sum())
    assert final <= t.peak()["cuda:0"].bytes <= final + 128 * 64 * 2  # one bf16 weight at a time, as loaded


# ------------------------------------------------------------------------------------------------ resolve
def test_resolve_short_strings_and_configs() -> None:
    nf4 = _quant.resolve("nf4")
    assert (nf4.library, nf4.label) == ("bitsandbytes", "nf4")
    assert nf4.config.load_in_4bit and nf4.config.bnb_4bit_quant_type == "nf4"
    assert nf4.config.bnb_4bit_compute_dtype == torch.bfloat16
    assert _quant.resolve("FP4").config.bnb_4bit_quant_type == "fp4"
    assert _quant.resolve("int8").config.load_in_8bit
    dq = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True)
    assert _quant.resolve(dq).label == "fp4+dq" and _quant.resolve(dq).config is dq
    assert _quant.resolve(nf4) is nf4


def test_torchao_strings_go_to_torchao() -> None:
    pytest.importorskip("torchao")
    for short in ("int4", "fp8", "int8-wo", "int8-dyn", "int4-cpu"):
        q = _quant.resolve(short)
        assert q.library == "torchao" and q.label == short and q.config is not None


@pytest.mark.parametrize("bad", ["q4", "nf3", 4, 8.0, transformers.BitsAndBytesConfig(), object()])
def test_bad_values_are_refused_naming_what_is_accepted(bad: Any) -> None:
    with pytest.raises(ArgumentError) as err:
        _quant.resolve(bad)
    text = str(err.value)
    assert text.startswith("quantization=")
    for accepted in ("'nf4'", "'fp4'", "'int8'", "'int4'", "'fp8'", "BitsAndBytesConfig", "Int4WeightOnlyConfig"):
        assert accepted in text


def test_build_refuses_before_building() -> None:
    with pytest.raises(ArgumentError, match="quantization='nf5'"):
        fv.models.build(LLAMA, quantization="nf5", num_hidden_layers=1)


def test_qlora_step_fake_equals_real() -> None:
    """QLoRA as a script does it: NF4 weights, peft's prepare_model_for_kbit_training and LoRA, bitsandbytes'
    AdamW8bit on the adapters: the whole step, fake == real on the CPU."""
    peft = pytest.importorskip("peft")
    traces = {}
    for fake in (False, True):
        torch.manual_seed(0)
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake, device="cpu") as t:
                m = fv.models.build(LLAMA, quantization="nf4", dtype="bf16", **TINY)
                m = peft.prepare_model_for_kbit_training(m, use_gradient_checkpointing=False)
                m = peft.get_peft_model(m, peft.LoraConfig(r=8, target_modules="all-linear"))
                opt = bnb.optim.AdamW8bit([p for p in m.parameters() if p.requires_grad], lr=1e-4, min_8bit_size=16)
                ids = torch.randint(0, 256, (2, 16))
                m(ids, labels=ids).loss.backward()
                opt.step()
        finally:
            gc.enable()
        assert t.error is None, t.error
        traces[fake] = t
    a, b = traces[False].oplog_lines(), traces[True].oplog_lines()
    i = first_diff(a, b)
    assert i is None, window_diff(a, b, i)
    assert first_diff(_rows(traces[False].storages), _rows(traces[True].storages)) is None
    assert "bitsandbytes.optimizer_update_8bit_blockwise.default" in traces[True].ops["op"].tolist()
    cats = traces[True].memory(allocator=False)
    assert cats["Optimizer state"].max() > 0 and cats["Gradient"].max() > 0


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_a_quantized_build_never_holds_the_high_precision_model(quantization: str) -> None:
    # Note: [quantizing a built model]: the linear weights are made one at a time, as transformers' loader reads them
    cfg = fv.models.config(LLAMA, num_hidden_layers=2)
    with fv.record(device="cuda:0") as t:
        m = fv.models.build(LLAMA, quantization=quantization, num_hidden_layers=2)
    assert t.error is None and m is not None
    s = t.storages
    cuda = s[s.device == "cuda:0"]
    final = int(cuda[(cuda.free_seq < 0) & (cuda.category == "Parameter")].nbytes.sum())
    largest = cfg.intermediate_size * cfg.hidden_size * 2  # one bf16 MLP weight
    peak = t.peak()["cuda:0"].bytes
    assert final <= peak <= final + largest
    with fv.record(device="cuda:0") as dense:
        fv.models.build(LLAMA, num_hidden_layers=2)
    assert peak < dense.peak()["cuda:0"].bytes


def test_a_tied_head_stays_tied() -> None:
    with fv.record(device="cuda:0") as t:
        m = fv.models.build("Qwen/Qwen2.5-0.5B", quantization="nf4", num_hidden_layers=1)
    assert t.error is None
    assert m.config.tie_word_embeddings and m.lm_head.weight is m.get_input_embeddings().weight
    assert all(p.device.type == "cuda" for p in m.parameters())


@pytest.mark.parametrize("train", [False, True])
def test_llm_int8_on_fake_cuda_assumes_no_outliers(train: bool) -> None:
    # Note: [LLM.int8 outliers under fake tensors]: threshold 6.0, activations unknown: no outlier column, said so
    wide = {**TINY, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "vocab_size": 512}
    with fv.record(device="cuda:0") as t:  # activations past the values layer's 65536 elements: values unknown
        m = fv.models.build(LLAMA, quantization="int8", **wide).train(train)
        ids = torch.randint(0, 256, (8, 64), device="cuda")
        out = m(ids, labels=ids)
        if train:
            out.loss.backward()
    assert t.error is None
    assert "bitsandbytes.int8_mixed_scaled_mm.default" in t.ops["op"].tolist()
    said = t.fidelity()["assumptions"]
    assert len(said) and said["assumption"].str.contains("outlier columns").all()


def test_a_pre_quantized_checkpoint_refuses_quantization(tmp_path: Any) -> None:
    from test_prequantized import write_checkpoint  # a sparse pre-quantized Llama checkpoint (headers only)

    write_checkpoint(tmp_path / "nf4", "nf4")
    with pytest.raises(ArgumentError, match="already quantized"):
        fv.models.from_pretrained(tmp_path / "nf4", device="cuda:0", quantization="int8")
