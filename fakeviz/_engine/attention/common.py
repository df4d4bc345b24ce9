"""What every SDPA backend check shares, from ``aten/src/ATen/native/transformers/sdp_utils_cpp.h`` (2.13).

The vocabulary (``Backend``, ``Setting``, ``BACKENDS``, ``SETTINGS`` and the simulated defaults), the inputs
of a choice (``SDPParams``: ``sdp::sdp_params`` plus the device and build facts the C++ reads from globals;
``SDPFlags``: the global enable flags), the guards on symbolic values (``is_true``), and the checks the header
shares between the fused backends (``check_tensor_shapes``, ``check_batch_size_and_num_heads_dense`` with the
grouped-query rule, ``check_attn_mask_shape``, ``check_last_dim_stride_equals_1_dense``, the nested-tensor
checks, ...). A check returns ``None`` when it passes, else the reason, worded like PyTorch's debug warning.
The rules ported and their provenance are described in :mod:`fakeviz._engine.attention`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

from .. import torch_compat

__all__ = [
    "BACKENDS",
    "DEFAULT_CAPABILITY",
    "DEFAULT_CUDNN_VERSION",
    "SETTINGS",
    "Backend",
    "SDPFlags",
    "SDPParams",
    "Setting",
    "check_attn_mask_shape",
    "check_batch_size_and_num_heads_dense",
    "check_batch_size_nested",
    "check_for_attn_mask",
    "check_for_seq_len_0_nested_tensor",
    "check_last_dim_stride_equals_1_dense",
    "check_nonzero_sequence_lengths_dense",
    "check_requires_grad_and_nested",
    "check_runtime_disabled_flash",
    "check_runtime_disabled_mem_efficient",
    "check_tensor_dtype",
    "check_tensor_shapes",
    "env_flag",
    "has_for_nested_inputs",
    "has_only_dense_inputs",
    "input_requires_grad",
    "is_true",
    "nested_sizes",
]

Backend: TypeAlias = Literal["flash", "efficient", "cudnn", "math"]
Setting: TypeAlias = Literal["auto", "flash", "efficient", "cudnn", "math"]

#: Backend names, in the order PyTorch's ``SDPBackend`` enum lists the CUDA ones.
BACKENDS: tuple[Backend, ...] = ("flash", "efficient", "cudnn", "math")
#: Valid ``setting`` values: ``"auto"`` (PyTorch's own choice) or one backend to force.
SETTINGS: tuple[Setting, ...] = ("auto", "flash", "efficient", "cudnn", "math")
#: Compute capability assumed when none is given: sm90 (H100 / H200).
DEFAULT_CAPABILITY: tuple[int, int] = (9, 0)
#: Runtime cuDNN of the torch 2.13.0 PyPI wheels (``nvidia-cudnn-cu13==9.20.0.48``), in
#: cuDNN's ``major * 10000 + minor * 100 + patch`` form.
DEFAULT_CUDNN_VERSION: int = 92000

_DTYPE_NAMES = {
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float8_e4m3fn: "Float8_e4m3fn",
}

# --------------------------------------------------------------------------------------
# Parameters, flags and small helpers
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SDPFlags:
    """The global SDPA enable flags (``at::globalContext().userEnabled*SDP()``); ``overrideable`` and ``fa3`` read as
    off on a torch without those switches (FA3's: torch < 2.11; Note: [torch versions])."""

    flash: bool
    efficient: bool
    cudnn: bool
    math: bool
    overrideable: bool
    fa3: bool

    @classmethod
    def current(cls) -> SDPFlags:
        """Read the flags that ``torch.nn.attention.sdpa_kernel`` and ``torch.backends.cuda`` set."""
        return cls(
            flash=torch.backends.cuda.flash_sdp_enabled(),
            efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
            cudnn=torch.backends.cuda.cudnn_sdp_enabled(),
            math=torch.backends.cuda.math_sdp_enabled(),
            overrideable=torch_compat.overrideable_sdp_enabled(),
            fa3=torch_compat.fa3_sdp_enabled(),
        )

    @classmethod
    def only(cls, backend: Backend) -> SDPFlags:
        """The flags ``sdpa_kernel([that backend])`` would leave: only ``backend`` enabled."""
        return cls(
            flash=backend == "flash",
            efficient=backend == "efficient",
            cudnn=backend == "cudnn",
            math=backend == "math",
            overrideable=False,
            fa3=torch_compat.fa3_sdp_enabled(),
        )


@dataclass(frozen=True)
class SDPParams:
    """``sdp::sdp_params`` plus the device and build facts the C++ reads from globals."""

    query: Tensor
    key: Tensor
    value: Tensor
    attn_mask: Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool
    capability: tuple[int, int]
    cudnn_version: int | None
    flags: SDPFlags

    @property
    def major(self) -> int:
        """Compute capability major version."""
        return self.capability[0]

    @property
    def minor(self) -> int:
        """Compute capability minor version."""
        return self.capability[1]

    @property
    def qkv(self) -> tuple[Tensor, Tensor, Tensor]:
        """Query, key and value."""
        return (self.query, self.key, self.value)


def is_true(cond: object) -> bool:
    """``TORCH_GUARD_OR_FALSE``: a plain bool, or a SymBool guarded (unknown counts as False)."""
    return bool(guard_or_false(cond))  # type: ignore[arg-type]


def env_flag(name: str) -> bool | None:
    """``c10::utils::check_env``: ``"1"`` is true, ``"0"`` is false, anything else unset."""
    value = os.environ.get(name)
    return {"1": True, "0": False}.get(value) if value is not None else None


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def input_requires_grad(params: SDPParams) -> bool:
    """``input_requires_grad``: any of q, k, v requires grad and grad mode is on."""
    return any(t.requires_grad for t in params.qkv) and torch.is_grad_enabled()


def has_for_nested_inputs(params: SDPParams) -> bool:
    """``has_for_nested_inputs``: any strided-layout nested tensor among q, k, v."""
    return any(t.is_nested and t.layout == torch.strided for t in params.qkv)


def has_only_dense_inputs(params: SDPParams) -> bool:
    """``has_only_dense_inputs``: none of q, k, v is nested."""
    return not any(t.is_nested for t in params.qkv)


def check_tensor_dtype(params: SDPParams, allowed: Sequence[torch.dtype]) -> str | None:
    """``check_tensor_dtype``: q, k and v share one dtype, and it is in ``allowed``."""
    q, k, v = params.qkv
    if q.dtype == k.dtype == v.dtype and q.dtype in allowed:
        return None
    names = ", ".join(_dtype_name(d) for d in allowed)
    return (
        f"Expected query, key and value to all be of dtype: {{{names}}}. Got Query dtype: "
        f"{_dtype_name(q.dtype)}, Key dtype: {_dtype_name(k.dtype)}, and Value dtype: "
        f"{_dtype_name(v.dtype)} instead."
    )


def nested_sizes(t: Tensor) -> list[list[int]]:
    """Per-component sizes of a strided nested tensor (``get_nested_sizes``)."""
    return [[int(s) for s in row] for row in t._nested_tensor_size().tolist()]


def _opt_size(t: Tensor, dim: int) -> int | None:
    """``NestedTensorImpl::opt_size``: the size of ``dim`` if it is regular, else ``None``."""
    try:
        return int(t.size(dim))
    except RuntimeError:
        return None


# --------------------------------------------------------------------------------------
# Shared checks (sdp_utils_cpp.h, 2.13)
# --------------------------------------------------------------------------------------


def check_tensor_shapes(params: SDPParams) -> str | None:
    """``check_tensor_shapes``: q, k and v are 4-D."""
    q, k, v = params.qkv
    if q.dim() == k.dim() == v.dim() == 4:
        return None
    return (
        "All fused kernels requires query, key and value to be 4 dimensional, but got Query dim: "
        f"{q.dim()}, Key dim: {k.dim()}, Value dim: {v.dim()} instead."
    )


def check_for_attn_mask(params: SDPParams) -> str | None:
    """``check_for_attn_mask``: no mask (flash attention takes none)."""
    if params.attn_mask is None:
        return None
    return "Flash Attention does not support non-null attn_mask."


def check_attn_mask_shape(params: SDPParams) -> str | None:
    """``check_attn_mask_shape``: a 2-D or 4-D mask that broadcasts to ``[B, H, L, S]``, not requiring grad."""
    mask = params.attn_mask
    if mask is None:
        return None
    if mask.requires_grad:
        # PyTorch rejects this silently (no debug warning).
        return "attn_mask requires grad (rejected without a message by PyTorch)."
    q, k = params.query, params.key
    shape_hint = (
        "Please use the following attn mask shapes: 2d - ({Q_seq_len, 1}  x {KV_seq_len, 1}); "
        "4d - ({Batch, 1} x {Num_heads, 1} x {Q_seq_len, 1}  x {KV_seq_len, 1})"
    )

    def compatible(mask_dim: int, target: int) -> bool:
        # Statically equal, or the mask's dim is concretely 1 (a broadcast).
        return statically_known_true(mask_dim == target) or (isinstance(mask_dim, int) and mask_dim == 1)

    if mask.dim() < 2:
        return shape_hint
    if not compatible(mask.size(-2), q.size(2)) or not compatible(mask.size(-1), k.size(2)):
        # PyTorch returns false here without printing the hint.
        return shape_hint
    if mask.dim() == 2:
        return None
    if mask.dim() == 4 and compatible(mask.size(0), q.size(0)) and compatible(mask.size(1), q.size(1)):
        return None
    return shape_hint


def _check_grouped_query_attention(params: SDPParams, requires_same_num_heads: bool) -> str | None:
    q, k, v = params.qkv
    qh, kh, vh = q.size(-3), k.size(-3), v.size(-3)
    if requires_same_num_heads and kh != vh:
        return (
            "Both fused kernels require key and value to have the same num_heads and batch_size but "
            f"got: Key sizes: {list(k.shape)}, Value sizes: {list(v.shape)}, Query sizes: "
            f"{list(q.shape)} instead."
        )
    divides = kh != 0 and qh % kh == 0
    if not requires_same_num_heads:
        divides = divides and vh != 0 and qh % vh == 0
    if not divides:
        return (
            "The number of heads in key/value must divide number of heads in query.Got input Key "
            f"sizes(): {kh}, Value sizes(): {vh}, Query sizes(): {qh} instead."
        )
    return None


def check_batch_size_and_num_heads_dense(
    params: SDPParams, *, supports_gqa: bool, requires_same_num_heads: bool = True
) -> str | None:
    """``check_batch_size_and_num_heads_dense``: equal batch sizes, and equal head counts or the GQA rule."""
    q, k, v = params.qkv
    sizes = f"Query.sizes(): {list(q.shape)}, Key.sizes(): {list(k.shape)}, Value.sizes(): {list(v.shape)}"
    if not (q.size(0) == k.size(0) == v.size(0)):
        return (
            "For dense inputs, both fused kernels require query, key and value to have the same "
            f"batch_size. {sizes} instead. To broadcast dense inputs, try using unsqueeze and "
            "expand_to before passing them into the kernel."
        )
    if params.enable_gqa and supports_gqa:
        return _check_grouped_query_attention(params, requires_same_num_heads)
    if not (q.size(-3) == k.size(-3) == v.size(-3)):
        return (
            "For dense input, both fused kernels require query, key and value to have the same "
            f"num_heads. {sizes} instead. To broadcast dense inputs, try using unsqueeze and "
            "expand_to before passing them into the kernel."
        )
    return None


def check_nonzero_sequence_lengths_dense(params: SDPParams) -> str | None:
    """``check_nonzero_sequence_lengths_dense``: query and key sequence lengths above 0."""
    if params.query.size(-2) == 0 or params.key.size(-2) == 0:
        return "All fused kernels do not support zero seq_len_q or seq_len_kv."
    return None


def check_last_dim_stride_equals_1_dense(params: SDPParams, *, ignore_singleton_dim: bool) -> str | None:
    """``check_last_dim_stride_equals_1_dense``: q, k, v (and a GPU mask) contiguous in the last dim."""
    q, k, v = params.qkv
    qkv_ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton_dim:
        # pytorch#116333: a head dim of 1 makes the stride irrelevant.
        qkv_ok = qkv_ok or q.size(-1) == 1
    mask = params.attn_mask
    mask_ok = mask is None or q.device.type == "cpu" or mask.stride(-1) == 1
    if qkv_ok and mask_ok:
        return None
    msg = (
        "All fused kernels require the last dimension of the input to have stride 1. Got "
        f"Query.stride(-1): {q.stride(-1)}, Key.stride(-1): {k.stride(-1)}, Value.stride(-1): {v.stride(-1)}"
    )
    if mask is not None:
        msg += (
            f", Attn_mask.stride(-1): {mask.stride(-1)} (GPU backends require attn_mask's last "
            "dimension to have stride 1 while the CPU does not)."
        )
    return msg


def check_requires_grad_and_nested(params: SDPParams) -> str | None:
    """``check_requires_grad_and_nested``: no training with nested inputs (memory-efficient attention)."""
    if input_requires_grad(params):
        return "Memory efficient attention currently doesn't support training with NT inputs."
    return None


def _try_broadcast_param_size(q_size: int, k_size: int, v_size: int, name: str) -> str | None:
    top = max(q_size, k_size, v_size)
    if any(s not in (top, 1) for s in (q_size, k_size, v_size)):
        return (
            f"Both fused kernels require query, key and value to have broadcastable {name}got Query "
            f"{name}{q_size}, Key {name}{k_size}, Value {name}{v_size} instead."
        )
    return None


def check_batch_size_nested(params: SDPParams) -> str | None:
    """``check_batch_size_nested``: nested batch sizes equal, or safely broadcastable without grad."""
    q, k, v = params.qkv
    qb, kb, vb = q.size(0), k.size(0), v.size(0)
    if qb == kb == vb:
        return None
    if input_requires_grad(params):
        return "Both fused kernels do not support training with broadcasted NT inputs."
    reason = _try_broadcast_param_size(qb, kb, vb, "batch size ")
    if reason is not None:
        return reason
    unsafe = (
        "For both fused kernels, if one of key/value batch_size requires broadcasting and the other "
        "does not, then the other must have a consistent seq_len dim."
    )
    if kb == 1 and vb != 1 and v.is_nested and _opt_size(v, 2) is None:
        return unsafe
    if vb == 1 and kb != 1 and k.is_nested and _opt_size(k, 2) is None:
        return unsafe
    return None


def check_for_seq_len_0_nested_tensor(params: SDPParams) -> str | None:
    """``check_for_seq_len_0_nested_tensor``: regular head counts, no empty sequence, broadcastable heads."""
    for t, name in zip(params.qkv, ("query ", "key ", "value "), strict=True):
        if not t.is_nested:
            continue
        if _opt_size(t, 1) is None:
            return f"Fused kernels do not support ragged num_head_dims, {name}has a ragged num_heads."
        if any(row[1] == 0 for row in nested_sizes(t)):
            return f"Fused kernels do not support seq_len == 0, {name}has a seq len of 0."
    qh, kh, vh = (int(t.size(1)) for t in params.qkv)
    if qh == kh == vh:
        return None
    if input_requires_grad(params):
        return "Both fused kernels do not support training with broadcasted NT inputs."
    return _try_broadcast_param_size(qh, kh, vh, "num heads ")


def check_runtime_disabled_flash(params: SDPParams) -> str | None:
    """``check_runtime_disabled_flash``: flash attention is enabled."""
    return None if params.flags.flash else "Flash attention has been runtime disabled."


def check_runtime_disabled_mem_efficient(params: SDPParams) -> str | None:
    """``check_runtime_disabled_mem_efficient``: memory-efficient attention is enabled."""
    return None if params.flags.efficient else "Memory Efficient attention has been runtime disabled."
