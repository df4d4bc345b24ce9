"""The CUDA checks per backend, from ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (2.13).

``why_not_flash``, ``why_not_efficient`` and ``why_not_cudnn`` port ``can_use_flash_attention``,
``can_use_mem_efficient_attention`` and ``can_use_cudnn_attention``: ``None`` when the backend can run the
inputs, else the reason of the first check that fails, in PyTorch's order (``WHY_NOT`` maps a backend to its
function). The CUDA-only checks they run (device, head-dim limits and alignment, sm ranges, dtypes per arch,
``requires_grad`` rules, causal with non-square sequence lengths, dropout, determinism, cuDNN tensor limits,
storage-offset alignment, nested tensors) are defined here; the shared ones are in :mod:`.common`. The rules
ported and their provenance are described in :mod:`fakeviz._engine.attention`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TypeAlias

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_true

from .common import (
    Backend,
    SDPParams,
    check_attn_mask_shape,
    check_batch_size_and_num_heads_dense,
    check_batch_size_nested,
    check_for_attn_mask,
    check_for_seq_len_0_nested_tensor,
    check_last_dim_stride_equals_1_dense,
    check_nonzero_sequence_lengths_dense,
    check_requires_grad_and_nested,
    check_runtime_disabled_flash,
    check_runtime_disabled_mem_efficient,
    check_tensor_dtype,
    check_tensor_shapes,
    env_flag,
    has_for_nested_inputs,
    has_only_dense_inputs,
    input_requires_grad,
    is_true,
    nested_sizes,
)

__all__ = ["WHY_NOT", "why_not_cudnn", "why_not_efficient", "why_not_flash"]

# cudnn-frontend >= 1.24 (pytorch#185554, in 2.13) enables cuDNN's d=256 path.
_CUDNN_FRONTEND_SUPPORTS_D256 = True

_HALF_TYPES = (torch.float16, torch.bfloat16)

# --------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------


_Check: TypeAlias = Callable[[SDPParams], "str | None"]


def _true_unless_false(cond: object) -> bool:
    """``TORCH_GUARD_OR_TRUE``: a plain bool, or a SymBool guarded (unknown counts as True)."""
    return bool(guard_or_true(cond))  # type: ignore[arg-type]


def _sm_in(params: SDPParams, lower: tuple[int, int], upper: tuple[int, int]) -> bool:
    """``check_sm_version<lower, upper>``: the capability lies in [lower, upper] inclusive."""
    return lower <= params.capability <= upper


def _sm(params: SDPParams) -> str:
    return f"sm {params.major}.{params.minor}"


def _minimum_gemm_alignment(params: SDPParams) -> int:
    """``minimum_gemm_alignment``: elements of alignment the efficient kernel's GEMMs need."""
    is_half = params.query.dtype in _HALF_TYPES
    use_tensor_cores = params.major >= 8 or (params.major >= 7 and is_half)
    alignment = 4 if params.major >= 8 else 1
    if use_tensor_cores:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


# --------------------------------------------------------------------------------------
# CUDA checks (cuda/sdp_utils.cpp, 2.13)
# --------------------------------------------------------------------------------------


def _check_all_tensors_on_device(params: SDPParams) -> str | None:
    q, k, v = params.qkv
    if q.device.type == "cuda":
        return None
    return (
        f"All tensors need to be on cuda device. Got query on device: {q.device}, key on device: "
        f"{k.device}, value on device: {v.device}"
    )


