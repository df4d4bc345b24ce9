"""The precision of each module's weights (``fakeviz/_engine/precision.py``, Note: [weight precision]) and the
recorder's ``meta["weight_precision"]``: read from real bitsandbytes, torchao and peft objects quantized on the CPU
by the libraries' own code, recorded for real (``fv.record(fake=False)``) and fake, joined across blocks, saved."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fakeviz as fv
from fakeviz._engine.precision import dtype_label, module_precision, tensor_precision


@pytest.mark.parametrize(
    ("dtype", "label"),
    [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float64, "fp64"),
     (torch.float8_e4m3fn, "fp8"), (torch.float8_e5m2, "fp8"), (torch.int8, "int8"), (torch.uint8, "uint8")],
)  # fmt: skip
def test_plain_dtypes(dtype, label) -> None:
    assert dtype_label(dtype) == label == dtype_label(str(dtype))
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        lin = nn.Linear(4, 4).to(dtype)
        assert module_precision(lin) == label and tensor_precision(lin.weight) == label


def test_own_weights_only() -> None:
    block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4).to(torch.bfloat16))
    assert module_precision(block) is None  # a container has no weights of its own
    assert [module_precision(m) for m in block] == ["fp32", "bf16"]
    assert module_precision(nn.ReLU()) is None and module_precision(nn.Dropout()) is None
    lin = nn.Linear(4, 4)
    lin.bias = nn.Parameter(lin.bias.detach().to(torch.float16))
    assert module_precision(lin) == "fp32"  # the weight decides, not the bias
    odd = nn.Module()
    odd.a, odd.b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
    assert module_precision(odd) == "mixed"


@pytest.mark.parametrize(
    ("quant_type", "double", "label"),
    [("nf4", False, "nf4"), ("nf4", True, "nf4+dq"), ("fp4", False, "fp4"), ("fp4", True, "fp4+dq")],
)
def test_bitsandbytes_4bit(quant_type: str, double: bool, label: str) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    lin = bnb.nn.Linear4bit(64, 32, compute_dtype=torch.bfloat16, quant_type=quant_type, compress_statistics=double)
    assert module_precision(lin) == "fp32"  # not quantized yet: the float weights are what memory holds
    lin = lin.to("cpu")  # bitsandbytes quantizes on the move to the device (its CPU backend here)
    assert lin.weight.dtype == torch.uint8 and lin.weight.quant_state.nested == double
    assert module_precision(lin) == label == tensor_precision(lin.weight)


def test_bitsandbytes_4bit_stored_as_bf16() -> None:
    """``bnb_4bit_quant_storage=torch.bfloat16`` (FSDP-QLoRA): the packed NF4 bytes in a bf16 tensor are still NF4."""
    bnb = pytest.importorskip("bitsandbytes")
    lin = bnb.nn.Linear4bit(64, 32, compute_dtype=torch.bfloat16, quant_type="nf4", quant_storage=torch.bfloat16)
    assert module_precision(lin) == "fp32"
    lin = lin.to("cpu")
    assert lin.weight.dtype == torch.bfloat16 and lin.weight.numel() == 64 * 32 // 4  # two bytes hold four weights
    assert module_precision(lin) == "nf4+dq"


def test_bitsandbytes_int8() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    lin = bnb.nn.Linear8bitLt(64, 32, has_fp16_weights=False)
    assert module_precision(lin) == "fp32"
    lin = lin.to("cpu")
    assert lin.weight.dtype == torch.int8 and module_precision(lin) == "int8"
    kept = bnb.nn.Linear8bitLt(64, 32, has_fp16_weights=True).half().to("cpu")  # fp16 weights kept: not LLM.int8
    assert module_precision(kept) == "fp16"


def _torchao_cases() -> list:
    cases = [("Int8WeightOnlyConfig", {}, "int8 weight-only"),
             ("Int8DynamicActivationInt8WeightConfig", {}, "int8 dynamic activation, int8 weight"),
             ("Float8WeightOnlyConfig", {}, "fp8 weight-only"),
             ("IntxWeightOnlyConfig", {"weight_dtype": torch.int4}, "int4 weight-only"),
             ("Int8DynamicActivationIntxWeightConfig", {"weight_dtype": torch.int4},
              "int8 dynamic activation, int4 weight")]  # fmt: skip
    return [pytest.param(*c, id=c[0]) for c in cases]


@pytest.mark.parametrize(("config", "kwargs", "label"), _torchao_cases())
def test_torchao(config: str, kwargs: dict, label: str) -> None:
    pytest.importorskip("torchao")
    import torchao.quantization as q

    model = nn.Sequential(nn.Linear(128, 64, dtype=torch.bfloat16), nn.LayerNorm(64, dtype=torch.bfloat16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.quantize_(model, getattr(q, config)(**kwargs))
    assert type(model[0].weight).__module__.startswith("torchao")
    assert model[0].weight.dtype == torch.bfloat16  # the subclass reports the original dtype: the type tells
    assert module_precision(model[0]) == label and module_precision(model[1]) == "bf16"


class QuantLinear(nn.Module):
    """gptqmodel's ``TorchQuantLinear`` as transformers builds it (gptqmodel is not installed here): a class of
    ``gptqmodel.nn_modules.qlinear``, ``bits`` and ``group_size`` attributes, the packed weight in int32 buffers."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits, self.group_size = bits, 128
        self.register_buffer("qweight", torch.zeros(256 * bits // 32, 64, dtype=torch.int32))
        self.register_buffer("scales", torch.zeros(2, 64, dtype=torch.float16))


QuantLinear.__module__ = "gptqmodel.nn_modules.qlinear.torch"  # where gptqmodel's layers live: the module says GPTQ


class WQLinear_GEMM(nn.Module):  # noqa: N801 - autoawq's class name, which says AWQ
    def __init__(self) -> None:
        super().__init__()
        self.w_bit = 4
        self.register_buffer("qweight", torch.zeros(64, 8, dtype=torch.int32))


def test_gptq_and_awq_layers() -> None:
    assert module_precision(QuantLinear(4)) == "gptq int4" and module_precision(QuantLinear(8)) == "gptq int8"
    assert module_precision(WQLinear_GEMM()) == "awq int4"
    lin = QuantLinear(4)
    lin.quant_method = "awq"  # an explicit quant_method wins over the class's module
    assert module_precision(lin) == "awq int4"
    plain = nn.Linear(2, 2)
    plain.bits = 4  # a stray attribute on a layer without packed weights is not a quantized layer
    assert module_precision(plain) == "fp32"


def test_lora_adapters_keep_their_own_dtype() -> None:
    peft = pytest.importorskip("peft")
    base = nn.Sequential(nn.Linear(8, 8, dtype=torch.bfloat16), nn.Linear(8, 8, dtype=torch.bfloat16))
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["0"]))
    layer = model.base_model.model[0]
    assert module_precision(layer) is None  # the wrapper: its base layer and adapters hold the weights
    assert module_precision(layer.base_layer) == "bf16"
    assert module_precision(layer.lora_A["default"]) == module_precision(layer.lora_B["default"]) == "fp32"


