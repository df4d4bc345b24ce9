"""Tests for fakeviz._engine.attention: the CUDA SDPA backend choice and its simulation on fake cuda."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fakeviz as fv
from fakeviz._engine.attention import (
    BACKENDS,
    DEFAULT_CAPABILITY,
    DEFAULT_CUDNN_VERSION,
    attention_patch,
    choose_backend,
    sdpa_like_gpu,
)

FLASH = "aten._scaled_dot_product_flash_attention.default"
FLASH_BWD = "aten._scaled_dot_product_flash_attention_backward.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
EFFICIENT_BWD = "aten._scaled_dot_product_efficient_attention_backward.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
CUDNN_BWD = "aten._scaled_dot_product_cudnn_attention_backward.default"
MATH_SOFTMAX = "aten._safe_softmax.default"
FUSED = {FLASH, FLASH_BWD, EFFICIENT, EFFICIENT_BWD, CUDNN, CUDNN_BWD}
H100, A100, RTX3090, T4 = (9, 0), (8, 0), (8, 6), (7, 5)


@pytest.fixture(autouse=True)
def _clean_sdpa_environment(monkeypatch: pytest.MonkeyPatch):
    """Every test starts from PyTorch's defaults: no env overrides, all backends on, default order."""
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
    monkeypatch.delenv("TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED", raising=False)
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.cudnn_sdp_enabled()
    assert torch._C._get_sdp_priority_order() == [1, 2, 0, 3, 4]
    original = F.scaled_dot_product_attention
    yield
    assert F.scaled_dot_product_attention is original, "a test leaked a patched scaled_dot_product_attention"


def qkv(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...] | None = None, *, grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key, value on the recording's default device and dtype."""
    kv_shape = kv_shape or q_shape
    return (
        torch.randn(q_shape, requires_grad=grad),
        torch.randn(kv_shape, requires_grad=grad),
        torch.randn(kv_shape, requires_grad=grad),
    )


def fused_ops(trace: fv.Trace) -> list[str]:
    return [op for op in trace.ops.op if op in FUSED]


def run_attention(
    setting: str,
    capability: tuple[int, int] = H100,
    *,
    dtype: torch.dtype = torch.bfloat16,
    q_shape: tuple[int, ...] = (2, 8, 128, 64),
    kv_shape: tuple[int, ...] | None = None,
    backward: bool = True,
    mask: Callable[[], torch.Tensor] | None = None,
    **sdpa_kwargs,
) -> tuple[fv.Trace, torch.Tensor, tuple[torch.Tensor, ...]]:
    """One attention (fwd, optionally bwd) under the patch on fake cuda:0; setting None = no patch.

    ``mask`` is called inside the recording, so the mask is a fake cuda tensor too.
    """
    with fv.record(attention="native", device="cuda:0", dtype=dtype) as trace:
        q, k, v = qkv(q_shape, kv_shape)
        if mask is not None:
            sdpa_kwargs["attn_mask"] = mask()
        if setting is None:
            out = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
        else:
            with attention_patch(setting, capability):
                out = F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs)
        if backward:
            out.sum().backward()
    return trace, out, (q, k, v)


def peak(trace: fv.Trace) -> int:
    return trace.peak_bytes()["cuda:0"]["bytes"]


# --------------------------------------------------------------------- auto on fake cuda


def test_auto_on_h100_bf16_runs_cudnn_like_the_2_13_wheels():
    # sm90 + cuDNN 9.20 (> 9.15.0): check_prefer_cudnn_attention puts cuDNN first.
    trace, out, _ = run_attention("auto", H100, is_causal=True)
    assert fused_ops(trace) == [CUDNN, CUDNN_BWD]
    assert MATH_SOFTMAX not in set(trace.ops.op)
    math_trace, math_out, _ = run_attention(None, is_causal=True)
    assert MATH_SOFTMAX in set(math_trace.ops.op) and not fused_ops(math_trace)
    assert peak(trace) < peak(math_trace)
    assert (out.shape, out.dtype, out.stride()) == (math_out.shape, math_out.dtype, math_out.stride())


