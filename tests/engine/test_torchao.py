"""torchao under fake tensors (issue 31): quantized weights (torchao's own tensor subclasses, their inner tensors fake)
and torchao's low-bit optimizers in records.

* where torchao's kernels run on the CPU (int8 weight-only, int8 dynamic; AdamW8bit / AdamW4bit / AdamWFp8), a fake
  record equals the real CPU record op by op and storage by storage;
* the storages of a quantized weight are torchao's own tensors (int8 data + scale + zero point; packed int4 +
  scale_and_zero; fp8 data + scale), byte for byte, on several shapes;
* fp8 and tinygemm int4 (CUDA-only) on fake cuda: the bytes of torchao's layout and a ``fidelity()`` row;
* the repro of issue 31 (``quantize_`` inside a record raised AttributeError in the values layer).
"""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
import torch
from oplog_diff import first_diff, window_diff

import fakeviz as fv

pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Float8DynamicActivationFloat8WeightConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    PerRow,
    quantize_,
)

from fakeviz._core.errors import ArgumentError  # noqa: E402
from fakeviz._engine import torchao_patches  # noqa: E402
from fakeviz.models import _quant_torchao as qt  # noqa: E402

BF16 = torch.bfloat16
OUTPUT_COLS = ["seq", "shape", "stride", "dtype", "device", "storage", "storage_offset", "nbytes"]
STORAGE_COLS = ["storage", "device", "nbytes", "category", "roles", "name", "alloc_seq", "free_seq", "owner"]
CPU_CONFIGS = {"int8-wo": Int8WeightOnlyConfig, "int8-dyn": Int8DynamicActivationInt8WeightConfig,
               "int4-cpu": lambda: qt.config_for("int4-cpu")}  # fmt: skip


def _mlp(dev: str = "cpu", k: int = 64, n: int = 128) -> torch.nn.Module:
    # built in bf16 (no .to(): a module's .to frees the old parameters one op later in a fake run, apart from torchao)
    return torch.nn.Sequential(torch.nn.Linear(k, n, dtype=BF16, device=dev), torch.nn.ReLU(),
                               torch.nn.Linear(n, k, dtype=BF16, device=dev))  # fmt: skip


def _rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
    data = [df[c].astype(object).where(df[c].notna(), None).tolist() for c in cols]
    return list(zip(*data))


def _pair(fn: Any) -> tuple[fv.Trace, fv.Trace]:
    out = []
    for fake in (False, True):
        gc.collect()
        gc.disable()
        try:
            with fv.record(fake=fake) as t:
                fn()
        finally:
            gc.enable()
        assert t.error is None, t.error
        out.append(t)
    return out[0], out[1]


def _assert_same(real: fv.Trace, fake: fv.Trace) -> None:
    a, b = real.oplog_lines(), fake.oplog_lines()
    i = first_diff(a, b)
    assert i is None, f"op logs differ at op {i}:\n" + window_diff(a, b, i)
    for cols, table in ((OUTPUT_COLS, "outputs"), (STORAGE_COLS, "storages")):
        r, f = _rows(getattr(real, table), cols), _rows(getattr(fake, table), cols)
        j = first_diff(r, f)
        assert j is None, (
            f"{table} differ at row {j}: real {r[j] if j < len(r) else None}, fake {f[j] if j < len(f) else None}"
        )
    assert {d: v["bytes"] for d, v in fake.peak_bytes().items()} == {
        d: v["bytes"] for d, v in real.peak_bytes().items()
    }
    for dev, r in real.peak().items():
        f = fake.peak()[dev]
        assert (f.bytes, f.seq, f.op, f.module, f.user_line, f.by_category) == (
            r.bytes, r.seq, r.op, r.module, r.user_line, r.by_category)  # fmt: skip


def _weight_storages(trace: fv.Trace, name: str) -> list[int]:
    st = trace.storages
    rows = st[(st.name == name) & (st.free_seq < 0)]
    return sorted(int(x) for x in rows.nbytes)


