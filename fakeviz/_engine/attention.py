"""Run ``scaled_dot_product_attention`` on a fake CUDA device the way a real GPU would.

Why this exists
---------------
ATen's ``scaled_dot_product_attention`` (``aten/src/ATen/native/transformers/attention.cpp``)
asks ``_fused_sdp_choice_stub`` which kernel to use. That is a ``DispatchStub``, not a
dispatched op, so no dispatch mode can intercept it, and on a CPU-only build it has no CUDA
kernel: on fake ``cuda`` tensors every call falls back to the *math* path (fp32 upcasts, a
materialised ``[B, H, L, S]`` score matrix, ``_safe_softmax``). A real GPU would run a fused
kernel whose memory is linear in the sequence length. This module re-implements the CUDA
choice in Python and calls the fused ops directly (their meta functions work under fake
tensors, and autograd records their backward ops), so a recording shows what the GPU runs.

Public API
----------
* :func:`choose_backend` -- which backend PyTorch's CUDA build would pick, and why each
  backend tried before it was rejected.
* :func:`sdpa_like_gpu` -- ``scaled_dot_product_attention`` with ATen's CUDA-side pre- and
  post-processing around the chosen (or forced) fused op.
* :func:`attention_patch` -- a context manager that routes
  ``torch.nn.functional.scaled_dot_product_attention`` to :func:`sdpa_like_gpu` for fake
  ``cuda`` queries only.

Rules ported (PyTorch 2.13.0, CUDA build, non-ROCm)
---------------------------------------------------
From ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: ``select_sdp_backend``
(all-disabled error, priority order, debug reasons, "No available kernel"),
``priority_order`` / ``check_prefer_cudnn_attention`` (cuDNN first on sm90/sm100/sm103 when
the runtime cuDNN is newer than 9.15.0, unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1``),
``can_use_flash_attention``, ``can_use_mem_efficient_attention``, ``can_use_cudnn_attention``
and every filter they run: runtime enable flags, device, 4-D shapes, masks, head-dim limits
and alignment (``minimum_gemm_alignment``), sm ranges, dtypes per arch (incl. the FA3 fp8
case), ``requires_grad`` rules (sm86-89/sm120-121 head dims, nested training, cuDNN d=256
backward), causal with non-square sequence lengths, dropout (cuDNN 1/16 resolution, cuDNN
9.11-9.13), determinism, cuDNN tensor limits, storage-offset alignment, nested tensors.
From ``aten/src/ATen/native/transformers/sdp_utils_cpp.h`` (the 2.13 header shipped in the
installed wheel, read verbatim): the shared checks (``check_tensor_shapes``,
``check_batch_size_and_num_heads_dense`` / ``check_grouped_query_attention``,
``check_attn_mask_shape``, ``check_last_dim_stride_equals_1_dense``, nested checks).
From ``aten/src/ATen/native/transformers/attention.cpp``: ``scaled_dot_product_attention``
(``validate_sdpa_input``, zero-numel early return, ``convert_boolean_attn_mask``, flash
head-dim padding ``pad_last_dim<8>`` with the scale of the original head dim and
``post_process_flash_output``, efficient ``preprocess_mask`` / ``pad_bias<8>``,
``should_compute_logsumexp``, GQA passed through to the kernels, math via
``_scaled_dot_product_attention_math``).

Provenance and deviations
-------------------------
The C++ sources are not in the wheel. The port follows the newest stored upstream
``sdp_utils.cpp`` (after 2.13) with the changes made after the 2.13 branch cut (week of
2026-06-08) taken back out, cross-checked against an April-2026 revision and against the
2.13 header: memory-efficient attention has *no* GQA/MQA support (added by pytorch#191085,
July 2026), the sm107 d=256 exclusion (pytorch#190949) is left out, and the flash/cuDNN GQA
templates are those of the 2.13 header. Known uncertainty: the cuDNN head-dim rule follows
pytorch#185553 (d=256 only with cuDNN > 9.22 and cudnn-frontend >= 1.24); if 2.13 shipped
the older rule, cuDNN on sm90 also accepts head dims 129-256 with cuDNN >= 9.10. With the
cuDNN of the 2.13 wheels (9.20) the new rule caps cuDNN at head dim 128 (192/128 allowed).
``convert_boolean_attn_mask`` was checked against the installed 2.13 (same ops as its CPU
path: ``where(mask, 0.0, scalar_tensor(-inf))``, one converter for every backend since
pytorch#177868).

Capability (``capability=(major, minor)``, default ``(9, 0)`` = H100/H200)
-------------------------------------------------------------------------
* below sm50: no fused kernel, always math. sm50-sm7x: only memory-efficient attention, for
  fp16/fp32 (bf16 needs sm80), so a bf16 model falls back to math on a T4 ``(7, 5)``.
* sm80-sm121: flash (fp16/bf16, head dim <= 256, no mask), memory-efficient (also fp32 and
  masks) and cuDNN (fp16/bf16). Above sm121 nothing fused is allowed.
* sm86-89 and sm120-121: flash refuses training with head dim in (192, 224], or above 224
  with dropout.
* sm90, sm100, sm103 (minor 0 or 3): with the runtime cuDNN newer than 9.15.0 (2.13 wheels
  bundle 9.20.0) the default priority becomes cuDNN, flash, efficient, math -- so on an H100
  a plain bf16 attention runs ``_scaled_dot_product_cudnn_attention``, and flash only where
  cuDNN's checks fail (e.g. head dim > 128, dropout not a multiple of 1/16, a 3-D mask).
* The efficient kernel's head-dim alignment is 8 elements for fp16/bf16 (sm70+), 4 for fp32
  on sm80+, 1 otherwise; its inputs' storage offsets must be aligned the same way on sm80+.

Known limitations
-----------------
* Code that bound the function before :func:`attention_patch` was entered (``from
  torch.nn.functional import scaled_dot_product_attention`` at import time, e.g.
  ``torch.nn.attention.bias``) keeps calling the original; only lookups through the module
  attribute (including ``functional.py``'s own callers such as
  ``multi_head_attention_forward``) are routed. Fused fast paths that never call it
  (``torch._transformer_encoder_layer_fwd``, ``_native_multi_head_attention``) are not covered.
* Nested tensors and ``__torch_function__`` subclasses (NJT, ``CausalBias`` masks) are left to
  the original implementation by the patch; :func:`sdpa_like_gpu` refuses nested inputs.
  :func:`choose_backend` does port the nested checks for strided nested tensors.
* PyTorch decides the cuDNN preference once per process (first SDPA call on CUDA) and reads the
  environment once; here both are evaluated on every call. A priority order customised with
  ``sdpa_kernel(..., set_priority=True)`` is used as-is (only its enabled prefix matters).
* The cuDNN runtime version and the compile-time features (flash and memory-efficient kernels
  compiled in, cudnn-frontend >= 1.24, CUDA 13 build) are those of the 2.13.0 PyPI wheels;
  ``cudnn_version`` can be changed per call (``None`` = a build without cuDNN).
* Only the choice and the op sequence are simulated, not the kernels' workspaces (cuDNN and
  flash allocate scratch memory outside PyTorch's view of the op outputs).
* Not ported: the ROCm / AOTriton / CK branches, ``check_cudnn_layout`` (defined but unused in
  2.13), and the FA3/FA4 Python registrations (``torch.nn.attention._fa3``/``_fa4`` replace the
  flash kernels without changing the choice; only FA3's fp8 dtype rule is honoured).
* The patch swaps a module attribute: it is process-wide, not thread-local.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true, statically_known_true

__all__ = [
    "BACKENDS",
    "DEFAULT_CAPABILITY",
    "DEFAULT_CUDNN_VERSION",
    "SETTINGS",
    "Backend",
    "Setting",
    "attention_patch",
    "choose_backend",
    "sdpa_like_gpu",
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

# cudnn-frontend >= 1.24 (pytorch#185554, in 2.13) enables cuDNN's d=256 path.
_CUDNN_FRONTEND_SUPPORTS_D256 = True

# ``at::SDPBackend`` values, as torch._C._get_sdp_priority_order() reports them.
_SDP_MATH, _SDP_FLASH, _SDP_EFFICIENT, _SDP_CUDNN, _SDP_OVERRIDEABLE = 0, 1, 2, 3, 4
_BUILD_DEFAULT_ORDER = (_SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH, _SDP_CUDNN, _SDP_OVERRIDEABLE)
_CUDNN_FIRST_ORDER = (_SDP_CUDNN, _SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH)
_NAME_OF: dict[int, Backend] = {
    _SDP_FLASH: "flash",
    _SDP_EFFICIENT: "efficient",
    _SDP_CUDNN: "cudnn",
    _SDP_MATH: "math",
}

# The C++ entry point behind F.scaled_dot_product_attention; used for ATen's zero-numel early return.
_ORIGINAL_SDPA: Callable[..., Tensor] = torch._C._nn.scaled_dot_product_attention

_HALF_TYPES = (torch.float16, torch.bfloat16)
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
class _Flags:
    """The global SDPA enable flags (``at::globalContext().userEnabled*SDP()``)."""

    flash: bool
    efficient: bool
    cudnn: bool
    math: bool
    overrideable: bool
    fa3: bool

    @classmethod
    def current(cls) -> _Flags:
        """Read the flags that ``torch.nn.attention.sdpa_kernel`` and ``torch.backends.cuda`` set."""
        return cls(
            flash=torch.backends.cuda.flash_sdp_enabled(),
            efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
            cudnn=torch.backends.cuda.cudnn_sdp_enabled(),
            math=torch.backends.cuda.math_sdp_enabled(),
            overrideable=torch._C._get_overrideable_sdp_enabled(),
            fa3=torch._C._get_fa3_sdp_enabled(),
        )

    @classmethod
    def only(cls, backend: Backend) -> _Flags:
        """The flags ``sdpa_kernel([that backend])`` would leave: only ``backend`` enabled."""
        return cls(
            flash=backend == "flash",
            efficient=backend == "efficient",
            cudnn=backend == "cudnn",
            math=backend == "math",
            overrideable=False,
            fa3=torch._C._get_fa3_sdp_enabled(),
        )


@dataclass(frozen=True)
class _Params:
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
    flags: _Flags

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


_Check: TypeAlias = Callable[[_Params], "str | None"]


def _true(cond: object) -> bool:
    """``TORCH_GUARD_OR_FALSE``: a plain bool, or a SymBool guarded (unknown counts as False)."""
    return bool(guard_or_false(cond))  # type: ignore[arg-type]


def _true_unless_false(cond: object) -> bool:
    """``TORCH_GUARD_OR_TRUE``: a plain bool, or a SymBool guarded (unknown counts as True)."""
    return bool(guard_or_true(cond))  # type: ignore[arg-type]


def _env_flag(name: str) -> bool | None:
    """``c10::utils::check_env``: ``"1"`` is true, ``"0"`` is false, anything else unset."""
    value = os.environ.get(name)
    return {"1": True, "0": False}.get(value) if value is not None else None


def _sm_in(params: _Params, lower: tuple[int, int], upper: tuple[int, int]) -> bool:
    """``check_sm_version<lower, upper>``: the capability lies in [lower, upper] inclusive."""
    return lower <= params.capability <= upper


def _sm(params: _Params) -> str:
    return f"sm {params.major}.{params.minor}"


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _input_requires_grad(params: _Params) -> bool:
    """``input_requires_grad``: any of q, k, v requires grad and grad mode is on."""
    return any(t.requires_grad for t in params.qkv) and torch.is_grad_enabled()


def _has_for_nested_inputs(params: _Params) -> bool:
    """``has_for_nested_inputs``: any strided-layout nested tensor among q, k, v."""
    return any(t.is_nested and t.layout == torch.strided for t in params.qkv)


def _has_only_dense_inputs(params: _Params) -> bool:
    """``has_only_dense_inputs``: none of q, k, v is nested."""
    return not any(t.is_nested for t in params.qkv)


def _check_tensor_dtype(params: _Params, allowed: Sequence[torch.dtype]) -> str | None:
    q, k, v = params.qkv
    if q.dtype == k.dtype == v.dtype and q.dtype in allowed:
        return None
    names = ", ".join(_dtype_name(d) for d in allowed)
    return (
        f"Expected query, key and value to all be of dtype: {{{names}}}. Got Query dtype: "
        f"{_dtype_name(q.dtype)}, Key dtype: {_dtype_name(k.dtype)}, and Value dtype: "
        f"{_dtype_name(v.dtype)} instead."
    )


def _minimum_gemm_alignment(params: _Params) -> int:
    """``minimum_gemm_alignment``: elements of alignment the efficient kernel's GEMMs need."""
    is_half = params.query.dtype in _HALF_TYPES
    use_tensor_cores = params.major >= 8 or (params.major >= 7 and is_half)
    alignment = 4 if params.major >= 8 else 1
    if use_tensor_cores:
        alignment = max(alignment, 128 // (16 if is_half else 32))
    return alignment


def _nested_sizes(t: Tensor) -> list[list[int]]:
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


def _check_tensor_shapes(params: _Params) -> str | None:
    q, k, v = params.qkv
    if q.dim() == k.dim() == v.dim() == 4:
        return None
    return (
        "All fused kernels requires query, key and value to be 4 dimensional, but got Query dim: "
        f"{q.dim()}, Key dim: {k.dim()}, Value dim: {v.dim()} instead."
    )


def _check_for_attn_mask(params: _Params) -> str | None:
    if params.attn_mask is None:
        return None
    return "Flash Attention does not support non-null attn_mask."


def _check_attn_mask_shape(params: _Params) -> str | None:
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


def _check_grouped_query_attention(params: _Params, requires_same_num_heads: bool) -> str | None:
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


def _check_batch_size_and_num_heads_dense(
    params: _Params, *, supports_gqa: bool, requires_same_num_heads: bool = True
) -> str | None:
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


def _check_nonzero_sequence_lengths_dense(params: _Params) -> str | None:
    if params.query.size(-2) == 0 or params.key.size(-2) == 0:
        return "All fused kernels do not support zero seq_len_q or seq_len_kv."
    return None


def _check_last_dim_stride_equals_1_dense(params: _Params, *, ignore_singleton_dim: bool) -> str | None:
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


def _check_requires_grad_and_nested(params: _Params) -> str | None:
    if _input_requires_grad(params):
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


def _check_batch_size_nested(params: _Params) -> str | None:
    q, k, v = params.qkv
    qb, kb, vb = q.size(0), k.size(0), v.size(0)
    if qb == kb == vb:
        return None
    if _input_requires_grad(params):
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


def _check_for_seq_len_0_nested_tensor(params: _Params) -> str | None:
    for t, name in zip(params.qkv, ("query ", "key ", "value "), strict=True):
        if not t.is_nested:
            continue
        if _opt_size(t, 1) is None:
            return f"Fused kernels do not support ragged num_head_dims, {name}has a ragged num_heads."
        if any(row[1] == 0 for row in _nested_sizes(t)):
            return f"Fused kernels do not support seq_len == 0, {name}has a seq len of 0."
    qh, kh, vh = (int(t.size(1)) for t in params.qkv)
    if qh == kh == vh:
        return None
    if _input_requires_grad(params):
        return "Both fused kernels do not support training with broadcasted NT inputs."
    return _try_broadcast_param_size(qh, kh, vh, "num heads ")


def _check_runtime_disabled_flash(params: _Params) -> str | None:
    return None if params.flags.flash else "Flash attention has been runtime disabled."


def _check_runtime_disabled_mem_efficient(params: _Params) -> str | None:
    return None if params.flags.efficient else "Memory Efficient attention has been runtime disabled."


# --------------------------------------------------------------------------------------
# CUDA checks (cuda/sdp_utils.cpp, 2.13)
# --------------------------------------------------------------------------------------


def _check_all_tensors_on_device(params: _Params) -> str | None:
    q, k, v = params.qkv
    if q.device.type == "cuda":
        return None
    return (
        f"All tensors need to be on cuda device. Got query on device: {q.device}, key on device: "
        f"{k.device}, value on device: {v.device}"
    )


def _check_head_dim_size_flash(params: _Params) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    if _true(dq == dk) and _true(dq == dv) and _true(dq <= 256):
        return None
    return (
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal "
        f"to 256. Got Query.size(-1): {dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_head_dim_size_flash_nested(params: _Params) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    if _true(dq == dk) and _true(dq == dv) and _true(dq % 8 == 0) and _true(dq <= 256):
        return None
    return (
        "For NestedTensor inputs, Flash attention requires q,k,v to have the same last dimension and "
        "to be a multiple of 8 and less than or equal to 256. Got Query.size(-1): "
        f"{dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_head_dim_size_mem_efficient(params: _Params) -> str | None:
    dq, dk, dv = (t.size(-1) for t in params.qkv)
    align = _minimum_gemm_alignment(params)
    if _true(dq == dk) and _true(dq % align == 0) and _true(dq > 0) and _true(dv % align == 0) and _true(dv > 0):
        return None
    return (
        f"Mem efficient attention requires last dimension of inputs to be divisible by {align}. Got "
        f"Query.size(-1): {dq}, Key.size(-1): {dk}, Value.size(-1): {dv} instead."
    )


def _check_data_ptr_alignment_mem_efficient(params: _Params) -> str | None:
    # pytorch#184258 (in 2.13). The CUDA caching allocator returns >= 256-byte aligned bases, so
    # the pointer alignment is that of storage_offset * element_size.
    if not _has_only_dense_inputs(params) or params.major < 8:
        return None
    alignment_bytes = _minimum_gemm_alignment(params) * params.query.element_size()

    def offset_bytes(t: Tensor) -> int:
        return t.storage_offset() * t.element_size()

    def aligned(t: Tensor) -> bool:
        return _true(t.numel() == 0) or _true_unless_false(offset_bytes(t) % alignment_bytes == 0)

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


def _check_flash_attention_hardware_support(params: _Params) -> str | None:
    if _sm_in(params, (8, 0), (12, 1)):
        return None
    return (
        "Flash attention only supports gpu architectures in the range [sm80, sm121]. Attempting to "
        f"run on a {_sm(params)} gpu."
    )


def _check_mem_efficient_hardware_support(params: _Params) -> str | None:
    if _sm_in(params, (5, 0), (12, 1)):
        return None
    return (
        "Mem Efficient Attention only supports gpu architectures in the range [sm50, sm121]. "
        f"Attempting to run on a {_sm(params)} gpu."
    )


def _check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120(params: _Params) -> str | None:
    restricted = _sm_in(params, (8, 6), (8, 9)) or _sm_in(params, (12, 0), (12, 1))
    if not (_input_requires_grad(params) and restricted):
        return None
    head_dim = params.query.size(-1)
    is_dropout = params.dropout > 0.0
    if _true(head_dim <= 192) or (not is_dropout and _true(head_dim > 224)):
        return None
    return (
        "Flash attention currently doesn't support training with head_dim ∈ (192, 224] or "
        "(head_dim ∈ (224, 256] and dropout > 0.0) on gpu architectures in the range[sm86, sm89]."
        f"Attempting to run with dropout set to: {params.dropout}and head_dim: {head_dim} on a "
        f"{_sm(params)} gpu."
    )


def _check_flash_causal_non_square_seqlens(params: _Params) -> str | None:
    q, k = params.query, params.key
    if not params.is_causal or q.is_nested or k.is_nested or _true(q.size(-2) == k.size(-2)):
        return None
    return (
        "Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. Got seqlen_q: "
        f"{q.size(-2)} seqlen_k: {k.size(-2)}. If you would like to use causal attention with "
        "non-square masks, please see CausalAttnMask."
    )


def _check_dtypes_low_precision(params: _Params) -> str | None:
    allowed = _HALF_TYPES if params.major >= 8 else (torch.float16,)
    return _check_tensor_dtype(params, allowed)


def _check_dtypes_flash_attention(params: _Params) -> str | None:
    if params.major >= 9 and params.flags.fa3:
        return _check_tensor_dtype(params, (torch.float8_e4m3fn, torch.float16, torch.bfloat16))
    return _check_dtypes_low_precision(params)


def _check_runtime_disabled_cudnn(params: _Params) -> str | None:
    return None if params.flags.cudnn else "cuDNN attention has been runtime disabled."


def _check_for_nested_inputs(params: _Params) -> str | None:
    if not _has_for_nested_inputs(params):
        return None
    if _env_flag("TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED") is not True:
        return "Experimental cuDNN SDPA nested tensor support is not enabled."
    if params.major not in (9, 10):
        return "cuDNN SDPA supports nested tensors on SM 9.0, SM 10.0."
    return None


def _check_cudnn_deterministic(params: _Params) -> str | None:
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return "cuDNN SDPA is not deterministic."
    return None


def _check_cudnn_hardware_support(params: _Params) -> str | None:
    if _sm_in(params, (8, 0), (12, 1)):
        return None
    return (
        "cuDNN MHA only supports gpu architectures in the range [sm80, sm121]. Attempting to run on a "
        f"{_sm(params)} gpu."
    )


def _check_cudnn_dropout(params: _Params) -> str | None:
    if params.dropout * 16.0 == math.floor(params.dropout * 16.0):
        return None
    return (
        "cuDNN dropout probability resolution is limited to 1/16.Use a dropout probability that is a "
        "multiple of 1/16 to select the cuDNN backend"
    )


def _cudnn_is_sm90_or_sm10x(params: _Params) -> bool:
    return (params.major == 9 and params.minor == 0) or params.major == 10


def _cudnn_supports_d256(params: _Params) -> bool:
    version = params.cudnn_version or 0
    return _cudnn_is_sm90_or_sm10x(params) and version > 92200 and _CUDNN_FRONTEND_SUPPORTS_D256


def _check_cudnn_tensor_shapes(params: _Params) -> str | None:
    q, k, v = params.qkv
    max_dim = 65535
    b, h = q.size(0), q.size(1)
    if not (_true(b <= max_dim) and _true(h <= max_dim)):
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
    elif _cudnn_is_sm90_or_sm10x(params) and version >= 91100 and _true(d_qk == 192) and _true(d_v == 128):
        head_dim_limit = 192
    if not (_true(d_qk <= head_dim_limit) and _true(d_v <= head_dim_limit)):
        return f"head_dim should be no more than {head_dim_limit}"
    if not (_true(d_qk % 8 == 0) and _true(d_v % 8 == 0)):
        return "head_dim should be a multiple of 8"
    if version < 8906 and not _true(s_k % 64 == 0):
        return "not-multiple-of-64 seq_kv is not supported below 8.9.6"
    if version < 90000:
        if not _true(s_q >= 64):
            return "s_q less than 64 is not supported before cudnn 9.0.0"
        if dropout != 0.0 and not (_true(s_q % 64 == 0) and _true(s_k % 64 == 0)):
            return "s_q not a multiple of 64 with padding/dropout is not supported with cudnn version 9.0.0"
    if not _true(s_k != 1):
        return "cudnn SDPA does not support key/value sequence length 1."
    if dropout != 0.0 and not _true(s_q != 1):
        return "cudnn SDPA does not support query sequence length 1 with dropout."
    return None


def _check_cudnn_d256_bprop_head_dim(params: _Params) -> str | None:
    if not _input_requires_grad(params) or not _cudnn_supports_d256(params):
        return None
    d_qk, d_v = params.query.size(3), params.value.size(3)
    if (
        (_true(d_qk <= 128) and _true(d_v <= 128))
        or (_true(d_qk == 192) and _true(d_v == 128))
        or (_true(d_qk == 256) and _true(d_v == 256))
    ):
        return None
    return (
        f"cuDNN SDPA on SM 9.0/10.x does not support backward with these head dimensions. Got d_qk: {d_qk}, d_v: {d_v}"
    )


def _check_cudnn_query_seq_len_nested(params: _Params) -> str | None:
    if not params.query.is_nested:
        return None
    if max((row[1] for row in _nested_sizes(params.query)), default=0) <= 128:
        return "cuDNN attention does not support nested tensor query sequence length <= 128."
    return None


# --------------------------------------------------------------------------------------
# can_use_* and select_sdp_backend
# --------------------------------------------------------------------------------------


def _first_failure(params: _Params, checks: Sequence[_Check]) -> str | None:
    for check in checks:
        reason = check(params)
        if reason is not None:
            return reason
    return None


_FLASH_GENERAL: tuple[_Check, ...] = (
    _check_runtime_disabled_flash,
    _check_all_tensors_on_device,
    _check_tensor_shapes,
    _check_for_attn_mask,
    _check_head_dim_size_flash,
    _check_flash_attention_hardware_support,
    _check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120,
    _check_flash_causal_non_square_seqlens,
    _check_dtypes_flash_attention,
)
_FLASH_NESTED: tuple[_Check, ...] = (
    _check_batch_size_nested,
    _check_head_dim_size_flash_nested,
    _check_for_seq_len_0_nested_tensor,
)
_FLASH_DENSE: tuple[_Check, ...] = (
    functools.partial(_check_batch_size_and_num_heads_dense, supports_gqa=True),
    _check_nonzero_sequence_lengths_dense,
    functools.partial(_check_last_dim_stride_equals_1_dense, ignore_singleton_dim=True),
)

_EFFICIENT_GENERAL: tuple[_Check, ...] = (
    _check_runtime_disabled_mem_efficient,
    _check_all_tensors_on_device,
    _check_mem_efficient_hardware_support,
    _check_tensor_shapes,
    _check_head_dim_size_mem_efficient,
    _check_data_ptr_alignment_mem_efficient,
)
_EFFICIENT_NESTED: tuple[_Check, ...] = (
    _check_requires_grad_and_nested,
    _check_batch_size_nested,
    _check_for_seq_len_0_nested_tensor,
)
_EFFICIENT_DENSE: tuple[_Check, ...] = (
    _check_nonzero_sequence_lengths_dense,
    functools.partial(_check_last_dim_stride_equals_1_dense, ignore_singleton_dim=False),
    # No GQA for memory-efficient attention in 2.13 (pytorch#191085 came later).
    functools.partial(_check_batch_size_and_num_heads_dense, supports_gqa=False),
)

_CUDNN_GENERAL: tuple[_Check, ...] = (
    _check_runtime_disabled_cudnn,
    _check_for_nested_inputs,
    _check_all_tensors_on_device,
    _check_tensor_shapes,
    _check_cudnn_deterministic,
    _check_dtypes_low_precision,
    _check_attn_mask_shape,
    _check_cudnn_hardware_support,
    _check_cudnn_dropout,
)
_CUDNN_DENSE: tuple[_Check, ...] = (
    _check_nonzero_sequence_lengths_dense,
    functools.partial(_check_last_dim_stride_equals_1_dense, ignore_singleton_dim=True),
    functools.partial(_check_batch_size_and_num_heads_dense, supports_gqa=True, requires_same_num_heads=False),
    _check_cudnn_tensor_shapes,
    _check_cudnn_d256_bprop_head_dim,
)
_CUDNN_NESTED: tuple[_Check, ...] = (_check_cudnn_query_seq_len_nested,)


def _why_not_flash(params: _Params) -> str | None:
    """``can_use_flash_attention``: ``None`` if flash can run, else the first failing check's reason."""
    reason = _first_failure(params, _FLASH_GENERAL)
    if reason is None and _has_for_nested_inputs(params):
        reason = _first_failure(params, _FLASH_NESTED)
    if reason is None and _has_only_dense_inputs(params):
        reason = _first_failure(params, _FLASH_DENSE)
    return reason


def _why_not_efficient(params: _Params) -> str | None:
    """``can_use_mem_efficient_attention``: ``None`` if it can run, else why not."""
    reason = _first_failure(params, _EFFICIENT_GENERAL)
    if reason is None and _has_for_nested_inputs(params):
        reason = _first_failure(params, _EFFICIENT_NESTED)
    if reason is None and _has_only_dense_inputs(params):
        reason = _first_failure(params, _EFFICIENT_DENSE)
    if reason is None:
        allowed = (
            (torch.float16, torch.float32, torch.bfloat16) if params.major >= 8 else (torch.float16, torch.float32)
        )
        reason = _check_tensor_dtype(params, allowed)
    return reason


def _why_not_cudnn(params: _Params) -> str | None:
    """``can_use_cudnn_attention``: ``None`` if cuDNN can run, else why not."""
    version = params.cudnn_version
    if version is None:
        return "Torch was not compiled with cuDNN attention."
    if version < 90000:
        return f"{version} cuDNN version too old to use cuDNN Attention (< v9.0.0)"
    if params.dropout > 0.0 and 91100 < version < 91400:
        return f"{version} cuDNN version does not support droppout in SDPA (9.11 - 9.13)."
    reason = _first_failure(params, _CUDNN_GENERAL)
    if reason is None and _has_only_dense_inputs(params):
        reason = _first_failure(params, _CUDNN_DENSE)
    if reason is None and _has_for_nested_inputs(params):
        reason = _first_failure(params, _CUDNN_NESTED)
    return reason


_WHY_NOT: dict[Backend, Callable[[_Params], str | None]] = {
    "flash": _why_not_flash,
    "efficient": _why_not_efficient,
    "cudnn": _why_not_cudnn,
}


def _prefer_cudnn(capability: tuple[int, int], cudnn_version: int | None) -> bool:
    """``check_prefer_cudnn_attention``: cuDNN first on sm90/sm100/sm103 with cuDNN > 9.15.0."""
    if _env_flag("TORCH_CUDNN_SDPA_DEPRIORITIZED") is True or cudnn_version is None:
        return False
    major, minor = capability
    return cudnn_version > 91500 and major in (9, 10) and minor in (0, 3)


def _priority_order(params: _Params) -> tuple[int, ...]:
    """``priority_order``: the global order, first initialised to cuDNN-first where preferred."""
    current = tuple(torch._C._get_sdp_priority_order())
    if current == _BUILD_DEFAULT_ORDER and _prefer_cudnn(params.capability, params.cudnn_version):
        return _CUDNN_FIRST_ORDER
    return current


def _no_kernel_message(params: _Params, context: str) -> str:
    lines = [f"{context} No available kernel. Aborting execution."]
    for name, label in (("efficient", "Memory efficient"), ("flash", "Flash attention"), ("cudnn", "cuDNN attention")):
        lines.append(f"  {label} kernel not used because: {_WHY_NOT[name](params)}")
    return "\n".join(lines)


def _select_sdp_backend(params: _Params) -> tuple[Backend, dict[str, str]]:
    """``select_sdp_backend`` (raising where ``_fused_sdp_choice_cuda`` would raise)."""
    flags = params.flags
    if not (flags.math or flags.flash or flags.efficient or flags.cudnn):
        raise RuntimeError(
            "No viable backend for scaled_dot_product_attention was found. This is likely due to "
            "turning off both the math kernel and the fused kernels."
        )
    rejected: dict[str, str] = {}
    for code in _priority_order(params):
        if code == _SDP_MATH:
            if flags.math:
                return "math", rejected
            rejected["math"] = "Math attention has been runtime disabled."
        elif code == _SDP_OVERRIDEABLE:
            if flags.overrideable:
                raise RuntimeError("Invalid backend")
        elif code in _NAME_OF:
            name = _NAME_OF[code]
            reason = _WHY_NOT[name](params)
            if reason is None:
                return name, rejected
            rejected[name] = reason
        else:
            raise RuntimeError("Invalid backend")
    raise RuntimeError(_no_kernel_message(params, "scaled_dot_product_attention:"))


def _params(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
    capability: tuple[int, int],
    cudnn_version: int | None,
    flags: _Flags,
) -> _Params:
    return _Params(
        query=query,
        key=key,
        value=value,
        attn_mask=attn_mask,
        dropout=float(dropout_p),
        is_causal=bool(is_causal),
        enable_gqa=bool(enable_gqa),
        capability=_validate_capability(capability),
        cudnn_version=cudnn_version,
        flags=flags,
    )


def _validate_capability(capability: Sequence[int]) -> tuple[int, int]:
    cap = tuple(capability)
    if len(cap) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cap):
        raise ValueError(f"capability must be a (major, minor) pair of non-negative ints, got {capability!r}")
    return (cap[0], cap[1])


def _validate_setting(setting: str) -> Setting:
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {', '.join(map(repr, SETTINGS))}; got {setting!r}")
    return setting  # type: ignore[return-value]


def choose_backend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    capability: tuple[int, int] = DEFAULT_CAPABILITY,
    cudnn_version: int | None = DEFAULT_CUDNN_VERSION,
) -> tuple[str, dict[str, str]]:
    """Pick the SDPA backend PyTorch 2.13's CUDA build would run for these inputs.

    A port of ``select_sdp_backend`` in ``cuda/sdp_utils.cpp``: walks the priority order
    (cuDNN, flash, efficient, math on sm90/sm100/sm103 with cuDNN > 9.15.0; else flash,
    efficient, math, cuDNN; or the order set with ``sdpa_kernel(..., set_priority=True)``),
    honours the global enable flags (``torch.backends.cuda.*_sdp_enabled()``, which
    ``torch.nn.attention.sdpa_kernel`` sets) and returns the first backend whose checks pass.

    Args:
        query: ``[B, Hq, L, E]`` (fused kernels need 4-D inputs on a ``cuda`` device; fake
            tensors are fine).
        key: ``[B, H, S, E]``.
        value: ``[B, H, S, Ev]``.
        attn_mask: Optional boolean or additive mask, as given to SDPA (before conversion).
        dropout_p: Dropout probability.
        is_causal: Causal (upper-left) masking.
        scale: Softmax scale; accepted for signature parity, PyTorch does not look at it when
            choosing.
        enable_gqa: Grouped-query attention (fewer key/value heads).
        capability: The GPU's compute capability ``(major, minor)``; see the module docstring
            for how it changes the choice.
        cudnn_version: Runtime cuDNN version as ``major * 10000 + minor * 100 + patch``
            (default: 9.20.0 of the 2.13 wheels); ``None`` models a build without cuDNN.

    Returns:
        ``(backend, reasons)``: backend is ``"flash"``, ``"efficient"``, ``"cudnn"`` or
        ``"math"``; ``reasons`` maps each backend tried before it (in priority order) to the
        first check that rejected it, worded like PyTorch's debug warnings.

    Raises:
        RuntimeError: When no backend can run (math disabled and every fused check failing,
            or every backend disabled), like PyTorch's "No available kernel" error.
        ValueError: For a malformed ``capability``.
    """
    del scale  # not part of sdp::sdp_params
    params = _params(
        query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, capability, cudnn_version, _Flags.current()
    )
    return _select_sdp_backend(params)


# --------------------------------------------------------------------------------------
# attention.cpp: the composite around the chosen kernel
# --------------------------------------------------------------------------------------

_aten = torch.ops.aten


def _validate_sdpa_input(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None) -> None:
    """``validate_sdpa_input`` (same checks and messages as ATen)."""
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead."
        )
    if not (query.device == key.device == value.device):
        raise RuntimeError(
            "Expected query, key, and value to have the same device type, but got query.device: "
            f"{query.device} key.device: {key.device} and value.device: {value.device} instead."
        )
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
            f"{query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead."
        )
    if attn_mask is not None:
        if attn_mask.dtype not in (torch.bool, query.dtype):
            raise RuntimeError(
                "Expected attn_mask dtype to be bool or to match query dtype, but got attn_mask.dtype: "
                f"{attn_mask.dtype} and  query.dtype: {query.dtype} instead."
            )
        if query.is_nested or key.is_nested:
            raise RuntimeError(
                "Scaled_dot_product_attention: Nested tensors for query / key are not supported when "
                "an explicit attn_mask is set"
            )