def test_auto_on_a100_bf16_runs_flash_and_peaks_lower_than_math():
    trace, out, (q, k, v) = run_attention("auto", A100, is_causal=True)
    assert fused_ops(trace) == [FLASH, FLASH_BWD]
    math_trace, math_out, _ = run_attention("math", A100, is_causal=True)
    assert MATH_SOFTMAX in set(math_trace.ops.op) and not fused_ops(math_trace)
    assert peak(trace) < peak(math_trace)
    assert (out.shape, out.dtype, out.stride()) == (math_out.shape, math_out.dtype, math_out.stride())
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_default_capability_and_cudnn_version_are_the_documented_ones():
    assert DEFAULT_CAPABILITY == (9, 0)
    assert DEFAULT_CUDNN_VERSION == 92000
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 4, 64, 64))
        assert choose_backend(q, k, v) == ("cudnn", {})
        assert choose_backend(q, k, v, capability=A100) == ("flash", {})


def test_fp32_on_h100_picks_efficient_with_dtype_reasons():
    with fv.record(attention="native", device="cuda:0", dtype=torch.float32):
        q, k, v = qkv((2, 8, 128, 64))
        backend, reasons = choose_backend(q, k, v, is_causal=True)
    assert backend == "efficient"
    assert list(reasons) == ["cudnn", "flash"]  # the cuDNN-first priority order
    assert all("{Half, BFloat16}" in r and "Float" in r for r in reasons.values())
    trace, out, _ = run_attention("auto", H100, dtype=torch.float32, is_causal=True)
    assert fused_ops(trace) == [EFFICIENT, EFFICIENT_BWD]
    _, math_out, _ = run_attention("math", dtype=torch.float32, is_causal=True)
    assert (out.shape, out.dtype) == (math_out.shape, math_out.dtype)
    # The efficient kernel writes [B, M, H, K] and returns its transpose, unlike math.
    b, h, m, kdim = out.shape
    assert out.stride() == (m * h * kdim, kdim, h * kdim, 1)


@pytest.mark.parametrize("setting", BACKENDS)
def test_every_backend_matches_math_shapes_and_dtypes(setting: str):
    trace, out, (q, k, v) = run_attention(setting, H100, q_shape=(2, 4, 32, 64))
    _, math_out, _ = run_attention("math", q_shape=(2, 4, 32, 64))
    assert (out.shape, out.dtype, out.device) == (math_out.shape, math_out.dtype, math_out.device)
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    expected = {"flash": [FLASH, FLASH_BWD], "efficient": [EFFICIENT, EFFICIENT_BWD], "cudnn": [CUDNN, CUDNN_BWD]}
    assert fused_ops(trace) == expected.get(setting, [])


def test_math_setting_records_exactly_what_the_unpatched_fake_cuda_path_records():
    def oplog(setting):
        with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16) as trace:
            q, k, v = qkv((2, 4, 10, 16), (2, 4, 13, 16))
            mask = torch.rand(10, 13) > 0.5
            if setting is None:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                out = sdpa_like_gpu(q, k, v, attn_mask=mask, setting=setting)
            out.sum().backward()
        return trace.oplog()

    assert oplog("math") == oplog(None)


# --------------------------------------------------------------------- masks


def test_float_mask_goes_to_efficient_where_flash_is_first():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((2, 8, 128, 64))
        mask = torch.randn(128, 128)
        assert choose_backend(q, k, v, mask, capability=A100) == (
            "efficient",
            {"flash": "Flash Attention does not support non-null attn_mask."},
        )
        # On sm90 cuDNN is first and takes 2-D / 4-D masks.
        assert choose_backend(q, k, v, mask, capability=H100) == ("cudnn", {})
        assert choose_backend(q, k, v, mask.expand(2, 8, 128, 128), capability=H100)[0] == "cudnn"
        backend, reasons = choose_backend(q, k, v, mask.expand(2, 128, 128), capability=H100)
        assert backend == "efficient" and "attn mask shapes" in reasons["cudnn"]
    trace, out, _ = run_attention("auto", A100, mask=lambda: torch.randn(128, 128))
    assert fused_ops(trace) == [EFFICIENT, EFFICIENT_BWD]
    assert out.shape == (2, 8, 128, 64)