class _QLoRAish(nn.Module):
    """An embedding, two NF4 linears with LoRA on the first, a norm and an output layer in bf16."""

    def __init__(self, bnb) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 64, dtype=torch.bfloat16)
        self.q = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True)
        self.o = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=False)
        self.norm = nn.LayerNorm(64, dtype=torch.bfloat16)
        self.head = nn.Linear(64, 16, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.o(self.q(self.emb(x)))))


def test_the_recorder_notes_each_modules_precision_on_a_real_qlora_run() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_QLoRAish(bnb).to("cpu"), peft.LoraConfig(r=4, target_modules=["q"]))
    with fv.record(fake=False) as trace:
        model(torch.tensor([[1, 2, 3]])).float().sum().backward()
    labels = trace.meta["weight_precision"]
    root = "PeftModel.base_model.model"
    assert {k.removeprefix(root + "."): v for k, v in labels.items()} == {
        "emb": "bf16", "q.base_layer": "nf4+dq", "q.lora_A.default": "fp32", "q.lora_B.default": "fp32",
        "o": "nf4", "norm": "bf16", "head": "bf16",
    }  # fmt: skip
    assert "recorder_errors" not in trace.meta


class _ThreeDtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin, self.norm = (
            nn.Embedding(8, 16),
            nn.Linear(16, 16).to(torch.bfloat16),
            nn.LayerNorm(16).half(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(self.emb(x).to(torch.bfloat16)).half())


def test_fake_record_notes_what_the_real_one_does() -> None:
    with fv.record(fake=False) as real:
        _ThreeDtypes()(torch.tensor([1, 2]))
    with fv.record(device="cpu") as fake:
        _ThreeDtypes()(torch.tensor([1, 2]))
    assert real.meta["weight_precision"] == fake.meta["weight_precision"] == {
        "_ThreeDtypes.emb": "fp32", "_ThreeDtypes.lin": "bf16", "_ThreeDtypes.norm": "fp16"}  # fmt: skip


def test_a_model_quantized_after_it_was_first_seen_reads_as_it_ends() -> None:
    """The labels are taken when a root is first seen and again at the end of the block: the end wins."""
    pytest.importorskip("torchao")
    import torchao.quantization as q

    model = nn.Sequential(nn.Linear(32, 32, dtype=torch.bfloat16))
    with fv.record(fake=False) as trace:
        model(torch.ones(1, 32, dtype=torch.bfloat16))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q.quantize_(model, q.Int8WeightOnlyConfig())
    assert trace.meta["weight_precision"] == {"Sequential.0": "int8 weight-only"}


def test_joined_blocks_keep_every_blocks_modules(tmp_path) -> None:
    session = fv.FakeSession()
    with fv.record(session=session, device="cuda:0"):
        first = nn.Linear(4, 4).half()
        first(torch.ones(1, 4, dtype=torch.float16, device="cuda:0"))
    del first  # gone before the next block: only the first block's record knows it
    with fv.record(session=session, device="cuda:0") as second:
        nn.Linear(4, 4).to(torch.bfloat16)(torch.ones(1, 4, dtype=torch.bfloat16, device="cuda:0"))
    assert second.meta["weight_precision"] == {"Linear": "bf16"}
    joined = session.joined()
    assert set(joined.strings("modules")) == {"Linear"}  # the same path in both blocks: the later label wins
    assert joined.meta["weight_precision"] == {"Linear": "bf16"}
    session2 = fv.FakeSession()
    with fv.record(session=session2, device="cuda:0"):
        a = nn.Sequential(nn.Linear(4, 4).half())
        a(torch.ones(1, 4, dtype=torch.float16, device="cuda:0"))
    del a
    with fv.record(session=session2, device="cuda:0") as last:
        b = nn.ModuleDict({"x": nn.Linear(4, 4)})
        b["x"](torch.ones(1, 4, device="cuda:0"))
    assert last.meta["weight_precision"] == {"Linear": "fp32"}  # the first block's model died before this one
    assert session2.joined().meta["weight_precision"] == {"Sequential.0": "fp16", "Linear": "fp32"}


class _ToFloat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def test_saved_and_loaded(tmp_path) -> None:
    # an fp16 layer, then an fp32 one on fp32 inputs (a CUDA build's layer_norm refuses an fp16 input with fp32 weights)
    with fv.record(device="cuda:0") as trace:
        model = nn.Sequential(nn.Linear(4, 4).half(), _ToFloat(), nn.LayerNorm(4))
        model(torch.ones(1, 4, dtype=torch.float16, device="cuda:0"))
    back = fv.load(trace.save(tmp_path / "p.fvz"))
    assert back.meta["weight_precision"] == trace.meta["weight_precision"] == {"Sequential.0": "fp16",
                                                                               "Sequential.2": "fp32"}  # fmt: skip


LLAMA = "meta-llama/Llama-3.1-8B"
TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, bos_token_id=1, eos_token_id=2)  # fmt: skip