def _check_head_dim_size_flash(params: SDPParams) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    if is_true(dq == dk) and is_true(dq == dv) and is_true(dq <= 256):
        return None
    return (
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal "
        f"to 256. Got Query.size(-1): {dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_head_dim_size_flash_nested(params: SDPParams) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    if is_true(dq == dk) and is_true(dq == dv) and is_true(dq % 8 == 0) and is_true(dq <= 256):
        return None
    return (
        "For NestedTensor inputs, Flash attention requires q,k,v to have the same last dimension and "
        "to be a multiple of 8 and less than or equal to 256. Got Query.size(-1): "
        f"{dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_head_dim_size_mem_efficient(params: SDPParams) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    align = _minimum_gemm_alignment(params)
    if (
        is_true(dq == dk)
        and is_true(dq % align == 0)
        and is_true(dq > 0)
        and is_true(dv % align == 0)
        and is_true(dv > 0)
    ):
        return None
    return (
        f"Mem efficient attention requires last dimension of inputs to be divisible by {align}. Got "
        f"Query.size(-1): {dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_data_ptr_alignment_mem_efficient(params: SDPParams) -> str | None:
    # pytorch#184258 (in 2.13). The CUDA caching allocator returns >= 256-byte aligned bases, so
    # the pointer alignment is that of storage_offset * element_size.
    if not has_only_dense_inputs(params) or params.major < 8:
        return None
    alignment_bytes = _minimum_gemm_alignment(params) * params.query.element_size()

    def offset_bytes(t: Tensor) -> int:
        return t.storage_offset() * t.element_size()

    def aligned(t: Tensor) -> bool:
        return is_true(t.numel() == 0) or _true_unless_false(offset_bytes(t) % alignment_bytes == 0)

    if all(aligned(t) for t in params.qkv):
        return None
    q, k, v = params.qkv
    return (
        "Mem efficient attention on sm80 or newer requires q, k, and v storage offsets * "
        f"element_size to be aligned to {alignment_bytes} bytes. Got "
        f"query.storage_offset() * element_size % alignment_bytes: {offset_bytes(q) % alignment_bytes}, "
        f"key.storage_offset() * element_size % alignment_bytes: {offset_bytes(k) % alignment_bytes}, "
        f"value.storage_offset() * element_size % alignment_bytes: {offset_bytes(v) % alignment_bytes}."
    )


def _check_flash_attention_hardware_support(params: SDPParams) -> str | None:
    if _sm_in(params, (8, 0), (12, 1)):
        return None
    return (
        "Flash attention only supports gpu architectures in the range [sm80, sm121]. Attempting to "
        f"run on a {_sm(params)} gpu."
    )


def _check_mem_efficient_hardware_support(params: SDPParams) -> str | None:
    if _sm_in(params, (5, 0), (12, 1)):
        return None
    return (
        "Mem Efficient Attention only supports gpu architectures in the range [sm50, sm121]. "
        f"Attempting to run on a {_sm(params)} gpu."
    )


def _check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120(params: SDPParams) -> str | None:
    restricted = _sm_in(params, (8, 6), (8, 9)) or _sm_in(params, (12, 0), (12, 1))
    if not (input_requires_grad(params) and restricted):
        return None
    head_dim = params.query.size(-1)
    is_dropout = params.dropout > 0.0
    if is_true(head_dim <= 192) or (not is_dropout and is_true(head_dim > 224)):
        return None
    return (
        "Flash attention currently doesn't support training with head_dim ∈ (192, 224] or "
        "(head_dim ∈ (224, 256] and dropout > 0.0) on gpu architectures in the range[sm86, sm89]."
        f"Attempting to run with dropout set to: {params.dropout}and head_dim: {head_dim} on a "
        f"{_sm(params)} gpu."
    )


def _check_flash_causal_non_square_seqlens(params: SDPParams) -> str | None:
    q, k = params.query, params.key
    if not params.is_causal or q.is_nested or k.is_nested or is_true(q.size(-2) == k.size(-2)):
        return None
    return (
        "Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. Got seqlen_q: "
        f"{q.size(-2)} seqlen_k: {k.size(-2)}. If you would like to use causal attention with "
        "non-square masks, please see CausalAttnMask."
    )


def _check_dtypes_low_precision(params: SDPParams) -> str | None:
    allowed = _HALF_TYPES if params.major >= 8 else (torch.float16,)
    return check_tensor_dtype(params, allowed)


def _check_dtypes_flash_attention(params: SDPParams) -> str | None:
    if params.major >= 9 and params.flags.fa3:
        return check_tensor_dtype(params, (torch.float8_e4m3fn, torch.float16, torch.bfloat16))
    return _check_dtypes_low_precision(params)


def _check_runtime_disabled_cudnn(params: SDPParams) -> str | None:
    return None if params.flags.cudnn else "cuDNN attention has been runtime disabled."


def _check_for_nested_inputs(params: SDPParams) -> str | None:
    if not has_for_nested_inputs(params):
        return None
    if env_flag("TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED") is not True:
        return "Experimental cuDNN SDPA nested tensor support is not enabled."
    if params.major not in (9, 10):
        return "cuDNN SDPA supports nested tensors on SM 9.0, SM 10.0."
    return None


def _check_cudnn_deterministic(params: SDPParams) -> str | None:
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return "cuDNN SDPA is not deterministic."
    return None


def _check_cudnn_hardware_support(params: SDPParams) -> str | None:
    if _sm_in(params, (8, 0), (12, 1)):
        return None
    return (
        "cuDNN MHA only supports gpu architectures in the range [sm80, sm121]. Attempting to run on a "
        f"{_sm(params)} gpu."
    )


def _check_cudnn_dropout(params: SDPParams) -> str | None:
    if params.dropout * 16.0 == math.floor(params.dropout * 16.0):
        return None
    return (
        "cuDNN dropout probability resolution is limited to 1/16.Use a dropout probability that is a "
        "multiple of 1/16 to select the cuDNN backend"
    )


def _cudnn_is_sm90_or_sm10x(params: SDPParams) -> bool:
    return (params.major == 9 and params.minor == 0) or params.major == 10


def _cudnn_supports_d256(params: SDPParams) -> bool:
    version = params.cudnn_version or 0
    return _cudnn_is_sm90_or_sm10x(params) and version > 92200 and _CUDNN_FRONTEND_SUPPORTS_D256


def _check_cudnn_tensor_shapes(params: SDPParams) -> str | None:
    q, k, v = params.qkv
    max_dim = 65535
    b, h = q.size(0), q.size(1)
    if not (is_true(b <= max_dim) and is_true(h <= max_dim)):
        return (
            f"cuDNN SDPA does not support batch size or num_heads greater than {max_dim}. Got batch "
            f"size: {b}, num_heads: {h}"
        )
    s_q, s_k, d_qk, d_v = q.size(2), k.size(2), q.size(3), v.size(3)
    version = params.cudnn_version or 0
    dropout = params.dropout
    if version < 8903:
        return "SDPA fprop requires cudnn 8.9.3 or higher"
    if version < 8906 and dropout != 0.0:
        return "Dropout reference is only supported on 8.9.6 onwards."
    head_dim_limit = 128
    if _cudnn_supports_d256(params):
        head_dim_limit = 256
    elif _cudnn_is_sm90_or_sm10x(params) and version >= 91100 and is_true(d_qk == 192) and is_true(d_v == 128):
        head_dim_limit = 192
    if not (is_true(d_qk <= head_dim_limit) and is_true(d_v <= head_dim_limit)):
        return f"head_dim should be no more than {head_dim_limit}"
    if not (is_true(d_qk % 8 == 0) and is_true(d_v % 8 == 0)):
        return "head_dim should be a multiple of 8"
    if version < 8906 and not is_true(s_k % 64 == 0):
        return "not-multiple-of-64 seq_kv is not supported below 8.9.6"
    if version < 90000:
        if not is_true(s_q >= 64):
            return "s_q less than 64 is not supported before cudnn 9.0.0"
        if dropout != 0.0 and not (is_true(s_q % 64 == 0) and is_true(s_k % 64 == 0)):
            return "s_q not a multiple of 64 with padding/dropout is not supported with cudnn version 9.0.0"
    if not is_true(s_k != 1):
        return "cudnn SDPA does not support key/value sequence length 1."
    if dropout != 0.0 and not is_true(s_q != 1):
        return "cudnn SDPA does not support query sequence length 1 with dropout."
    return None


def _check_cudnn_d256_bprop_head_dim(params: SDPParams) -> str | None:
    if not input_requires_grad(params) or not _cudnn_supports_d256(params):
        return None
    d_qk, d_v = params.query.size(3), params.value.size(3)
    if (
        (is_true(d_qk <= 128) and is_true(d_v <= 128))
        or (is_true(d_qk == 192) and is_true(d_v == 128))
        or (is_true(d_qk == 256) and is_true(d_v == 256))
    ):
        return None
    return (
        f"cuDNN SDPA on SM 9.0/10.x does not support backward with these head dimensions. Got d_qk: {d_qk}, d_v: {d_v}"
    )


def _check_cudnn_query_seq_len_nested(params: SDPParams) -> str | None:
    if not params.query.is_nested:
        return None
    if max((row[1] for row in nested_sizes(params.query)), default=0) <= 128:
        return "cuDNN attention does not support nested tensor query sequence length <= 128."
    return None


# --------------------------------------------------------------------------------------
# can_use_*
# --------------------------------------------------------------------------------------


def _first_failure(params: SDPParams, checks: Sequence[_Check]) -> str | None:
    for check in checks:
        reason = check(params)
        if reason is not None:
            return reason
    return None


_FLASH_GENERAL: tuple[_Check, ...] = (
    check_runtime_disabled_flash,
    _check_all_tensors_on_device,
    check_tensor_shapes,
    check_for_attn_mask,
    _check_head_dim_size_flash,
    _check_flash_attention_hardware_support,
    _check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120,
    _check_flash_causal_non_square_seqlens,
    _check_dtypes_flash_attention,
)
_FLASH_NESTED: tuple[_Check, ...] = (
    check_batch_size_nested,
    _check_head_dim_size_flash_nested,
    check_for_seq_len_0_nested_tensor,
)
_FLASH_DENSE: tuple[_Check, ...] = (
    functools.partial(check_batch_size_and_num_heads_dense, supports_gqa=True),
    check_nonzero_sequence_lengths_dense,
    functools.partial(check_last_dim_stride_equals_1_dense, ignore_singleton_dim=True),
)

_EFFICIENT_GENERAL: tuple[_Check, ...] = (
    check_runtime_disabled_mem_efficient,
    _check_all_tensors_on_device,
    _check_mem_efficient_hardware_support,
    check_tensor_shapes,
    _check_head_dim_size_mem_efficient,
    _check_data_ptr_alignment_mem_efficient,
)
_EFFICIENT_NESTED: tuple[_Check, ...] = (
    check_requires_grad_and_nested,
    check_batch_size_nested,
    check_for_seq_len_0_nested_tensor,
)
_EFFICIENT_DENSE: tuple[_Check, ...] = (
    check_nonzero_sequence_lengths_dense,
    functools.partial(check_last_dim_stride_equals_1_dense, ignore_singleton_dim=False),
    # No GQA for memory-efficient attention in 2.13 (pytorch#191085 came later).
    functools.partial(check_batch_size_and_num_heads_dense, supports_gqa=False),
)

_CUDNN_GENERAL: tuple[_Check, ...] = (
    _check_runtime_disabled_cudnn,
    _check_for_nested_inputs,
    _check_all_tensors_on_device,
    check_tensor_shapes,
    _check_cudnn_deterministic,
    _check_dtypes_low_precision,
    check_attn_mask_shape,
    _check_cudnn_hardware_support,
    _check_cudnn_dropout,
)
_CUDNN_DENSE: tuple[_Check, ...] = (
    check_nonzero_sequence_lengths_dense,
    functools.partial(check_last_dim_stride_equals_1_dense, ignore_singleton_dim=True),
    functools.partial(check_batch_size_and_num_heads_dense, supports_gqa=True, requires_same_num_heads=False),
    _check_cudnn_tensor_shapes,
    _check_cudnn_d256_bprop_head_dim,
)
_CUDNN_NESTED: tuple[_Check, ...] = (_check_cudnn_query_seq_len_nested,)


def why_not_flash(params: SDPParams) -> str | None:
    """``can_use_flash_attention``: ``None`` if flash can run, else the first failing check's reason."""
    reason = _first_failure(params, _FLASH_GENERAL)
    if reason is None and has_for_nested_inputs(params):
        reason = _first_failure(params, _FLASH_NESTED)
    if reason is None and has_only_dense_inputs(params):
        reason = _first_failure(params, _FLASH_DENSE)
    return reason


def why_not_efficient(params: SDPParams) -> str | None:
    """``can_use_mem_efficient_attention``: ``None`` if it can run, else why not."""
    reason = _first_failure(params, _EFFICIENT_GENERAL)
    if reason is None and has_for_nested_inputs(params):
        reason = _first_failure(params, _EFFICIENT_NESTED)
    if reason is None and has_only_dense_inputs(params):
        reason = _first_failure(params, _EFFICIENT_DENSE)
    if reason is None:
        allowed = (
            (torch.float16, torch.float32, torch.bfloat16) if params.major >= 8 else (torch.float16, torch.float32)
        )
        reason = check_tensor_dtype(params, allowed)
    return reason


def why_not_cudnn(params: SDPParams) -> str | None:
    """``can_use_cudnn_attention``: ``None`` if cuDNN can run, else why not."""
    version = params.cudnn_version
    if version is None:
        return "Torch was not compiled with cuDNN attention."
    if version < 90000:
        return f"{version} cuDNN version too old to use cuDNN Attention (< v9.0.0)"
    if params.dropout > 0.0 and 91100 < version < 91400:
        return f"{version} cuDNN version does not support droppout in SDPA (9.11 - 9.13)."
    reason = _first_failure(params, _CUDNN_GENERAL)
    if reason is None and has_only_dense_inputs(params):
        reason = _first_failure(params, _CUDNN_DENSE)
    if reason is None and has_for_nested_inputs(params):
        reason = _first_failure(params, _CUDNN_NESTED)
    return reason


WHY_NOT: dict[Backend, Callable[[SDPParams], str | None]] = {
    "flash": why_not_flash,
    "efficient": why_not_efficient,
    "cudnn": why_not_cudnn,
}