def test_bool_mask_is_converted_padded_and_expanded_for_efficient():
    with fv.record(attention="native", device="cuda:0", dtype=torch.float32) as trace:
        q, k, v = qkv((2, 4, 10, 16), (2, 4, 13, 16))
        mask = torch.ones(10, 13, dtype=torch.bool)
        with attention_patch("auto"):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.sum().backward()
    ops = trace.ops.set_index("seq")
    names = list(ops.op)
    where = names.index("aten.where.self")
    assert names[where - 2 : where + 1] == ["aten.scalar_tensor.default"] * 2 + ["aten.where.self"]
    assert ops.iloc[where]["dtype"] == "torch.float32"
    # pad_bias<8>: 13 -> 16, slice back to 13, expand to [B, H, L, S], then the kernel.
    assert names[where + 1 : where + 5] == [
        "aten.constant_pad_nd.default",
        "aten.slice.Tensor",
        "aten.expand.default",
        EFFICIENT,
    ]
    assert ops.iloc[where + 1]["shape"] == "10, 16"
    assert ops.iloc[where + 3]["shape"] == "2, 4, 10, 13"
    assert EFFICIENT_BWD in names and out.shape == (2, 4, 10, 16)


def test_aligned_mask_is_not_padded():
    with fv.record(attention="native", device="cuda:0", dtype=torch.float32) as trace:
        q, k, v = qkv((2, 4, 16, 16))
        with attention_patch("auto"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=torch.randn(16, 16)).sum().backward()
    assert "aten.constant_pad_nd.default" not in set(trace.ops.op)
    assert fused_ops(trace) == [EFFICIENT, EFFICIENT_BWD]


# --------------------------------------------------------------------- flash details


def test_flash_pads_head_dim_to_multiple_of_8_with_original_scale():
    trace, out, (q, k, v) = run_attention("flash", H100, q_shape=(1, 8, 128, 100), is_causal=True)
    ops = trace.ops
    flash = ops[ops.op == FLASH].iloc[0]
    assert flash["shape"] == "1, 8, 128, 104"  # the kernel sees the padded head dim
    assert "scale=0.1" in flash.args  # 1 / sqrt(100), not 1 / sqrt(104)
    assert (ops.op == "aten.constant_pad_nd.default").sum() >= 3
    assert "aten.slice.Tensor" in set(ops.op)
    assert out.shape == (1, 8, 128, 100)
    assert q.grad.shape == k.grad.shape == v.grad.shape == (1, 8, 128, 100)
    assert fused_ops(trace) == [FLASH, FLASH_BWD]


def test_flash_head_dim_72_is_already_aligned_and_not_padded():
    trace, out, _ = run_attention("flash", H100, q_shape=(1, 8, 128, 72), is_causal=True)
    assert "aten.constant_pad_nd.default" not in set(trace.ops.op)
    flash = trace.ops[trace.ops.op == FLASH].iloc[0]
    assert flash["shape"] == "1, 8, 128, 72"
    assert f"scale={1 / math.sqrt(72)}" in flash.args
    assert out.shape == (1, 8, 128, 72)


def test_explicit_scale_is_passed_through():
    trace, _, _ = run_attention("auto", A100, backward=False, scale=0.5)
    assert "scale=0.5" in trace.ops[trace.ops.op == FLASH].iloc[0].args


# --------------------------------------------------------------------- dropout, GQA


def test_dropout():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((2, 8, 128, 64))
        # cuDNN dropout resolution is 1/16: 0.1 falls to flash, 0.125 stays on cuDNN.
        backend, reasons = choose_backend(q, k, v, dropout_p=0.1)
        assert backend == "flash" and "1/16" in reasons["cudnn"]
        assert choose_backend(q, k, v, dropout_p=0.125) == ("cudnn", {})
        # cuDNN 9.11 - 9.13 cannot do dropout at all (and is not preferred: <= 9.15.0).
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH], set_priority=True):
            backend, reasons = choose_backend(q, k, v, dropout_p=0.125, cudnn_version=91200)
        assert backend == "math" and "9.11 - 9.13" in reasons["cudnn"]
    trace, out, _ = run_attention("auto", H100, dropout_p=0.1, is_causal=True)
    assert fused_ops(trace) == [FLASH, FLASH_BWD]
    assert trace.ops[trace.ops.op == FLASH].iloc[0].args.startswith("$0, $1, $2, 0.1, True")
    assert out.shape == (2, 8, 128, 64)


