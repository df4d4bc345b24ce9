"""Fine-tuning plans: ``fv.plan`` / ``sweep`` / ``max_batch`` / ``compare`` with ``lora=``, ``quantization=`` and
``optimizer=`` (``fakeviz/_frontends/adapters.py``, Note: [adapters in plans]; Note: [optimizer names] in steps.py).

A tiny Llama (the 8B entry with two blocks of width 64) gets LoRA by peft's own ``get_peft_model``. The fake record
of the plan's step equals the real CPU record of the same code op by op and byte by byte; gradient and optimizer
bytes equal hand counts made from the model's linear layers' shapes (not from peft's parameters); sweeps put the
adapters and quantization in their columns; bad values are refused before any recording.
"""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
import torch
from oplog_diff import first_diff, window_diff

import fakeviz as fv
from fakeviz._core.errors import ArgumentError
from fakeviz._frontends import adapters, steps

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256)  # fmt: skip
R = 8


@pytest.fixture(scope="module")
def cfg() -> Any:
    return fv.models.config("meta-llama/Llama-3.1-8B", **TINY)


def _linears(cfg: Any) -> list[tuple[int, int]]:
    """(in, out) of every linear layer "all-linear" adapts: the blocks' projections, not the output head (a hand
    count from the config's widths)."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_block = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]  # q k v o gate up down
    return per_block * cfg.num_hidden_layers


def _lora_numel(cfg: Any, r: int) -> int:
    return sum(r * (i + o) for i, o in _linears(cfg))


def _max(trace: Any, category: str) -> int:
    return int(trace.memory(device="cuda:0", allocator=False)[category].max())


# ------------------------------------------------------------------------------------ fake == real
def _step(cfg: Any, lora: Any, fake: bool, optimizer: str = "adamw", quantization: Any = None) -> dict[str, Any]:
    """The plan's code (build, quantization, adapters, the optimizer and its state, one training step) recorded on
    the CPU."""
    gc.collect()
    gc.disable()
    try:
        with fv.record(fake=fake, device="cpu") as trace:
            torch.manual_seed(0)
            model = fv.models.build(cfg, dtype=torch.bfloat16 if quantization else torch.float32)
            q = adapters.resolve_quantization(quantization)
            if q is not None:
                adapters.quantize(model, q)
            ad = adapters.apply(model, lora=lora, quantized=q is not None, train=True)
            opt = steps.make_optimizer(optimizer, ad.runner)
            steps.init_state(opt)
            steps.run(ad.runner, batch=2, seq=16, train=True, new_tokens=0, optimizer=opt)
    finally:
        gc.enable()
    assert trace.error is None, trace.error
    return {"oplog": trace.oplog_lines(), "peak": {d: v["bytes"] for d, v in trace.peak_bytes().items()},
            "memory": trace.memory(allocator=False), "phases": set(trace.ops["phase"])}  # fmt: skip


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_lora_step_fake_equals_real_cpu(cfg: Any, dora: bool) -> None:
    lora = peft.LoraConfig(r=R, target_modules="all-linear", use_dora=True) if dora else R
    real, fake = _step(cfg, lora, fake=False), _step(cfg, lora, fake=True)
    a, b = real["oplog"], fake["oplog"]
    i = first_diff(a, b)
    if i is not None:
        pytest.fail(f"op logs differ first at op {i} ({len(a)} real ops, {len(b)} fake):\n{window_diff(a, b, i)}")
    assert {"forward", "backward", "optimizer"} <= real["phases"]
    assert fake["peak"] == real["peak"] and real["peak"]["cpu"] > 0
    for col in fv.CATEGORIES:
        r, f = real["memory"][col].tolist(), fake["memory"][col].tolist()
        j = first_diff(r, f)
        assert j is None, f"{col} bytes differ first at row {j}: real {r[j]}, fake {f[j]}"
    # gradients: the adapters' only (float32, peft's autocast_adapter_dtype), DoRA with its magnitude vectors
    extra = sum(o for _, o in _linears(cfg)) if dora else 0
    assert int(real["memory"]["Gradient"].max()) == 4 * (_lora_numel(cfg, R) + extra)


@pytest.mark.parametrize(("quant", "kernel"), [("nf4", "quantize_4bit"), ("int8", "int8_vectorwise_quant")])
def test_qlora_step_fake_equals_real_cpu(cfg: Any, quant: str, kernel: str) -> None:
    """QLoRA as a script runs it (NF4 or LLM.int8 weights by bitsandbytes' own code, ``prepare_model_for_kbit_training``,
    LoRA r=8): bitsandbytes runs both for real on the CPU, so the fake record equals the real one."""
    bnb = pytest.importorskip("bitsandbytes")
    bnb.functional.quantize_blockwise(torch.ones(64))  # its dynamic code map is made once, on first use, and kept
    real, fake = _step(cfg, R, fake=False, quantization=quant), _step(cfg, R, fake=True, quantization=quant)
    a, b = real["oplog"], fake["oplog"]
    i = first_diff(a, b)
    if i is not None:
        pytest.fail(f"op logs differ first at op {i} ({len(a)} real ops, {len(b)} fake):\n{window_diff(a, b, i)}")
    assert any(kernel in line for line in a)
    assert fake["peak"] == real["peak"]
    for col in fv.CATEGORIES:
        assert real["memory"][col].tolist() == fake["memory"][col].tolist(), col
    assert int(real["memory"]["Gradient"].max()) == 4 * _lora_numel(cfg, R)  # the adapters' only


# ------------------------------------------------------------------------------ plans: hand counts
def test_lora_plan_trains_the_adapters_only(cfg: Any) -> None:
    p = fv.plan(cfg, gpus="H100", train=True, seq=32, lora=R)
    assert p.trace.error is None and p.fits
    n = _lora_numel(cfg, R)
    trainable = [q for q in p.module.parameters() if q.requires_grad]
    assert sum(q.numel() for q in trainable) == n
    assert all(q.dtype == torch.float32 for q in trainable)
    assert _max(p.trace, "Gradient") == 4 * n  # float32 gradients of the A and B matrices, nothing else
    assert _max(p.trace, "Optimizer state") == 2 * 4 * n  # AdamW: exp_avg and exp_avg_sq (its steps on the cpu)
    full = fv.plan(cfg, gpus="H100", train=True, seq=32)
    numel = sum(q.numel() for q in full.module.parameters())
    assert _max(full.trace, "Gradient") == 2 * numel  # bf16 gradients of every parameter
    s = p.settings
    assert (s["lora"], s["quantization"], s["optimizer"], s["dtype"]) == ("LoRA r=8", None, "adamw", "torch.bfloat16")
    assert "LoRA r=8" in repr(p) and "LoRA r=8" not in repr(full)


def test_dora_plan_adds_the_magnitude_vectors(cfg: Any) -> None:
    p = fv.plan(cfg, gpus="H100", train=True, seq=32, lora=peft.LoraConfig(r=R, target_modules="all-linear",
                                                                           use_dora=True))  # fmt: skip
    n = _lora_numel(cfg, R) + sum(o for _, o in _linears(cfg))
    assert _max(p.trace, "Gradient") == 4 * n
    assert _max(p.trace, "Optimizer state") == 2 * 4 * n
    assert p.settings["lora"] == "DoRA r=8"


def test_lora_config_is_not_changed_by_the_plan(cfg: Any) -> None:
    c = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    p = fv.plan(cfg, gpus="H100", train=True, seq=16, lora=c)
    assert c.target_modules == {"q_proj", "v_proj"} and c.task_type is None  # the user's config untouched
    h = cfg.hidden_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    assert _max(p.trace, "Gradient") == 4 * cfg.num_hidden_layers * 4 * ((h + h) + (h + kv))
    assert p.settings["lora"] == "LoRA r=4 on q_proj,v_proj"


def test_qlora_plan(cfg: Any) -> None:
    """``quantization="nf4", lora=8``: NF4 linears (packed uint8, half a byte per weight), the rest cast to float32 by
    ``prepare_model_for_kbit_training``, gradients and AdamW state on the adapters only; the compute dtype stays."""
    pytest.importorskip("bitsandbytes")
    p = fv.plan(cfg, gpus="H100", train=True, seq=32, lora=R, quantization="nf4")
    assert p.trace.error is None and p.fits
    n = _lora_numel(cfg, R)
    assert _max(p.trace, "Gradient") == 4 * n
    assert _max(p.trace, "Optimizer state") == 2 * 4 * n
    packed = {k: v for k, v in p.module.named_parameters() if "base_layer" in k}
    assert len(packed) == len(_linears(cfg))
    assert sum(v.numel() for v in packed.values()) == sum(i * o // 2 for i, o in _linears(cfg))
    assert all(v.dtype == torch.uint8 and not v.requires_grad for v in packed.values())
    rest = [v for k, v in p.module.named_parameters() if "base_layer" not in k and "lora_" not in k]
    assert rest and all(v.dtype == torch.float32 and not v.requires_grad for v in rest)  # prepare's cast
    assert (p.settings["quantization"], p.settings["lora"], p.settings["dtype"]) == (
        "nf4",
        "LoRA r=8",
        "torch.bfloat16",
    )
    assert "nf4, LoRA r=8" in repr(p)
    # MFU's peak: the dtypes the matmuls ran in, FLOP-weighted (issue 41): bf16 first, prepare's float32 head and the
    # float32 adapters' share after it
    assert p.speed.dtype.startswith("torch.bfloat16 ") and "torch.float32" in p.speed.dtype


def test_sweep_quantization_axis(cfg: Any) -> None:
    """On a module the user built (the plan quantizes its copy): the user's model keeps its bf16 weights."""
    pytest.importorskip("bitsandbytes")
    model = fv.models.build(cfg, device="cuda:0")
    df = fv.sweep(model, gpus="H100", train=True, seq=16, lora=16, quantization=[None, "nf4"], progress=False,
                  rank_by=None)  # fmt: skip
    assert [x if isinstance(x, str) else None for x in df["quantization"]] == [None, "nf4"]
    assert df["lora"].tolist() == ["LoRA r=16", "LoRA r=16"]
    a, b = df.attrs["plans"]
    assert a.module is not b.module
    assert _max(a.trace, "Gradient") == _max(b.trace, "Gradient") == 4 * _lora_numel(cfg, 16)
    # by hand: the linears' weights, the rest (embeddings, head, norms), the adapters, rotary's buffers (inv_freq and
    # original_inv_freq, float32, half a head each)
    lin = sum(i * o for i, o in _linears(cfg))
    h, v = cfg.hidden_size, cfg.vocab_size
    rest = 2 * v * h + (2 * cfg.num_hidden_layers + 1) * h
    lora, buf = 4 * _lora_numel(cfg, 16), 2 * 4 * (h // cfg.num_attention_heads) // 2
    assert df["cuda:0 weights"].iloc[0] == 2 * (lin + rest) + lora + buf  # bf16
    # NF4: half a byte per weight, a float32 absmax per block of 64 and the 16-entry code of each quant state; the
    # rest cast to float32 by prepare_model_for_kbit_training
    nf4 = lin // 2 + 4 * lin // 64 + 4 * 16 * len(_linears(cfg))
    assert df["cuda:0 weights"].iloc[1] == nf4 + 4 * rest + lora + buf
    with pytest.raises(ArgumentError, match="give lora=16 too"):
        fv.sweep(model, gpus="H100", train=True, quantization=[None, "nf4"], progress=False)
    assert {q.dtype for q in model.parameters()} == {torch.bfloat16}
    assert not any("lora_" in k for k, _ in model.named_parameters())


def _adafactor_numel(shape: tuple[int, ...]) -> int:
    # a row and a column second moment for a matrix, a full one for a vector; RMS a 0-d float32 tensor
    return (shape[0] + shape[1] if len(shape) == 2 else math.prod(shape)) + 1


@pytest.mark.parametrize("name", ["adamw", "adamw_fused", "adam", "sgd", "adafactor", "none"])
def test_optimizer_state_bytes_per_name(cfg: Any, name: str) -> None:
    """Full fine-tuning of the bf16 tiny Llama: each optimizer's state against a hand count from the shapes."""
    p = fv.plan(cfg, gpus="H100", train=True, seq=16, optimizer=name)
    shapes = [tuple(q.shape) for q in p.module.parameters()]
    numel = sum(math.prod(s) for s in shapes)
    want = {
        "adamw": 2 * 2 * numel,  # two moments in the parameters' dtype (bf16); the steps on the cpu
        "adam": 2 * 2 * numel,
        "adamw_fused": 2 * 2 * numel + 4 * len(shapes),  # fused: a float32 step per parameter on its device
        "sgd": 2 * numel,  # the momentum buffer
        "adafactor": 4 * sum(_adafactor_numel(s) for s in shapes),  # float32
        "none": 0,
    }[name]
    assert _max(p.trace, "Optimizer state") == want
    assert p.settings["optimizer"] == name
    if name != "none":
        assert p.trace.ops["phase"].eq("optimizer").any()


def _bnb_8bit_bytes(numel: int) -> int:
    """bitsandbytes' blockwise 8-bit AdamW state of one tensor: two uint8 moments and a float32 absmax per block of
    256 each; a tensor under 4,096 elements (min_8bit_size) keeps two float32 moments."""
    if numel < 4096:
        return 2 * 4 * numel
    return 2 * (numel + 4 * math.ceil(numel / 256))


@pytest.mark.parametrize("name", ["adamw8bit", "paged_adamw8bit"])
def test_bnb_8bit_optimizer_state_bytes(cfg: Any, name: str) -> None:
    pytest.importorskip("bitsandbytes")
    p = fv.plan(cfg, gpus="H100", train=True, seq=16, optimizer=name)
    assert p.trace.error is None
    numels = [q.numel() for q in p.module.parameters()]
    qmaps = 2 * 256 * 4  # the two dynamic code maps, one of each for the optimizer
    got = _max(p.trace, "Optimizer state")
    assert got == sum(_bnb_8bit_bytes(n) for n in numels) + qmaps


def test_paged_optimizer_state_is_named_in_the_plan() -> None:
    """PagedAdamW8bit keeps each 8-bit state of a tensor of at least 1e5 elements in paged (unified) memory: the plan
    counts it on the GPU and says how much of it is paged (Note: [paged optimizer state])."""
    pytest.importorskip("bitsandbytes")
    cfg = fv.models.config("meta-llama/Llama-3.1-8B", **{**TINY, "vocab_size": 2048})  # embeddings and head: 131,072
    paged = fv.plan(cfg, gpus="H100", train=True, seq=16, optimizer="paged_adamw8bit")
    plain = fv.plan(cfg, gpus="H100", train=True, seq=16, optimizer="adamw8bit")
    numels = [q.numel() for q in paged.module.parameters()]
    assert paged.settings["paged_bytes"] == sum(2 * n for n in numels if n >= 100_000) == 2 * 2 * 2048 * 64
    assert plain.settings["paged_bytes"] == 0
    assert _max(paged.trace, "Optimizer state") == _max(plain.trace, "Optimizer state")  # counted on the GPU alike
    assert "paged optimizer state" in paged.fit_text and "paged" not in plain.fit_text


def _ao_bytes(numel: int, bits: int) -> int:
    """torchao's low-bit AdamW state of one tensor: two blockwise moments (codes, a float32 scale per block, the
    code map) where the tensor holds at least 4,096 elements and the block divides it, else two plain moments."""
    block = 256 if bits == 8 else 128
    if numel < 4096 or numel % block:
        return 2 * 2 * numel  # zeros_like a bf16 parameter
    codes = numel * bits // 8
    return 2 * (codes + 4 * (numel // block) + 4 * (1 << bits))


@pytest.mark.parametrize("name,bits", [("adamw8bit_ao", 8), ("adamw4bit_ao", 4)])
def test_torchao_low_bit_optimizer_state_bytes(cfg: Any, name: str, bits: int) -> None:
    pytest.importorskip("torchao")
    p = fv.plan(cfg, gpus="H100", train=True, seq=16, optimizer=name)
    assert p.trace.error is None
    got = _max(p.trace, "Optimizer state")
    assert got == sum(_ao_bytes(q.numel(), bits) for q in p.module.parameters())


# ------------------------------------------------------------------------------------------ sweep
def test_sweep_lora_axis(cfg: Any) -> None:
    df = fv.sweep(cfg, gpus="H100", train=True, seq=16, lora=[None, 16], batch=[1, 2], progress=False, rank_by=None)
    assert [x if isinstance(x, str) else None for x in df["lora"]] == [None, None, "LoRA r=16", "LoRA r=16"]
    assert df["batch"].tolist() == [1, 2, 1, 2]
    plans = df.attrs["plans"]
    assert plans[0].module is plans[1].module and plans[2].module is plans[3].module  # one build per adapter
    assert plans[0].module is not plans[2].module
    assert df["cuda:0 gradients"].iloc[2] <= 4 * _lora_numel(cfg, 16)
    assert _max(plans[3].trace, "Gradient") == 4 * _lora_numel(cfg, 16)
    assert _max(plans[1].trace, "Gradient") == 2 * sum(q.numel() for q in plans[1].module.parameters())
    assert {q.settings["dtype"] for q in plans} == {"torch.bfloat16"}  # the compute dtype, LoRA or not


def test_sweep_optimizer_axis_and_compare_labels(cfg: Any) -> None:
    df = fv.sweep(cfg, gpus="H100", train=True, seq=16, lora=8, optimizer=["adamw", "sgd"], progress=False,
                  rank_by=None)  # fmt: skip
    assert df["optimizer"].tolist() == ["adamw", "sgd"]
    plans = df.attrs["plans"]
    n = _lora_numel(cfg, 8)
    assert [_max(p.trace, "Optimizer state") for p in plans] == [8 * n, 4 * n]
    cmp = fv.compare(plans, rank_by=None)
    assert [r for r in cmp.ranking.run] == ["balanced b1 s16 train LoRA r=8", "balanced b1 s16 train LoRA r=8, sgd"]


def test_max_batch_with_lora(cfg: Any) -> None:
    big = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=2)
    full = fv.max_batch(big, gpus="40GB", seq=2048, train=True, limit=64)
    lora = fv.max_batch(big, gpus="40GB", seq=2048, train=True, lora=16, limit=64)
    assert lora.value > full.value  # gradients and AdamW state of the adapters only
    assert lora.plan.settings["lora"] == "LoRA r=16"


# ------------------------------------------------------------------------------------- bad values
@pytest.mark.parametrize(("kw", "says"), [
    ({"optimizer": "adamw_8bit"}, "Did you mean 'adamw8bit'"),
    ({"optimizer": "adafactr"}, "Did you mean 'adafactor'"),
    ({"optimizer": 3}, "not an optimizer"),
    ({"lora": -1}, "at least 1"),
    ({"lora": "16"}, "not a LoRA rank"),
    ({"lora": 1.5}, "not a LoRA rank"),
    ({"lora": peft.IA3Config()}, "not a LoRA rank"),
])  # fmt: skip
def test_bad_values_are_refused(cfg: Any, kw: dict[str, Any], says: str) -> None:
    with pytest.raises(ArgumentError, match=says) as info:
        fv.plan(cfg, gpus="H100", train=True, seq=16, **kw)
    assert info.value.argument == next(iter(kw))


def test_sweep_refuses_a_bad_value(cfg: Any) -> None:
    with pytest.raises(ArgumentError, match="'sgd'"):
        fv.sweep(cfg, gpus="H100", train=True, optimizer=["adamw", "sdg"], progress=False)
    with pytest.raises(ArgumentError, match="LoRA rank"):
        fv.sweep(cfg, gpus="H100", train=True, lora=[8, "r16"], progress=False)


def test_parallel_plans_refuse_adapters() -> None:
    with pytest.raises(ArgumentError, match="parallel plan"):
        fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, train=True, lora=16)
    with pytest.raises(ArgumentError, match="parallel plan"):
        fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, train=True, optimizer="sgd")
    with pytest.raises(ArgumentError, match="parallel plan") as info:
        fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, quantization="nf4")
    assert info.value.argument == "quantization"