def _convert_boolean_attn_mask(attn_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``convert_boolean_attn_mask``: bool mask -> additive mask (0 where True, -inf where False)."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    neg_inf = _aten.scalar_tensor.default(-math.inf, dtype=dtype, device=attn_mask.device)
    return torch.where(attn_mask, 0.0, neg_inf)


def _should_compute_logsumexp(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """``should_compute_logsumexp``: logsumexp is kept for backward only when it will run."""
    return any(t.requires_grad for t in (query, key, value)) and torch.is_grad_enabled()


def _pad_last_dim(t: Tensor, alignment: int) -> Tensor:
    """``pad_last_dim<alignment, /*slice=*/false>``: zero-pad the last dim to a multiple."""
    size = t.size(-1)
    if _true(size % alignment == 0):
        return t
    return _aten.pad.default(t, [0, alignment - size % alignment])


def _post_process_flash_output(out: Tensor, og_size: int) -> Tensor:
    """``post_process_flash_output``: slice a padded head dim back to its original size."""
    if not out.is_nested and out.size(-1) != og_size:
        return _aten.slice.Tensor(out, -1, 0, og_size)
    return out


def _calculate_scale(query: Tensor, scale: float | None) -> float:
    """``sdp::calculate_scale``: the given scale, else ``1 / sqrt(head_dim)`` of ``query``."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(float(query.size(-1)))


def _aligned_tensor(t: Tensor, alignment: int) -> bool:
    """``aligned_tensor<alignment>``: every stride but the last a multiple, the last 1."""
    for stride in t.stride()[:-1]:
        if not isinstance(stride, int) or stride % alignment != 0:
            return False  # unknown (symbolic) strides count as unaligned, like ATen
    return t.stride(-1) == 1


def _pad_bias(attn_bias: Tensor, alignment: int) -> Tensor:
    """``pad_bias<alignment>``: pad the last dim (always by >= 1) and slice back, for alignment."""
    last = attn_bias.size(-1)
    padded = _aten.pad.default(attn_bias, [0, alignment - last % alignment])
    return _aten.slice.Tensor(padded, -1, 0, last)


def _preprocess_mask(mask: Tensor, query: Tensor, key: Tensor) -> Tensor:
    """``preprocess_mask``: align the additive mask for the efficient kernel, expand to 4-D."""
    if not _aligned_tensor(mask, 8):
        mask = _pad_bias(mask, 8)
    return _aten.expand.default(mask, [query.size(0), query.size(1), query.size(2), key.size(2)])


def _run_backend(
    backend: Backend,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> Tensor:
    """The ``switch (backend)`` of ATen's ``scaled_dot_product_attention`` for a CUDA query."""
    mask = _convert_boolean_attn_mask(attn_mask, query.dtype)
    if backend == "cudnn":
        lse = _should_compute_logsumexp(query, key, value)
        return _aten._scaled_dot_product_cudnn_attention(
            query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale
        )[0]
    if backend == "flash":
        og_size = query.size(-1)
        padded = [_pad_last_dim(t, 8) for t in (query, key, value)]
        og_scale = _calculate_scale(query, scale)
        out = _aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, False, scale=og_scale)[0]
        return _post_process_flash_output(out, og_size)
    if backend == "efficient":
        lse = _should_compute_logsumexp(query, key, value)
        if mask is not None:
            mask = _preprocess_mask(mask, query, key)
        return _aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, lse, dropout_p, is_causal, scale=scale
        )[0]
    return _aten._scaled_dot_product_attention_math(
        query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def sdpa_like_gpu(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    setting: str = "auto",
    capability: tuple[int, int] = DEFAULT_CAPABILITY,
    cudnn_version: int | None = DEFAULT_CUDNN_VERSION,
    on_choice: Callable[[str, str, dict[str, str]], None] | None = None,
) -> Tensor:
    """``scaled_dot_product_attention`` as ATen runs it on a CUDA GPU.

    Meant for (fake) ``cuda`` inputs: on any other device every fused check fails
    (``check_all_tensors_on_device``, as in PyTorch) and the math path runs.

    Validates the inputs, chooses the backend (:func:`choose_backend`, or the forced one),
    converts a boolean mask to an additive one and calls the backend's aten op directly, so
    autograd records its backward op: ``_scaled_dot_product_flash_attention`` (head dim
    zero-padded to a multiple of 8, softmax scale of the original head dim, output sliced
    back), ``_scaled_dot_product_efficient_attention`` (mask padded to an 8-aligned stride
    and expanded to ``[B, H, L, S]``), ``_scaled_dot_product_cudnn_attention``, or
    ``_scaled_dot_product_attention_math``. Inputs with no elements take ATen's
    device-independent early return.

    Args:
        query: Query, ``[B, Hq, L, E]`` for the fused kernels.
        key: Key, ``[B, H, S, E]``.
        value: Value, ``[B, H, S, Ev]``.
        attn_mask: Optional boolean (True = attend) or additive mask.
        dropout_p: Dropout probability.
        is_causal: Causal masking.
        scale: Softmax scale (default ``1 / sqrt(E)``).
        enable_gqa: Grouped-query attention.
        setting: ``"auto"`` for PyTorch's choice (global flags and ``sdpa_kernel`` honoured),
            or ``"flash"``, ``"efficient"``, ``"cudnn"``, ``"math"`` to force one backend, as
            ``sdpa_kernel([that backend])`` would.
        capability: GPU compute capability ``(major, minor)``.
        cudnn_version: Runtime cuDNN version (see :func:`choose_backend`).

    Returns:
        The attention output, ``[B, Hq, L, Ev]``.

    Raises:
        ValueError: For an unknown ``setting``, a malformed ``capability`` or nested inputs.
        RuntimeError: For invalid inputs (ATen's messages), or when the forced backend (or,
            with math disabled, every backend) cannot run these inputs; the message names the
            backend and the reasons.
    """
    setting = _validate_setting(setting)
    if any(t.is_nested for t in (query, key, value)):
        raise ValueError("sdpa_like_gpu does not simulate nested-tensor inputs; call the original SDPA")
    _validate_sdpa_input(query, key, value, attn_mask)
    if any(_true(t.numel() == 0) for t in (query, key, value)):
        # ATen returns zeros (kept connected to every input) before choosing a backend.
        return _ORIGINAL_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    flags = _Flags.current() if setting == "auto" else _Flags.only(setting)
    params = _params(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, capability, cudnn_version, flags)
    why: dict[str, str] = {}
    if setting == "auto":
        backend, why = _select_sdp_backend(params)
    else:
        reason = _WHY_NOT[setting](params) if setting != "math" else None
        if reason is not None:
            context = f"scaled_dot_product_attention with setting={setting!r} on sm{params.major}{params.minor}:"
            raise RuntimeError(
                f"{context} backend {setting!r} cannot run these inputs: {reason}\n"
                + _no_kernel_message(params, context)
            )
        backend = setting
    if on_choice is not None:
        on_choice(backend, setting, why)
    return _run_backend(backend, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# --------------------------------------------------------------------------------------
# The patch
# --------------------------------------------------------------------------------------


_PLAIN_TORCH_FUNCTIONS = (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl)


def _is_fake_cuda(t: object) -> bool:
    return isinstance(t, Tensor) and is_fake(t) and t.device.type == "cuda"


def _overrides_torch_function(t: Tensor) -> bool:
    """A tensor subclass with its own ``__torch_function__`` (NJT, ``CausalBias``), not a mode."""
    impl = type(t).__torch_function__
    return getattr(impl, "__func__", impl) not in _PLAIN_TORCH_FUNCTIONS


@contextlib.contextmanager
def attention_patch(
    setting: str = "auto",
    capability: tuple[int, int] = DEFAULT_CAPABILITY,
    *,
    cudnn_version: int | None = DEFAULT_CUDNN_VERSION,
    on_choice: Callable[[str, str, dict[str, str]], None] | None = None,
    on_error: Callable[[Exception], BaseException] | None = None,
) -> Iterator[None]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` on fake cuda to :func:`sdpa_like_gpu`.

    While active, the module attribute is replaced by a wrapper. Calls whose query is a fake
    tensor on a ``cuda`` device (and no input is nested or has a ``__torch_function__``
    override) go to :func:`sdpa_like_gpu` with ``setting``, ``capability`` and
    ``cudnn_version``; every other call (real tensors, cpu, meta, nested, tensor subclasses)
    goes to the function that was there before, unchanged. The previous function is
    restored on exit, also on error; patches nest (the innermost one decides for fake cuda).

    Only lookups through the module attribute are covered: code that bound the function
    earlier (``from torch.nn.functional import scaled_dot_product_attention`` at import
    time) keeps calling the original. ``functional.py``'s own callers (e.g.
    ``multi_head_attention_forward``) look it up as a module global and are covered.

    Args:
        setting: ``"auto"``, ``"flash"``, ``"efficient"``, ``"cudnn"`` or ``"math"``.
        capability: GPU compute capability ``(major, minor)`` to simulate.
        cudnn_version: Runtime cuDNN version (see :func:`choose_backend`).
        on_choice: Called as ``on_choice(backend, setting, reasons)`` for every simulated call.
        on_error: Called with any exception an attention call raises (also a backend that
            cannot run); it returns the exception to raise (the same one, or a clearer one).

    Yields:
        Nothing; use as ``with attention_patch("auto"): ...``.

    Raises:
        ValueError: For an unknown ``setting`` or a malformed ``capability`` (before patching).
    """
    setting = _validate_setting(setting)
    capability = _validate_capability(capability)
    previous = F.scaled_dot_product_attention

    @functools.wraps(previous)
    def scaled_dot_product_attention(
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        tensors = (query, key, value) + ((attn_mask,) if isinstance(attn_mask, Tensor) else ())
        simulate = _is_fake_cuda(query) and all(
            isinstance(t, Tensor) and not t.is_nested and not _overrides_torch_function(t) for t in tensors
        )
        try:
            if not simulate:
                return previous(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            return sdpa_like_gpu(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                setting=setting,
                capability=capability,
                cudnn_version=cudnn_version,
                on_choice=on_choice,
            )
        except Exception as exc:
            new = on_error(exc) if on_error is not None else exc
            if new is exc:
                raise
            raise new from exc

    scaled_dot_product_attention.__fakeviz_attention_patch__ = (setting, capability)  # type: ignore[attr-defined]
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = previous