@pytest.mark.parametrize(
    ("capability", "dtype", "expected"),
    [(H100, torch.bfloat16, "cudnn"), (A100, torch.bfloat16, "flash"), (H100, torch.float32, "math")],
)
def test_gqa(capability: tuple[int, int], dtype: torch.dtype, expected: str):
    with fv.record(attention="native", device="cuda:0", dtype=dtype):
        q, k, v = qkv((2, 8, 64, 64), (2, 2, 64, 64))
        backend, reasons = choose_backend(q, k, v, is_causal=True, enable_gqa=True, capability=capability)
        assert backend == expected
        if expected == "math":
            # Memory-efficient attention has no GQA in 2.13: it insists on equal head counts.
            assert "same num_heads" in reasons["efficient"]
        # Without enable_gqa the fused kernels refuse different head counts.
        backend, reasons = choose_backend(q, k, v, is_causal=True, capability=capability)
        assert backend == "math"
        assert "same num_heads" in reasons["efficient"]
        if dtype == torch.bfloat16:
            assert "same num_heads" in reasons["flash"]
        if capability == H100:  # cuDNN is tried first only there
            assert "same num_heads" in reasons["cudnn"] or "{Half, BFloat16}" in reasons["cudnn"]
    trace, out, (q, k, v) = run_attention(
        "auto",
        capability,
        dtype=dtype,
        q_shape=(2, 8, 64, 64),
        kv_shape=(2, 2, 64, 64),
        is_causal=True,
        enable_gqa=True,
    )
    assert out.shape == (2, 8, 64, 64)
    assert k.grad.shape == v.grad.shape == (2, 2, 64, 64)
    kernel = {"cudnn": [CUDNN, CUDNN_BWD], "flash": [FLASH, FLASH_BWD], "math": []}[expected]
    assert fused_ops(trace) == kernel


def test_gqa_heads_must_divide():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 8, 64, 64), (1, 3, 64, 64))
        backend, reasons = choose_backend(q, k, v, enable_gqa=True)
    assert backend == "math"
    assert "must divide" in reasons["cudnn"] and "must divide" in reasons["flash"]


# --------------------------------------------------------------------- forcing, flags, capability


def test_forcing_flash_with_fp32_raises_with_the_reason():
    with fv.record(attention="native", device="cuda:0", dtype=torch.float32):
        q, k, v = qkv((1, 4, 64, 64))
        with pytest.raises(RuntimeError, match=r"(?s)setting='flash'.*'flash' cannot run.*dtype.*No available kernel"):
            sdpa_like_gpu(q, k, v, setting="flash")
        with attention_patch("cudnn"), pytest.raises(RuntimeError, match="'cudnn' cannot run"):
            F.scaled_dot_product_attention(q, k, v)
        # Forcing efficient works for fp32.
        assert sdpa_like_gpu(q, k, v, setting="efficient").shape == (1, 4, 64, 64)


def test_sdpa_kernel_context_is_honoured_by_auto():
    with sdpa_kernel([SDPBackend.MATH]):
        trace, _, _ = run_attention("auto", H100, is_causal=True)
    assert not fused_ops(trace) and MATH_SOFTMAX in set(trace.ops.op)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        trace, _, _ = run_attention("auto", H100, is_causal=True)
    assert fused_ops(trace) == [EFFICIENT, EFFICIENT_BWD]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION], set_priority=True):
        trace, _, _ = run_attention("auto", H100, is_causal=True)
    assert fused_ops(trace) == [FLASH, FLASH_BWD]
    with fv.record(attention="native", device="cuda:0", dtype=torch.float32):
        q, k, v = qkv((1, 4, 64, 64))
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            with pytest.raises(
                RuntimeError, match=r"(?s)No available kernel.*Memory Efficient attention has been runtime disabled"
            ):
                choose_backend(q, k, v)
        torch.backends.cuda.enable_math_sdp(False)
        try:
            # Math off but the overrideable backend still on: ATen's "Invalid backend" check.
            with pytest.raises(RuntimeError, match="Invalid backend"):
                choose_backend(q, k, v, capability=(4, 0))
        finally:
            torch.backends.cuda.enable_math_sdp(True)
        with sdpa_kernel([SDPBackend.OVERRIDEABLE]):
            with pytest.raises(RuntimeError, match="No viable backend"):
                sdpa_like_gpu(q, k, v)