def test_adapters_over_weights_without_a_backward_are_refused_shortly(cfg: Any) -> None:
    """torchao's int4 weights run ``aten::_weight_int4pack_mm``, which has no derivative in torch: no gradient flows
    below them, so LoRA cannot train there (a real run stops at the same backward); inference plans run."""
    pytest.importorskip("torchao")
    with pytest.raises(ArgumentError, match=r"_weight_int4pack_mm\) has no backward") as info:
        fv.plan(cfg, gpus="H100", train=True, seq=16, lora=R, quantization="int4")
    assert info.value.argument == "quantization" and "nf4" in str(info.value)
    p = fv.plan(cfg, gpus="H100", seq=16, lora=R, quantization="int4")
    assert p.trace.error is None and p.settings["quantization"] == "int4"


def test_quantization_the_plans_gpu_cannot_run_is_refused_shortly(cfg: Any) -> None:
    """torchao's fp8 asks torch.cuda for compute capability 8.9: the plan quantizes as its GPUs (an A100 is 8.0)."""
    pytest.importorskip("torchao")
    with pytest.raises(ArgumentError, match="torchao refuses it on A100") as info:
        fv.plan(cfg, gpus="A100", seq=16, quantization="fp8")
    assert info.value.argument == "quantization"
    p = fv.plan(cfg, gpus="H100", seq=16, quantization="fp8")
    assert p.trace.error is None and p.settings["quantization"] == "fp8"