# ------------------------------------------------------------------------------------------- the repro
def test_regression_quantize_inside_a_record() -> None:
    # issue 31: AttributeError: 'Int8Tensor' object has no attribute 'constant' in _engine/values.py
    with fv.record(device="cpu") as trace:
        m = torch.nn.Linear(64, 128, dtype=BF16)
        quantize_(m, Int8WeightOnlyConfig())
        y = m(torch.randn(2, 64, dtype=BF16))
    w = m.weight
    assert type(w).__name__ == "Int8Tensor" and y.shape == (2, 128)
    assert all(fv.is_fake(getattr(w, a)) for a in w.__tensor_flatten__()[0])
    # its memory: the int8 data, the fp32 scale and the int8 zero point, each a parameter storage named as the weight
    assert _weight_storages(trace, "Linear.weight") == sorted([128 * 64, 128 * 4, 128])
    params = trace.storages[trace.storages.category == "Parameter"]
    assert int(params[params.free_seq < 0].nbytes.sum()) == 128 * 64 + 128 * 4 + 128 + 128 * 2  # + the bf16 bias


# ------------------------------------------------------------------------------ fake equals real on the CPU
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("config", list(CPU_CONFIGS))
def test_quantized_forward_equals_real(config: str, backward: bool) -> None:
    def run() -> None:
        torch.manual_seed(0)
        m = _mlp()
        quantize_(m, CPU_CONFIGS[config]())
        x = torch.randn(4, 64, dtype=BF16, requires_grad=backward)
        y = m(x)
        if backward:
            y.float().sum().backward()

    real, fake = _pair(run)
    _assert_same(real, fake)
    assert ("aten._int_mm.default" in " ".join(fake.oplog_lines())) == (config == "int8-dyn")  # int8 x int8


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit", "AdamWFp8"])
def test_low_bit_optimizer_step_equals_real(name: str) -> None:
    import torchao.optim

    cls = getattr(torchao.optim, name)

    def run() -> tuple[torch.nn.Module, Any]:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        opt = cls(m.parameters(), lr=1e-3)
        for _ in range(2):
            m(torch.randn(8, 256)).sum().backward()
            opt.step()
            opt.zero_grad()
        return m, opt

    with fv.record(fake=False):  # torchao builds its quantization maps once per process (functools caches)
        run()
    got: dict[bool, Any] = {}

    def keep() -> None:
        got[torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None] = run()

    real, fake = _pair(keep)
    _assert_same(real, fake)
    # the state is torchao's subclass, its codes and scales fake tensors, and they are the optimizer state's bytes
    m, opt = got[True]
    state = [v for p in m.parameters() for v in opt.state[p].values() if type(v).__name__.startswith("OptimState")]
    assert state and all(fv.is_fake(getattr(s, a)) for s in state for a in s.__tensor_flatten__()[0])
    # the codes, the scales and the code book (qmap) of each quantized state; small parameters' (the biases) states
    # are plain fp32 tensors, as the step counters
    inner = [getattr(s, a) for s in state for a in s.__tensor_flatten__()[0]]
    assert len(inner) == (2 if name == "AdamWFp8" else 3) * len(state)  # fp8 codes need no code book
    plain = [v for p in m.parameters() for v in opt.state[p].values() if not type(v).__name__.startswith("OptimState")]
    live = fake.storages[fake.storages.free_seq < 0]
    total = sum(t.untyped_storage().nbytes() for t in inner + plain)
    assert int(live[live.category == "Optimizer state"].nbytes.sum()) == total
    codes = sum(s.codes.untyped_storage().nbytes() for s in state)
    assert codes == {"AdamW8bit": 1, "AdamW4bit": 0.5, "AdamWFp8": 1}[name] * sum(s.numel() for s in state)
    assert torchao_patches.EAGER_STEP in set(fake.fidelity()["assumptions"].assumption)


