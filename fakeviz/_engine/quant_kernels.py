"""Kernels of pre-quantized layers (GPTQ, AWQ, fp8 / int8 scaled matmuls) as ``torch.library`` ops of fakeviz's.

Note: [quantized kernels through fake rules]
The libraries that run GPTQ and AWQ layers (gptqmodel, autoawq) ship their kernels as CUDA extensions built at
install time (``pip download`` finds only source distributions), and transformers' FineGrainedFP8 layers call a
Triton kernel fetched from the hub (``kernels-community/finegrained-fp8``); none of them has a fake (meta)
implementation, and none can run here. So a pre-quantized layer of fakeviz's (``fakeviz.models._prequantized``)
calls one of the ops below where the library calls its kernel. Each op has

* a fake rule: the output the real kernel returns (shape, dtype, device) and the workspace it allocates while it
  runs, returned as extra outputs that the layer drops at once, so the record holds them for exactly the op
  (a ``Temporary``, freed by the next op);
* a real implementation on any device, in plain torch ops (unpack, dequantize, matmul), so a layer also runs
  on real tensors (``fv.record(fake=False)``) and its outputs' shapes and dtypes are the fake rule's;
* a backward for the input (gradient through the dequantized weight, as the libraries' trainable paths do:
  gptqmodel's Triton ``QuantLinearFunction``, ``AwqGemmFn.backward``, transformers' ``FP8LinearFunction``), so
  adapters (LoRA) train on top of them; the quantized tensors get no gradient.

What each op models (the kernel a GPU would run, and its workspace):

* ``fakeviz::gptq_gemm``: ExLlamaV2's ``gemm_half_q_half`` (gptqmodel's ``ExllamaV2QuantLinear``, input cast to
  float16 first, output float16): for more than ``EXLLAMA_MAX_Q_GEMM_ROWS`` rows it reconstructs the float16
  weight ``[in, out]`` and calls cuBLAS, else it multiplies from the packed weight with no workspace. ExLlamaV2
  keeps that buffer in a scratch space allocated once for the model (the largest layer's ``in * out * 2`` bytes
  plus ``out * 2048 * 8 * 4`` for the forward); fakeviz records it for each call instead, as a temporary of the
  layer's own size. Marlin (no dequantized weight; a small int32 workspace) and the Triton kernel (output only)
  need less.
* ``fakeviz::awq_gemm`` / ``fakeviz::awq_dequantize``: gptqmodel's ``AwqGemmFn`` (autoawq's ``WQLinear_GEMM``
  the same): up to ``AWQ_DEQUANT_ROWS`` rows ``gemm_forward_cuda`` with ``split_k_iters=8``, which writes
  ``[8, rows, out]`` partial sums and adds them up (the workspace); above, the whole weight is dequantized
  (``awq_dequantize``, ``[in, out]`` in the scales' dtype) and multiplied with ``torch.matmul``, both recorded.
* ``fakeviz::scaled_matmul``: an 8-bit weight ``[out, in]`` (float8_e4m3fn or int8) with its scales. With
  ``quantize_input`` the activation is quantized to the weight's dtype first, as transformers' finegrained-fp8
  Triton kernel (scales per 1 x ``block_k`` group of each row, float32) and vLLM's ``cutlass_scaled_mm`` for
  compressed-tensors W8A8 (one float32 scale per row) do, or with the static ``input_scale`` (no scale
  tensor): the workspace is the quantized activation and its scales. Without it (weight-only), the weight is
  dequantized to the activation's dtype (the workspace) and multiplied.

None of this is the library's kernel: ``fidelity()`` names each op's rule ``"fakeviz rule"`` and lists it under
``assumptions`` (:func:`op_assumption`), with what it models. Their FLOPs are not counted (no formula).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "AWQ_DEQUANT_ROWS",
    "EXLLAMA_MAX_Q_GEMM_ROWS",
    "FAKE_RULE_OPS",
    "awq_dequantize",
    "awq_gemm",
    "gptq_dequantize",
    "gptq_gemm",
    "op_assumption",
    "scaled_matmul",
]

#: ExLlamaV2 reconstructs the float16 weight above this many rows (``MAX_Q_GEMM_ROWS`` in its ``q_gemm.cu``).
EXLLAMA_MAX_Q_GEMM_ROWS = 50
#: gptqmodel's ``AwqGemmFn`` dequantizes the whole weight above this many rows (``FULL_DEQUANT_MATMUL_THRESHOLD``).
AWQ_DEQUANT_ROWS = 1024
_AWQ_SPLIT_K = 8
# AWQ packs eight 4-bit values per int32 in this column order (autoawq's AWQ_ORDER); unpacking reverses it.
_AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)

_RULE = "recorded through a fake rule, not the library's kernel: "
_KERNELS: dict[str, str] = {
    "fakeviz.gptq_gemm.default": _RULE + (
        "GPTQ matmul as ExLlamaV2's gemm_half_q_half (float16 output; above 50 rows a float16 [in, out] "
        "dequantized weight for this call, where ExLlamaV2 keeps one such scratch buffer for the whole model)"
    ),
    "fakeviz.gptq_dequantize.default": _RULE + "GPTQ weight dequantized to float16 [in, out] (backward)",
    "fakeviz.awq_gemm.default": _RULE + (
        "AWQ GEMM as gemm_forward_cuda with split_k_iters=8 (an [8, rows, out] workspace of partial sums)"
    ),
    "fakeviz.awq_dequantize.default": _RULE + "AWQ weight dequantized to [in, out] in the scales' dtype",
    "fakeviz.scaled_matmul.default": _RULE + (
        "8-bit weight matmul (finegrained-fp8 Triton / cutlass_scaled_mm): the activation quantized to the "
        "weight's dtype with float32 scales as workspace, or, weight-only, the weight dequantized for the call"
    ),
}  # fmt: skip

#: The ops of this module, as the record names them (``fidelity()`` reports their rule as ``"fakeviz rule"``).
FAKE_RULE_OPS: frozenset[str] = frozenset(_KERNELS)


def op_assumption(op: str) -> str | None:
    """What the record of ``op`` assumes (one of this module's ops), or ``None`` for any other op."""
    return _KERNELS.get(op)


def _rows(x: torch.Tensor) -> int:
    n = 1
    for s in x.shape[:-1]:
        n *= s
    return n


def _check(ok: bool, op: str, what: str) -> None:
    if not ok:
        raise RuntimeError(f"fakeviz::{op}: {what}")


def _none(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The empty workspace of a call that allocates none."""
    return x.new_empty((0,), dtype=dtype or x.dtype)


# ------------------------------------------------------------------------ unpacking (real implementations)
def _unpack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's qweight ``[in * bits / 32, out]`` -> ``[in, out]`` integer values (bits 2, 4, 8)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, device=q.device, dtype=torch.int32).view(1, per, 1)
    return ((q.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(q.shape[0] * per, q.shape[1])


def _unpack_cols(q: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ's qzeros ``[groups, out * bits / 32]`` -> ``[groups, out]`` integer values (bits 2, 4, 8)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, device=q.device, dtype=torch.int32).view(1, 1, per)
    return ((q.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(q.shape[0], q.shape[1] * per)


def _awq_unpack(q: torch.Tensor) -> torch.Tensor:
    """AWQ's ``[rows, cols * 8]`` int32 (4-bit, AWQ's column order) -> ``[rows, cols * 8]`` values."""
    v = _unpack_cols(q, 4)
    order = torch.tensor(_AWQ_REVERSE_ORDER, device=q.device)
    return v.view(-1, 8)[:, order].view(v.shape)


# ------------------------------------------------------------------------ GPTQ
@torch.library.custom_op("fakeviz::gptq_dequantize", mutates_args=())
def gptq_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> torch.Tensor:
    """A GPTQ weight (gptq v1 format: stored zeros are one less) as float16 ``[in, out]``."""
    _check(bits in (2, 4, 8), "gptq_dequantize", f"the real implementation unpacks 2, 4 or 8 bits, not {bits}")
    w = _unpack_rows(qweight, bits)
    zeros = _unpack_cols(qzeros, bits) + 1
    g = g_idx.long()
    return ((w - zeros[g]).to(torch.float16) * scales[g].to(torch.float16)).contiguous()


@gptq_dequantize.register_fake
def _(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int) -> Any:
    return qweight.new_empty((qweight.shape[0] * 32 // bits, qweight.shape[1]), dtype=torch.float16)


@torch.library.custom_op("fakeviz::gptq_gemm", mutates_args=())
def gptq_gemm(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [rows, in]`` (float16) times a GPTQ weight: ``(out [rows, out] float16, workspace)``."""
    w = gptq_dequantize(qweight, qzeros, scales, g_idx, bits)
    out = x.to(torch.float16) @ w
    return out, (w if x.shape[0] > EXLLAMA_MAX_Q_GEMM_ROWS else _none(x, torch.float16))


@gptq_gemm.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
      bits: int) -> Any:  # fmt: skip
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    _check(x.dim() == 2 and x.shape[1] == k, "gptq_gemm", f"input {list(x.shape)} does not fit a weight of {k} inputs")
    ws = x.new_empty((k, n), dtype=torch.float16) if x.shape[0] > EXLLAMA_MAX_Q_GEMM_ROWS else _none(x, torch.float16)
    return x.new_empty((x.shape[0], n), dtype=torch.float16), ws