@pytest.mark.parametrize(
    ("capability", "dtype", "expected", "rejected"),
    [
        (T4, torch.bfloat16, "math", {"flash": "[sm80, sm121]", "efficient": "{Half, Float}"}),
        (T4, torch.float16, "efficient", {"flash": "[sm80, sm121]"}),
        (T4, torch.float32, "efficient", {"flash": "[sm80, sm121]"}),
        ((6, 1), torch.float16, "efficient", {"flash": "sm 6.1"}),
        ((4, 0), torch.float16, "math", {"flash": "sm 4.0", "efficient": "[sm50, sm121]"}),
        ((12, 2), torch.bfloat16, "math", {"flash": "sm 12.2", "efficient": "sm 12.2"}),
        (A100, torch.bfloat16, "flash", {}),
        ((10, 0), torch.bfloat16, "cudnn", {}),
        ((10, 3), torch.bfloat16, "cudnn", {}),
        ((12, 0), torch.bfloat16, "flash", {}),  # not a cuDNN-first arch
        ((9, 0), torch.float64, "math", {"cudnn": "{Half, BFloat16}", "efficient": "{Half, Float, BFloat16}"}),
    ],
)
def test_capability_changes_the_choice(capability, dtype, expected, rejected):
    with fv.record(attention="native", device="cuda:0", dtype=dtype):
        q, k, v = qkv((1, 4, 64, 64))
        backend, reasons = choose_backend(q, k, v, capability=capability)
    assert backend == expected
    for name, fragment in rejected.items():
        assert fragment in reasons[name], (name, reasons)


def test_cudnn_checks_dtype_before_architecture():
    # can_use_cudnn_attention runs check_dtypes_low_precision before check_cudnn_hardware_support,
    # and below sm80 only fp16 counts as low precision.
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 4, 64, 64))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH], set_priority=True):
            assert "{Half}." in choose_backend(q, k, v, capability=T4)[1]["cudnn"]
            assert "[sm80, sm121]" in choose_backend(q.half(), k.half(), v.half(), capability=T4)[1]["cudnn"]


def test_sm86_training_with_large_head_dim():
    with fv.record(attention="native", device="cuda:0", dtype=torch.float16):
        q, k, v = qkv((1, 4, 64, 200))
        backend, reasons = choose_backend(q, k, v, capability=RTX3090)
        assert backend == "efficient" and "head_dim ∈ (192, 224]" in reasons["flash"]
        with torch.no_grad():  # inference is fine
            assert choose_backend(q, k, v, capability=RTX3090)[0] == "flash"
        assert choose_backend(q.detach(), k.detach(), v.detach(), capability=RTX3090)[0] == "flash"
        # On sm90 cuDNN stops at head dim 128 (cuDNN 9.20), flash takes it.
        backend, reasons = choose_backend(q, k, v)
        assert backend == "flash" and reasons == {"cudnn": "head_dim should be no more than 128"}


def test_cudnn_preference_follows_env_and_runtime_version(monkeypatch: pytest.MonkeyPatch):
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 4, 64, 64))
        assert choose_backend(q, k, v)[0] == "cudnn"
        assert choose_backend(q, k, v, cudnn_version=91500)[0] == "flash"  # needs > 9.15.0
        backend, reasons = choose_backend(q, k, v, cudnn_version=None)
        assert backend == "flash" and reasons == {}
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), pytest.raises(RuntimeError, match="not compiled with cuDNN"):
            choose_backend(q, k, v, cudnn_version=None)
        monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
        assert choose_backend(q, k, v)[0] == "flash"
        # Deterministic algorithms rule cuDNN out even where it is first.
        monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED")
        torch.use_deterministic_algorithms(True)
        try:
            backend, reasons = choose_backend(q, k, v)
        finally:
            torch.use_deterministic_algorithms(False)
        assert backend == "flash" and reasons["cudnn"] == "cuDNN SDPA is not deterministic."