# -------------------------------------------------------------------------- bytes = torchao's own layout
@pytest.mark.parametrize("shape", [(64, 128), (96, 256), (200, 96), (512, 1024)])
@pytest.mark.parametrize("config", list(CPU_CONFIGS))
def test_cpu_weight_bytes_are_torchaos(config: str, shape: tuple[int, int]) -> None:
    n, k = shape
    real = torch.nn.Linear(k, n, dtype=BF16)
    quantize_(real, CPU_CONFIGS[config]())
    expect = sorted(getattr(real.weight, a).untyped_storage().nbytes() for a in real.weight.__tensor_flatten__()[0])
    if config == "int4-cpu":  # int4 values one per int8 byte; a bf16 scale and an int8 zero point per group of 32
        assert expect == sorted([n * k, n * k // 32 * 2, n * k // 32])
    else:  # int8 data, fp32 scale per row, int8 zero point per row
        assert expect == sorted([n * k, n * 4, n])
    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Linear(k, n, dtype=BF16)
        quantize_(m, CPU_CONFIGS[config]())
    assert _weight_storages(trace, "Linear.weight") == expect
    mods = trace.modules  # the module's parameter bytes: the quantized weight's tensors and the bf16 bias
    assert int(mods[mods.path == "Linear"].param_bytes.iloc[0]) == sum(expect) + 2 * n


def _int4_bytes(n: int, k: int, group: int = 128) -> list[int]:
    """torchao's Int4TilePackedTo4dTensor: k padded to 1024, n to 8; int32 [n/8, k/128, 32, 4] (two int4 per byte)
    and scale_and_zero bf16 [k/group, n, 2]."""
    kp, np_ = math.ceil(k / 1024) * 1024, math.ceil(n / 8) * 8
    return sorted([np_ * kp // 2, kp // group * np_ * 2 * 2])


@pytest.mark.parametrize("shape", [(256, 1024), (208, 1152), (4096, 2048)])  # k: a multiple of the group (128)
def test_int4_and_fp8_bytes_on_fake_cuda(shape: tuple[int, int]) -> None:
    # (torchao leaves a weight unquantized where k is not a multiple of the group, or fp8's dims not of 16)
    n, k = shape
    got = {}
    for key, config in (("int4", qt.config_for("int4")), ("fp8", Float8DynamicActivationFloat8WeightConfig()),
                        ("fp8-row", Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))):  # fmt: skip
        with fv.record(device="cuda:0") as trace:
            m = torch.nn.Linear(k, n, dtype=BF16, device="cuda")
            quantize_(m, config)
            m(torch.randn(4, k, dtype=BF16, device="cuda"))
        got[key] = (trace, m)
    trace, m = got["int4"]
    assert type(m.weight).__name__ == "Int4TilePackedTo4dTensor"
    assert _weight_storages(trace, "Linear.weight") == _int4_bytes(n, k)
    rows = trace.fidelity()["assumptions"]
    assert {"aten._convert_weight_to_int4pack.default", "aten._weight_int4pack_mm.default"} <= set(rows.op)
    trace, m = got["fp8"]
    assert type(m.weight).__name__ == "Float8Tensor" and m.weight.qdata.dtype == torch.float8_e4m3fn
    assert _weight_storages(trace, "Linear.weight") == sorted([n * k, 4])  # one fp32 scale per tensor
    assert "aten._scaled_mm.default" in set(trace.fidelity()["assumptions"].op)
    trace, _ = got["fp8-row"]
    assert _weight_storages(trace, "Linear.weight") == sorted([n * k, n * 4])  # one fp32 scale per row


def test_fp8_follows_the_named_gpu() -> None:
    # torchao refuses fp8 below sm89 on a real GPU: so does the fake A100, and outside a session torchao's own checks
    with pytest.raises(AssertionError, match="8.9"), fv.record(device="cuda:0", gpu="A100"):
        m = torch.nn.Linear(64, 64, dtype=BF16, device="cuda")
        quantize_(m, Float8DynamicActivationFloat8WeightConfig())
    import torchao.utils

    assert not getattr(torchao.utils.is_sm_at_least_89, "_fakeviz_sm", False)
    if not torch.cuda.is_available():
        assert not torchao.utils.is_sm_at_least_89()


@pytest.mark.parametrize("config", ["int8-wo", "int8-dyn", "fp8"])
def test_fake_mode_on_fake_cuda(config: str) -> None:
    cfg = qt.config_for(config)
    with fv.fake_mode(device="cuda:0"):
        m = _mlp("cuda", 256, 256)
        quantize_(m, cfg)
        y = m(torch.randn(4, 256, dtype=BF16, device="cuda"))
    w = m[0].weight
    assert type(w).__name__ in ("Int8Tensor", "Float8Tensor") and y.shape == (4, 256)
    assert all(fv.is_fake(getattr(w, a)) and getattr(w, a).device.type == "cuda" for a in w.__tensor_flatten__()[0])


def test_int8_dynamic_on_fake_cuda_records_int_mm() -> None:
    # on CUDA torchao's int8 matmul goes through the higher-order op out_dtype: its dense kernel's ops are recorded
    with fv.record(device="cuda:0") as trace:
        m = _mlp("cuda", 256, 256)
        quantize_(m, Int8DynamicActivationInt8WeightConfig())
        m(torch.randn(4, 256, dtype=BF16, device="cuda"))
    lines = [x for x in trace.oplog_lines() if "aten._int_mm.default" in x]
    assert len(lines) == 2 and all("i32[4, 256] cuda:0" in x for x in lines)


# ------------------------------------------------------------------------------------------- _quant_torchao
def _kind(t: torch.Tensor) -> str:
    """torchao's subclass name, or "plain" for an unquantized (fake) parameter."""
    return (
        "plain"
        if type(t) in (torch.nn.Parameter, torch.Tensor) or fv.is_fake(t) and not hasattr(t, "qdata")
        else type(t).__name__
    )


def _tiny_llama(dev: str = "cuda", hidden: int = 64, inter: int = 128) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False)  # fmt: skip
    with torch.device(dev):
        return LlamaForCausalLM(cfg).to(BF16)


def test_apply_skips_what_transformers_skips() -> None:
    with fv.record(device="cuda:0"):
        model = _tiny_llama()
        qt.apply(model, qt.config_for("int8-wo"))
        model(torch.zeros(1, 8, dtype=torch.long, device="cuda"))
    kinds = {n: _kind(m.weight) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert kinds.pop("lm_head") == "plain"
    assert kinds and set(kinds.values()) == {"Int8Tensor"}
    assert _kind(model.model.embed_tokens.weight) == "plain"


def test_apply_takes_transformers_torchao_config() -> None:
    from transformers import TorchAoConfig

    hf = TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=["model.layers.1"])
    assert qt.is_torchao_config(hf) and qt.label(hf) == "int8 weight-only"
    with fv.fake_mode(device="cuda:0"):
        model = _tiny_llama()
        qt.apply(model, hf)
    layers = model.model.layers
    assert _kind(layers[0].mlp.up_proj.weight) == "Int8Tensor"
    assert _kind(layers[1].mlp.up_proj.weight) == "plain"
    assert _kind(model.lm_head.weight) == "Int8Tensor"  # a user's list replaces the default skips, as there


def test_config_for_and_labels() -> None:
    assert qt.label(qt.config_for("int4")) == "int4 weight-only (group 128, tile_packed_to_4d)"
    assert qt.label(qt.config_for("fp8")) == "fp8 dynamic activation, fp8 weight"
    assert qt.label(qt.config_for("int8_dyn")) == "int8 dynamic activation, int8 weight"
    assert qt.label(qt.config_for("int4-cpu")) == "int4 weight-only (intx, unpacked_to_int8)"
    assert qt.is_torchao_config(Int8WeightOnlyConfig()) and not qt.is_torchao_config("int8")
    with pytest.raises(ArgumentError, match="int4"):
        qt.config_for("int3")
    with pytest.raises(ArgumentError, match="not a torchao config"):
        qt.apply(torch.nn.Linear(2, 2), "int8")


def test_tiny_llama_bytes_by_precision() -> None:
    """The parameter bytes of a 2-layer tiny Llama in bf16, int8, int4 and fp8: each linear's bytes are torchao's
    layout, the rest (embeddings, norms, lm_head) stays bf16. Hidden 256: every linear's in-features are a multiple
    of int4's group (128), else torchao leaves it unquantized (and a 128x128 fp8 weight fails in torchao itself)."""
    totals = {}
    for key in (None, "int8-wo", "int4", "fp8"):
        with fv.record(device="cuda:0") as trace:
            model = _tiny_llama(hidden=256, inter=512)
            if key is not None:
                qt.apply(model, qt.config_for(key))
            model(torch.zeros(1, 8, dtype=torch.long, device="cuda"))  # the model's parameters named at its forward
        live = trace.storages[trace.storages.free_seq < 0]
        totals[key] = int(live[live.category == "Parameter"].nbytes.sum())
    shapes = [tuple(m.weight.shape) for n, m in _tiny_llama("meta", 256, 512).named_modules()
              if isinstance(m, torch.nn.Linear) and n != "lm_head"]  # fmt: skip
    linear_bf16 = sum(2 * n * k for n, k in shapes)
    rest = totals[None] - linear_bf16
    assert rest > 0
    assert totals["int8-wo"] == rest + sum(n * k + n * 4 + n for n, k in shapes)
    assert totals["int4"] == rest + sum(sum(_int4_bytes(n, k)) for n, k in shapes)
    assert totals["fp8"] == rest + sum(n * k + 4 for n, k in shapes)


def test_int4_plain_without_mslk_is_a_short_error() -> None:
    # torchao 0.18's default int4 packing ("plain") needs the mslk package (CUDA kernels); without it apply() says
    # what to give instead, where quantize_ raises torchao's ImportError
    from torchao.quantization import Int4WeightOnlyConfig
    from torchao.quantization.quantize_.workflows.int4 import int4_tensor

    if int4_tensor.int4_row_quantize_zp is not None:
        pytest.skip("mslk is installed: plain int4 runs")
    with fv.fake_mode(device="cuda:0"):
        model = _tiny_llama(hidden=128, inter=256)
        with pytest.raises(ArgumentError, match="tile_packed_to_4d"):
            qt.apply(model, Int4WeightOnlyConfig())


def test_low_bit_optimizer_state_on_fake_cuda() -> None:
    import torchao.optim

    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Linear(512, 256, device="cuda")
        opt = torchao.optim.AdamW4bit(m.parameters(), lr=1e-3)
        m(torch.randn(8, 512, device="cuda")).sum().backward()
        opt.step()
    st = opt.state[m.weight]["exp_avg"]
    assert type(st).__name__ == "OptimState4bit" and st.codes.device.type == "cuda" and fv.is_fake(st.codes)
    live = trace.storages[trace.storages.free_seq < 0]
    # two 4-bit states of the weight (codes: two per byte; an fp32 scale per block of 128; a 16-entry code book each),
    # two fp32 states of the bias (256 elements is under 4096: not quantized) and two step counters
    weight = 2 * (512 * 256 // 2 + 512 * 256 // 128 * 4 + 16 * 4)
    assert int(live[live.category == "Optimizer state"].nbytes.sum()) == weight + 2 * 256 * 4 + 2 * 4


def test_int4_hqq_on_fake_cuda_runs_every_iteration() -> None:
    # HQQ's loop stops early when the error stops falling (a read of unknown values): assumed it never does
    from torchao.quantization import Int4WeightOnlyConfig

    cfg = Int4WeightOnlyConfig(
        group_size=128, int4_packing_format="tile_packed_to_4d", int4_choose_qparams_algorithm="hqq"
    )
    with fv.record(device="cuda:0") as trace:
        m = torch.nn.Linear(2048, 1024, dtype=BF16, device="cuda")
        quantize_(m, cfg)
    assert _weight_storages(trace, "Linear.weight") == _int4_bytes(1024, 2048)
    rows = trace.fidelity()["assumptions"]
    hqq = rows[rows.assumption.str.startswith("torchao HQQ")]
    assert len(hqq) == 20  # torchao's iters


CHILD = """
import torch, fakeviz as fv
with fv.record(device="cuda:0"):  # torchao imported inside a session: patched when torchao.utils has run
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_
    a = torch.nn.Linear(64, 64, dtype=torch.bfloat16)
    quantize_(a, Float8DynamicActivationFloat8WeightConfig())
with fv.record(device="cuda:0"):  # a later session: the names bound during the first one answer again
    b = torch.nn.Linear(64, 64, dtype=torch.bfloat16)
    quantize_(b, Float8DynamicActivationFloat8WeightConfig())
import torchao.utils
print("KINDS", type(a.weight).__name__, type(b.weight).__name__, bool(torchao.utils.is_sm_at_least_89()))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the capability patch is for a build without CUDA (the shim)")
def test_fp8_when_torchao_is_imported_inside_a_record() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("KINDS"))
    assert line.split()[1:] == ["Float8Tensor", "Float8Tensor", "False"]


def test_module_to_dtype_frees_as_the_real_run() -> None:
    # Note: [Module.to on fake parameters]: a model cast to bf16 before quantize_ (the usual order) frees each old
    # fp32 parameter at the op the real run does (a swap kept it one op longer)
    def run() -> None:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).to(BF16)
        quantize_(m, Int8WeightOnlyConfig())
        m(torch.randn(4, 64, dtype=BF16))

    real, fake = _pair(run)
    _assert_same(real, fake)


@pytest.mark.parametrize("config", ["int8-wo", "int8-dyn", "int4-cpu"])
def test_tiny_llama_quantized_by_apply_equals_real(config: str) -> None:
    # models/_quant_torchao.apply on a transformers model (lm_head skipped), forward and backward on the CPU
    def run() -> None:
        torch.manual_seed(0)
        model = _tiny_llama("cpu")
        qt.apply(model, qt.config_for(config))
        ids = torch.randint(
            0, 256, (2, 8)
        )  # (batch 1: a view's stride on the size-1 dimension differs, apart from torchao)
        model(ids, labels=ids).loss.backward()

    real, fake = _pair(run)
    _assert_same(real, fake)