def _gptq_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, qweight, qzeros, scales, g_idx, bits = inputs
    ctx.save_for_backward(qweight, qzeros, scales, g_idx)
    ctx.bits, ctx.x_dtype = bits, x.dtype


def _gptq_backward(ctx: Any, grad: torch.Tensor, _ws: Any) -> tuple[Any, ...]:
    qweight, qzeros, scales, g_idx = ctx.saved_tensors
    w = gptq_dequantize(qweight, qzeros, scales, g_idx, ctx.bits)
    return (grad @ w.to(grad.dtype).t()).to(ctx.x_dtype), None, None, None, None, None


gptq_gemm.register_autograd(_gptq_backward, setup_context=_gptq_setup)


# ------------------------------------------------------------------------ AWQ
@torch.library.custom_op("fakeviz::awq_dequantize", mutates_args=())
def awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A 4-bit AWQ weight as ``[in, out]`` in the scales' dtype (group ``in / groups`` rows)."""
    w, z = _awq_unpack(qweight), _awq_unpack(qzeros)
    group = w.shape[0] // scales.shape[0]
    g = torch.arange(w.shape[0], device=w.device) // group
    return ((w - z[g]).to(scales.dtype) * scales[g]).contiguous()


@awq_dequantize.register_fake
def _(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Any:
    return qweight.new_empty((qweight.shape[0], scales.shape[1]), dtype=scales.dtype)


@torch.library.custom_op("fakeviz::awq_gemm", mutates_args=())
def awq_gemm(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [rows, in]`` times a 4-bit AWQ weight, split-k 8: ``(out [rows, out] in x's dtype, partial sums)``."""
    w = awq_dequantize(qweight, qzeros, scales).to(x.dtype)
    k = x.shape[1]
    step = -(-k // _AWQ_SPLIT_K)
    parts = torch.stack([
        x[:, i * step:(i + 1) * step] @ w[i * step:(i + 1) * step] if i * step < k
        else x.new_zeros((x.shape[0], w.shape[1])) for i in range(_AWQ_SPLIT_K)
    ])  # fmt: skip
    return parts.sum(0), parts


@awq_gemm.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Any:
    n = scales.shape[1]
    _check(x.dim() == 2 and x.shape[1] == qweight.shape[0], "awq_gemm",
           f"input {list(x.shape)} does not fit a weight of {qweight.shape[0]} inputs")  # fmt: skip
    return x.new_empty((x.shape[0], n)), x.new_empty((_AWQ_SPLIT_K, x.shape[0], n))


def _awq_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, qweight, qzeros, scales = inputs
    ctx.save_for_backward(qweight, qzeros, scales)


def _awq_backward(ctx: Any, grad: torch.Tensor, _ws: Any) -> tuple[Any, ...]:
    qweight, qzeros, scales = ctx.saved_tensors
    w = awq_dequantize(qweight, qzeros, scales).to(grad.dtype)
    return grad @ w.t(), None, None, None


awq_gemm.register_autograd(_awq_backward, setup_context=_awq_setup)


# ------------------------------------------------------------------------ 8-bit weights (fp8 / int8)
def _weight_scales(weight: torch.Tensor, scale: torch.Tensor, block: list[int] | None, dtype: torch.dtype) -> Any:
    """The weight ``[out, in]`` dequantized: per tensor, per output row, or per ``block`` of ``[bn, bk]``."""
    w = weight.to(dtype)
    s = scale.to(dtype)
    if block:
        bn, bk = block
        s = s.repeat_interleave(bn, 0)[: w.shape[0]].repeat_interleave(bk, 1)[:, : w.shape[1]]
    elif s.dim() == 2 and s.shape[1] != 1 and s.shape[1] != w.shape[1]:  # per group of columns
        s = s.repeat_interleave(w.shape[1] // s.shape[1], 1)
    return w * (s if s.dim() else s.reshape(()))


def _act_scale_shape(x: torch.Tensor, block: list[int] | None) -> tuple[int, ...]:
    """The float32 scales of a dynamically quantized activation: per 1 x ``block_k`` group, else per row."""
    k = x.shape[-1]
    return (*x.shape[:-1], -(-k // block[1]) if block else 1)


@torch.library.custom_op("fakeviz::scaled_matmul", mutates_args=())
def scaled_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block_size: list[int] | None,
    input_scale: torch.Tensor | None,
    quantize_input: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [..., in]`` times an 8-bit ``weight [out, in]``: ``(out [..., out] in x's dtype, workspace, scales)``."""
    w = _weight_scales(weight, weight_scale, block_size, torch.float32)
    if not quantize_input:
        w = w.to(x.dtype)
        return x @ w.t(), w, _none(x, torch.float32)
    xf = x.float()
    if input_scale is not None:
        xs = _none(x, torch.float32)
        div = input_scale.float().reshape(())
    else:
        groups = xf.unflatten(-1, (-1, block_size[1])) if block_size else xf.unsqueeze(-2)
        xs = (groups.abs().amax(-1) / _qmax(weight.dtype)).clamp(min=1e-12)
        div = xs.repeat_interleave(block_size[1], -1) if block_size else xs
    xq = (xf / div).clamp(-_qmax(weight.dtype), _qmax(weight.dtype))
    xq = xq.round().to(weight.dtype) if not weight.dtype.is_floating_point else xq.to(weight.dtype)
    return ((xq.float() * div) @ w.t()).to(x.dtype), xq, xs


def _qmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


@scaled_matmul.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: list[int] | None,
      input_scale: torch.Tensor | None, quantize_input: bool) -> Any:  # fmt: skip
    _check(x.shape[-1] == weight.shape[1], "scaled_matmul",
           f"input {list(x.shape)} does not fit a weight of {weight.shape[1]} inputs")  # fmt: skip
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    if not quantize_input:
        return out, x.new_empty(tuple(weight.shape)), _none(x, torch.float32)
    scales = _none(x, torch.float32) if input_scale is not None else x.new_empty(_act_scale_shape(x, block_size),
                                                                                   dtype=torch.float32)  # fmt: skip
    return out, x.new_empty(tuple(x.shape), dtype=weight.dtype), scales


def _scaled_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, weight_scale, block_size, _input_scale, _q = inputs
    ctx.save_for_backward(weight, weight_scale)
    ctx.block_size = block_size


def _scaled_backward(ctx: Any, grad: torch.Tensor, _a: Any, _b: Any) -> tuple[Any, ...]:
    weight, weight_scale = ctx.saved_tensors
    return grad @ _weight_scales(weight, weight_scale, ctx.block_size, grad.dtype), None, None, None, None, None


scaled_matmul.register_autograd(_scaled_backward, setup_context=_scaled_setup)