@pytest.mark.parametrize(("quantization", "label"), [("nf4", "nf4"), ("fp4", "fp4"), ("int8", "int8")])
def test_models_built_quantized_fake_equals_real(quantization: str, label: str) -> None:
    """``fv.models.build(quantization=...)`` quantizes with bitsandbytes' own code (fakeviz/models/_quant.py): the
    fake record notes what the real CPU record notes, the linears of the decoder layers in ``label``, the rest
    (embeddings, norms, the output head transformers leaves unquantized) bf16."""
    pytest.importorskip("bitsandbytes")
    notes = {}
    for fake in (False, True):
        with fv.record(fake=fake, device="cpu") as trace:
            torch.manual_seed(0)
            model = fv.models.build(LLAMA, quantization=quantization, dtype="bf16", **TINY)
            model(torch.randint(0, 256, (1, 8)))
        assert trace.error is None, trace.error
        notes[fake] = trace.meta["weight_precision"]
    assert notes[True] == notes[False]
    linears = {n for n, m in model.named_modules() if ".layers." in n and isinstance(m, nn.Linear)}
    assert len(linears) == 14
    for name, got in notes[True].items():
        path = name.removeprefix("LlamaForCausalLM.")
        assert got == (label if path in linears else "bf16"), (path, got)


def test_torchao_int4_on_a_fake_gpu() -> None:
    pytest.importorskip("torchao")
    with fv.record(device="cuda:0", gpu="H100") as trace:
        model = fv.models.build(LLAMA, quantization="int4", dtype="bf16", **TINY)
        model(torch.randint(0, 256, (1, 8), device="cuda:0"))
    assert trace.error is None, trace.error
    want = {f"LlamaForCausalLM.{n}": module_precision(m) for n, m in model.named_modules() if module_precision(m)}
    assert trace.meta["weight_precision"] == want  # the end state of the model, as the recorder saw it
    assert "int4 weight-only" in want.values() and want["LlamaForCausalLM.lm_head"] == "bf16"