def test_cudnn_head_dim_rules():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 4, 64, 192), (1, 4, 64, 192))
        v = torch.randn(1, 4, 64, 128, requires_grad=True)
        # DeepSeek-style 192/128 is allowed on sm90 with cuDNN >= 9.11 (flash needs equal dims).
        backend, reasons = choose_backend(q, k, v)
        assert backend == "cudnn"
        assert choose_backend(q, k, v, cudnn_version=91000)[0] == "efficient"
        q, k, v = qkv((1, 4, 64, 256))
        assert choose_backend(q, k, v)[0] == "flash"
        assert choose_backend(q, k, v, cudnn_version=92300)[0] == "cudnn"  # d=256 with cuDNN > 9.22
        q, k, v = qkv((1, 4, 64, 224))
        backend, reasons = choose_backend(q, k, v, cudnn_version=92300)
        assert backend == "flash" and "backward with these head dimensions" in reasons["cudnn"]
        with torch.no_grad():
            assert choose_backend(q, k, v, cudnn_version=92300)[0] == "cudnn"


@pytest.mark.parametrize(
    ("case", "expected", "fragments"),
    [
        ("causal_non_square", "cudnn", {}),
        ("causal_non_square_a100", "efficient", {"flash": "seqlen_q != seqlen_k"}),
        ("head_dim_300", "math", {"flash": "less than or equal to 256", "cudnn": "no more than 128"}),
        ("fp32_head_dim_6", "math", {"efficient": "divisible by 4"}),
        ("fp32_head_dim_6_t4", "efficient", {"flash": "[sm80, sm121]"}),  # no tensor cores: alignment 1
        ("last_dim_strided", "math", {"cudnn": "stride 1", "flash": "stride 1", "efficient": "stride 1"}),
        ("misaligned_offset", "math", {"efficient": "storage offsets"}),
        ("kv_len_1", "flash", {"cudnn": "key/value sequence length 1"}),
        ("zero_len", "math", {"flash": "zero seq_len"}),
        ("three_dim", "math", {"flash": "4 dimensional"}),
        ("batch_65536", "flash", {"cudnn": "65535"}),
        ("mask_requires_grad", "efficient", {"cudnn": "requires grad"}),
    ],
)
def test_rejection_reasons(case: str, expected: str, fragments: dict[str, str]):
    capability = {"a100": A100, "t4": T4}.get(case.rsplit("_", 1)[-1], H100)
    dtype = torch.float32 if case.startswith("fp32") or case == "misaligned_offset" else torch.bfloat16
    kwargs: dict[str, object] = {}
    with fv.record(attention="native", device="cuda:0", dtype=dtype):
        q, k, v = qkv((1, 4, 64, 64))
        if case.startswith("causal_non_square"):
            k, v = (torch.randn(1, 4, 96, 64) for _ in range(2))
            kwargs["is_causal"] = True
        elif case == "head_dim_300":
            q, k, v = qkv((1, 4, 64, 300))
        elif case.startswith("fp32_head_dim_6"):
            q, k, v = qkv((1, 4, 64, 6))
        elif case == "last_dim_strided":
            q, k, v = (torch.randn(1, 4, 64, 128)[..., ::2] for _ in range(3))
        elif case == "misaligned_offset":
            q, k, v = (torch.randn(4 * 64 * 64 + 1)[1:].view(1, 4, 64, 64) for _ in range(3))
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                backend, reasons = choose_backend(q, k, v)
            assert backend == expected
            assert "aligned to 16 bytes" in reasons["efficient"]
            return
        elif case == "kv_len_1":
            k, v = (torch.randn(1, 4, 1, 64) for _ in range(2))
        elif case == "zero_len":
            q = torch.randn(1, 4, 0, 64)
        elif case == "three_dim":
            q, k, v = qkv((4, 64, 64))
        elif case == "batch_65536":
            q, k, v = qkv((65536, 1, 4, 64), grad=False)
        elif case == "mask_requires_grad":
            kwargs["attn_mask"] = torch.randn(64, 64, requires_grad=True)
        backend, reasons = choose_backend(q, k, v, capability=capability, **kwargs)
    assert backend == expected, reasons
    for name, fragment in fragments.items():
        assert fragment in reasons[name], (name, reasons)


# --------------------------------------------------------------------- a real model


