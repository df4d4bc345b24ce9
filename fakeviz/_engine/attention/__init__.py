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

Modules
-------
* :mod:`.common` -- what every backend check shares (``sdp_utils_cpp.h``): ``Backend``,
  ``Setting`` and the defaults, ``SDPParams`` / ``SDPFlags``, and the shared checks.
* :mod:`.checks` -- the CUDA checks per backend (``cuda/sdp_utils.cpp``) and
  ``can_use_flash_attention`` / ``can_use_mem_efficient_attention`` / ``can_use_cudnn_attention``
  as ``why_not_flash`` / ``why_not_efficient`` / ``why_not_cudnn``.
* :mod:`.choice` -- ``select_sdp_backend`` and the priority order; :func:`choose_backend`.
* :mod:`.patch` -- ATen's composite around the chosen kernel (``attention.cpp``):
  :func:`sdpa_like_gpu`; and :func:`attention_patch`.

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
pytorch#177868, in 2.12); before 2.12 the cuDNN kernel's mask is filled with -65504.0 instead
(Note: [cuDNN mask fill] in ``patch.py``, seen on an H100 with torch 2.11).

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

from .choice import choose_backend
from .common import BACKENDS, DEFAULT_CAPABILITY, DEFAULT_CUDNN_VERSION, SETTINGS, Backend, Setting
from .patch import attention_patch, sdpa_like_gpu

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
