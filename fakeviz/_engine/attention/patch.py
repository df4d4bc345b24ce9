"""Run the chosen SDPA kernel as ATen does, and route ``F.scaled_dot_product_attention`` on fake cuda to it.

:func:`sdpa_like_gpu` ports the CUDA side of ``scaled_dot_product_attention`` in
``aten/src/ATen/native/transformers/attention.cpp`` (``validate_sdpa_input``, the zero-numel early return,
``convert_boolean_attn_mask``, flash head-dim padding, efficient mask preprocessing,
``should_compute_logsumexp``) around the backend :mod:`.choice` picks, or the one forced;
:func:`attention_patch` swaps the module attribute for the duration of a ``with`` block. The rules ported,
their provenance and the known limitations are described in :mod:`fakeviz._engine.attention`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from .. import patches as _patches
from ..torch_compat import TORCH_VERSION
from .checks import WHY_NOT
from .choice import make_params, no_kernel_message, select_sdp_backend, validate_capability, validate_setting
from .common import DEFAULT_CAPABILITY, DEFAULT_CUDNN_VERSION, Backend, SDPFlags, is_true

__all__ = ["attention_patch", "mask_fill", "sdpa_like_gpu"]

# The C++ entry point behind F.scaled_dot_product_attention; used for ATen's zero-numel early return.
_ORIGINAL_SDPA: Callable[..., Tensor] = torch._C._nn.scaled_dot_product_attention

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


# Note: [cuDNN mask fill]. ATen gives the cuDNN kernel a boolean mask as an additive one like every backend, but up
# to torch 2.11 with -65504.0 (fp16's lowest, ``convert_boolean_attn_mask_cudnn``: "workaround -inf issue with
# cuDNN", pytorch#130482) where the others get -inf; pytorch#177868 (March 2026, in 2.12) made it -inf there too.
# Seen on an H100 with torch 2.11: ``scalar_tensor(-65504.0, dtype=torch.bfloat16, device=cuda:0)`` before the
# cuDNN kernel of Mistral's sliding-window mask (tests/fixtures/h100_time_holdout.json.gz).
_CUDNN_MASK_FILL_BEFORE_2_12 = -65504.0


def mask_fill(backend: Backend, torch_version: tuple[int, int] = TORCH_VERSION) -> float:
    """The value ATen writes where a boolean mask is False, for ``backend`` on ``torch_version`` (Note: [cuDNN mask
    fill])."""
    if backend == "cudnn" and torch_version < (2, 12):
        return _CUDNN_MASK_FILL_BEFORE_2_12
    return -math.inf


def _convert_boolean_attn_mask(attn_mask: Tensor | None, dtype: torch.dtype, fill: float = -math.inf) -> Tensor | None:
    """``convert_boolean_attn_mask``: bool mask -> additive mask (0 where True, ``fill`` where False)."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    neg_inf = _aten.scalar_tensor.default(fill, dtype=dtype, device=attn_mask.device)
    return torch.where(attn_mask, 0.0, neg_inf)


def _should_compute_logsumexp(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """``should_compute_logsumexp``: logsumexp is kept for backward only when it will run."""
    return any(t.requires_grad for t in (query, key, value)) and torch.is_grad_enabled()


def _pad_last_dim(t: Tensor, alignment: int) -> Tensor:
    """``pad_last_dim<alignment, /*slice=*/false>``: zero-pad the last dim to a multiple."""
    size = t.size(-1)
    if is_true(size % alignment == 0):
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
    mask = _convert_boolean_attn_mask(attn_mask, query.dtype, mask_fill(backend))
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
    setting = validate_setting(setting)
    if any(t.is_nested for t in (query, key, value)):
        raise ValueError("sdpa_like_gpu does not simulate nested-tensor inputs; call the original SDPA")
    _validate_sdpa_input(query, key, value, attn_mask)
    if any(is_true(t.numel() == 0) for t in (query, key, value)):
        # ATen returns zeros (kept connected to every input) before choosing a backend.
        return _ORIGINAL_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    flags = SDPFlags.current() if setting == "auto" else SDPFlags.only(setting)
    params = make_params(
        query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, capability, cudnn_version, flags
    )
    why: dict[str, str] = {}
    if setting == "auto":
        backend, why = select_sdp_backend(params)
    else:
        reason = WHY_NOT[setting](params) if setting != "math" else None
        if reason is not None:
            context = f"scaled_dot_product_attention with setting={setting!r} on sm{params.major}{params.minor}:"
            raise RuntimeError(
                f"{context} backend {setting!r} cannot run these inputs: {reason}\n"
                + no_kernel_message(params, context)
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
    entry: str = "sdpa",
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
        entry: the patch registry's entry it is made for (Note: [patch registry]).

    Yields:
        Nothing; use as ``with attention_patch("auto"): ...``.

    Raises:
        ValueError: For an unknown ``setting`` or a malformed ``capability`` (before patching).
    """
    setting = validate_setting(setting)
    capability = validate_capability(capability)
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
            device_type = query.device.type
            if not torch.is_autocast_enabled(device_type):
                return sdpa_like_gpu(
                    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                    setting=setting, capability=capability, cudnn_version=cudnn_version, on_choice=on_choice,
                )  # fmt: skip
            # Note: [attention under autocast]. On a GPU, autocast casts at aten::scaled_dot_product_attention
            # (a lower-precision op: every floating-point tensor argument but float64 goes to the autocast
            # dtype) and runs the op, whichever backend it picks, with autocast excluded. The simulation
            # runs above the dispatcher, so it does the same cast first, then runs with autocast off.
            # The casts are the arguments of one C++ call (``(*F)(cached_cast(args)...)``), which GCC, the
            # compiler of torch's Linux wheels, evaluates last argument first: the mask, then value, key and
            # query (H100, torch 2.11: the ``_to_copy`` of v, k, q; their backward casts then run q, k, v).
            low = torch.get_autocast_dtype(device_type)
            mask, v, k, q = (
                t.to(low) if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t
                for t in (attn_mask, value, key, query)
            )
            with torch.autocast(device_type, enabled=False):
                return sdpa_like_gpu(
                    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa,
                    setting=setting, capability=capability, cudnn_version=cudnn_version, on_choice=on_choice,
                )  # fmt: skip
        except Exception as exc:
            new = on_error(exc) if on_error is not None else exc
            if new is exc:
                raise
            raise new from exc

    scaled_dot_product_attention.__fakeviz_attention_patch__ = (setting, capability)  # type: ignore[attr-defined]
    token = _patches.push(F, "scaled_dot_product_attention", scaled_dot_product_attention, entry=entry)
    try:
        yield
    finally:
        _patches.pop(token)