@pytest.mark.parametrize(("capability", "kernel"), [(A100, [FLASH, FLASH_BWD]), (H100, [CUDNN, CUDNN_BWD])])
def test_transformers_llama_tiny_under_the_patch(capability: tuple[int, int], kernel: list[str]):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,  # GQA: transformers passes enable_gqa=True
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )

    def run(patched: bool) -> fv.Trace:
        with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16) as trace:
            model = transformers.LlamaForCausalLM(cfg)
            ids = torch.randint(0, 256, (2, 64))
            if patched:
                with attention_patch("auto", capability):
                    model(ids, labels=ids).loss.backward()
            else:
                model(ids, labels=ids).loss.backward()
        return trace

    patched, plain = run(True), run(False)
    forward, backward = kernel
    assert fused_ops(patched) == [forward] * cfg.num_hidden_layers + [backward] * cfg.num_hidden_layers
    assert MATH_SOFTMAX not in set(patched.ops.op) and MATH_SOFTMAX in set(plain.ops.op)
    assert peak(patched) < peak(plain)


def test_multi_head_attention_module_is_covered():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16) as trace:
        mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        x = torch.randn(2, 32, 64)
        with attention_patch("auto", A100):
            out, _ = mha(x, x, x, need_weights=False)
        out.sum().backward()
    assert fused_ops(trace) == [FLASH, FLASH_BWD]


# --------------------------------------------------------------------- the patch itself


def test_cpu_meta_and_real_tensors_are_untouched():
    def cpu_oplog(patched: bool) -> str:
        with fv.record(attention="native", device="cpu", dtype=torch.bfloat16) as trace:
            q, k, v = qkv((1, 4, 32, 64))
            if patched:
                with attention_patch("flash"):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            else:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        return trace.oplog()

    assert cpu_oplog(True) == cpu_oplog(False)

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.rand(8, 8) > 0.3
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with attention_patch("efficient"):
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), expected)
        meta = F.scaled_dot_product_attention(*(t.to("meta") for t in (q, k, v)))
    assert meta.device.type == "meta" and meta.shape == expected.shape


def test_patch_restores_on_error_and_nests():
    original = F.scaled_dot_product_attention
    with pytest.raises(KeyError):
        with attention_patch("flash"):
            assert F.scaled_dot_product_attention is not original
            raise KeyError("boom")
    assert F.scaled_dot_product_attention is original

    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16) as trace:
        # torch's own, or on a CUDA build that sees no GPU the session's math path (Note: [fake cuda on a CUDA
        # build without a GPU])
        native = F.scaled_dot_product_attention
        status = fv.fake_cuda_status()
        assert (native is original) == (status.mode != "shim" or status.build != "cuda")
        q, k, v = qkv((1, 4, 64, 64), grad=False)
        with attention_patch("efficient"):
            outer = F.scaled_dot_product_attention
            with attention_patch("flash"):
                F.scaled_dot_product_attention(q, k, v)  # the innermost patch decides
            assert F.scaled_dot_product_attention is outer
            F.scaled_dot_product_attention(q, k, v)
        assert F.scaled_dot_product_attention is native
    assert F.scaled_dot_product_attention is original
    assert fused_ops(trace) == [FLASH, EFFICIENT]


def test_nested_patch_falls_through_for_real_tensors():
    q = torch.randn(1, 1, 4, 8)
    expected = F.scaled_dot_product_attention(q, q, q)
    with attention_patch("efficient"), attention_patch("cudnn", (8, 0)):
        assert torch.equal(F.scaled_dot_product_attention(q, q, q), expected)


def test_invalid_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="setting must be one of 'auto', 'flash'"):
        with attention_patch("flash2"):
            pass
    with pytest.raises(ValueError, match="capability"):
        with attention_patch("auto", (9,)):
            pass
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="setting"):
        sdpa_like_gpu(q, q, q, setting="xformers")
    with pytest.raises(ValueError, match="capability"):
        choose_backend(q, q, q, capability=(9, "0"))