def test_pre_quantized_layers() -> None:
    """fakeviz's layers for pre-quantized checkpoints (fakeviz/models/_prequantized.py): GPTQ and AWQ keep the packed
    weight in buffers and say their method and width; compressed-tensors 8-bit layers hold an fp8 or int8 weight."""
    from fakeviz._engine.checkpoint import TensorInfo
    from fakeviz.models import _prequantized as pq

    cpu, i, o = torch.device("cpu"), 128, 64

    def info(dtype: torch.dtype, shape: tuple[int, ...]) -> TensorInfo:
        return TensorInfo(dtype, shape, "model.safetensors")

    gptq = pq.GPTQLinear({"qweight": info(torch.int32, (i * 4 // 32, o)), "qzeros": info(torch.int32, (i // 32, 8)),
                          "scales": info(torch.float16, (i // 32, o)), "g_idx": info(torch.int32, (i,))}, 4, 32, cpu)  # fmt: skip
    awq = pq.AWQLinear({"qweight": info(torch.int32, (i, o // 8)), "qzeros": info(torch.int32, (i // 32, o // 8)),
                        "scales": info(torch.float16, (i // 32, o))}, 4, 32, cpu)  # fmt: skip
    scales = {"weight_scale": info(torch.float32, (o, 1))}
    fp8 = pq.CompressedLinear({"weight": info(torch.float8_e4m3fn, (o, i)), **scales}, None, True, cpu)
    int8 = pq.CompressedLinear({"weight": info(torch.int8, (o, i)), **scales}, None, True, cpu)
    assert [module_precision(m) for m in (gptq, awq, fp8, int8)] == ["gptq int4", "awq int4", "fp8", "int8"]


@pytest.mark.parametrize(
    ("fmt", "label", "rest"),
    [("gptq", "gptq int4", "fp16"), ("awq", "awq int4", "fp16"), ("nf4", "nf4+dq", "bf16"), ("ct-fp8", "fp8", "bf16")],
)
def test_pre_quantized_checkpoints_in_the_record(tmp_path, fmt: str, label: str, rest: str) -> None:
    """``from_pretrained`` of a pre-quantized checkpoint (sparse files written as the tests of
    fakeviz/models/_prequantized.py write them): the record notes each decoder linear in the checkpoint's format."""
    if fmt == "nf4":
        pytest.importorskip("bitsandbytes")
    import test_prequantized as checkpoints  # its checkpoint writers: the published repos' tensors, headers only

    checkpoints.write_checkpoint(tmp_path / fmt, fmt, None)
    with fv.record(device="cuda:0") as trace:
        model = fv.models.from_pretrained(tmp_path / fmt, device="cuda:0")
        model(torch.randint(0, 64, (1, 4), device="cuda:0"))
    assert trace.error is None, trace.error
    got = {k.removeprefix("LlamaForCausalLM."): v for k, v in trace.meta["weight_precision"].items()}
    linears = {k for k in got if ".layers." in k and k.rsplit(".", 1)[-1].endswith("_proj")}
    assert len(linears) == 14 and {got[k] for k in linears} == {label}
    assert {v for k, v in got.items() if k not in linears} == {rest}  # embeddings, norms and the head as stored