def test_qlora_checkpointing_axis_shares_one_build(cfg: Any) -> None:
    """QLoRA's gradient checkpointing follows each point's ``checkpointing=`` on one prepared model (Note: [adapters
    in plans]): the blocks keep only their inputs with it on, and the model is built once."""
    pytest.importorskip("bitsandbytes")
    df = fv.sweep(cfg, gpus="H100", train=True, seq=64, lora=R, quantization="nf4", checkpointing=[False, True],
                  progress=False, rank_by=None)  # fmt: skip
    a, b = df.attrs["plans"]
    assert a.module is b.module
    saved = [_max(p.trace, "Activation") for p in (a, b)]
    assert 0 < saved[1] < saved[0]
    for p in (a, b):  # the .grad the optimizer steps on: the adapters' only (one per A and B matrix)
        st, ops = p.trace.storages, p.trace.ops
        step = int(ops.index[ops.phase == "optimizer"][0])
        grads = st[(st.category == "Gradient") & ((st.free_seq < 0) | (st.free_seq > step))]
        assert len(grads) == 2 * len(_linears(cfg)) and int(grads.nbytes.sum()) == 4 * _lora_numel(cfg, R)
    assert _max(a.trace, "Gradient") == 4 * _lora_numel(cfg, R)


def test_qlora_sweep_over_train_builds_once_per_preparation(cfg: Any) -> None:
    """QLoRA prepares a model for training only (prepare_model_for_kbit_training): a sweep over ``train`` builds one
    model for the inference points and one for the training points, with ``train`` outermost."""
    pytest.importorskip("bitsandbytes")
    df = fv.sweep(cfg, gpus="H100", seq=16, lora=R, quantization="nf4", batch=[1, 2], train=[True, False],
                  progress=False, rank_by=None)  # fmt: skip
    plans = df.attrs["plans"]
    assert df[["train", "batch"]].values.tolist() == [[True, 1], [True, 2], [False, 1], [False, 2]]
    assert plans[0].module is plans[1].module and plans[2].module is plans[3].module
    assert plans[0].module is not plans[2].module
    emb = [p.module.get_input_embeddings().weight.dtype for p in (plans[0], plans[2])]
    assert emb == [torch.float32, torch.bfloat16]  # prepare's cast in the training build only