def test_zero_sized_inputs_take_atens_early_return():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16) as trace:
        q, k, v = qkv((1, 4, 0, 64), (1, 4, 16, 64))
        with attention_patch("flash"):
            out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
    assert out.shape == (1, 4, 0, 64) and not fused_ops(trace)
    assert "aten.zeros.default" in set(trace.ops.op)
    assert k.grad.shape == k.shape


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_validation_matches_aten_messages():
    with fv.record(attention="native", device="cuda:0", dtype=torch.bfloat16):
        q, k, v = qkv((1, 4, 16, 64))
        with pytest.raises(RuntimeError, match="same dtype"):
            sdpa_like_gpu(q, k.float(), v)
        with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or to match query dtype"):
            sdpa_like_gpu(q, k, v, attn_mask=torch.zeros(16, 16, dtype=torch.int32))
    nested = torch.nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 5, 8)])
    with pytest.raises(ValueError, match="nested"):
        sdpa_like_gpu(nested, nested, nested)


# ------------------------------------------------------------- through fv.record()
def _llama_step(**record_kwargs):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    with fv.record(device="cuda:0", dtype=torch.bfloat16, **record_kwargs) as trace:
        m = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 128, (1, 256))
        m(ids, labels=ids).loss.backward()
    return trace


def test_record_simulates_the_gpu_choice_by_default():
    auto = _llama_step()
    assert auto.meta["attention"] == "auto"
    ops = set(auto.ops.op)
    assert CUDNN in ops and CUDNN_BWD in ops and MATH_SOFTMAX not in ops  # H100 by default
    a100 = _llama_step(gpu="A100")
    assert "aten._scaled_dot_product_flash_attention.default" in set(a100.ops.op)
    assert a100.meta["capability"] == [8, 0]
    native = _llama_step(attention="native")
    assert MATH_SOFTMAX in set(native.ops.op)
    assert auto.peak()["cuda:0"].bytes < native.peak()["cuda:0"].bytes
    # the fidelity report lists every simulated call and the backend
    calls = auto.fidelity()["attention"]
    assert len(calls) == 2 and set(calls.backend) == {"cudnn"} and set(calls.setting) == {"auto"}
    assert (auto.ops.op.iloc[calls.seq.to_numpy()] == CUDNN).all()


def test_record_forced_and_bad_settings():
    math = _llama_step(attention="math")
    assert MATH_SOFTMAX in set(math.ops.op)
    assert set(math.fidelity()["attention"].backend) == {"math"}
    with pytest.raises(ValueError, match="attention='fast'"):
        fv.record(attention="fast")
    with pytest.raises(ValueError, match="unknown GPU"):
        fv.record(gpu="H1000")


def test_record_forced_backend_that_cannot_run_names_where():
    class Attn(torch.nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q)

    with pytest.raises(RuntimeError, match="backend 'flash' cannot run") as info:
        with fv.record(device="cuda:0", attention="flash") as trace:
            m = Attn()
            m(torch.randn(1, 2, 8, 16))  # float32: flash needs fp16/bf16
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "aten.scaled_dot_product_attention" in notes and "module Attn" in notes
    assert "test_attention.py" in notes
    assert trace.error["op"] == "aten.scaled_dot_product_attention" and trace.error["module"] == "Attn"
    assert trace.num_ops >= 1 and torch._guards.detect_fake_mode() is None
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention  # patch undone


def test_autocast_casts_attention_inputs_first_like_the_gpu():
    """Note: [attention under autocast]: on a GPU autocast casts q, k, v (float, not float64) to its dtype at
    aten::scaled_dot_product_attention and runs the chosen backend with autocast off; HF Llama under
    ``torch.autocast("cuda", torch.bfloat16)`` hands SDPA fp32 q/k (RoPE in fp32) and a bf16 v (H100 record of
    ``benchmarks/gpu_time.py``'s ``llama1b_4l_autocast_fused``: two ``_to_copy`` then the cuDNN kernel)."""
    with fv.record(device="cuda:0") as trace:
        q = torch.randn(2, 4, 16, 64, device="cuda")
        v = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, q, v, is_causal=True)
            assert torch.is_autocast_enabled("cuda"), "autocast is on again after the call"
        assert out.dtype == torch.bfloat16
    ops = [str(o) for o in trace.ops["op"]]
    assert ops[-3:] == [
        "aten._to_copy.default",
        "aten._to_copy.default",
        "aten._scaled_dot_product_cudnn_attention.default",
    ]
    assert set(trace.ops["dtype"].iloc[-3:-1]) == {"torch.bfloat16"}
