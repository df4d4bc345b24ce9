"""Which SDPA backend PyTorch's CUDA build runs: ``select_sdp_backend`` of ``cuda/sdp_utils.cpp`` (2.13).

:func:`choose_backend` is the public entry point: the priority order (``priority_order`` with
``check_prefer_cudnn_attention``), the global enable flags, and the first backend whose checks
(:mod:`.checks`) pass. ``select_sdp_backend`` (raising where ``_fused_sdp_choice_cuda`` raises),
``no_kernel_message``, ``make_params`` and the validators also serve :mod:`.patch`. How the compute
capability and the cuDNN version change the choice is described in :mod:`fakeviz._engine.attention`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from .. import torch_compat
from .checks import WHY_NOT
from .common import (
    DEFAULT_CAPABILITY,
    DEFAULT_CUDNN_VERSION,
    SETTINGS,
    Backend,
    SDPFlags,
    SDPParams,
    Setting,
    env_flag,
)

__all__ = [
    "choose_backend",
    "make_params",
    "no_kernel_message",
    "select_sdp_backend",
    "validate_capability",
    "validate_setting",
]

# ``at::SDPBackend`` values, as torch._C._get_sdp_priority_order() reports them (torch_compat.sdp_priority_order).
_SDP_MATH, _SDP_FLASH, _SDP_EFFICIENT, _SDP_CUDNN, _SDP_OVERRIDEABLE = 0, 1, 2, 3, 4
_BUILD_DEFAULT_ORDER = (_SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH, _SDP_CUDNN, _SDP_OVERRIDEABLE)
_CUDNN_FIRST_ORDER = (_SDP_CUDNN, _SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH)
_NAME_OF: dict[int, Backend] = {
    _SDP_FLASH: "flash",
    _SDP_EFFICIENT: "efficient",
    _SDP_CUDNN: "cudnn",
    _SDP_MATH: "math",
}


def _prefer_cudnn(capability: tuple[int, int], cudnn_version: int | None) -> bool:
    """``check_prefer_cudnn_attention``: cuDNN first on sm90/sm100/sm103 with cuDNN > 9.15.0."""
    if env_flag("TORCH_CUDNN_SDPA_DEPRIORITIZED") is True or cudnn_version is None:
        return False
    major, minor = capability
    return cudnn_version > 91500 and major in (9, 10) and minor in (0, 3)


def _priority_order(params: SDPParams) -> tuple[int, ...]:
    """``priority_order``: the global order, first initialised to cuDNN-first where preferred (the build's
    default order on a torch that cannot report it; Note: [torch versions])."""
    current = torch_compat.sdp_priority_order() or _BUILD_DEFAULT_ORDER
    if current == _BUILD_DEFAULT_ORDER and _prefer_cudnn(params.capability, params.cudnn_version):
        return _CUDNN_FIRST_ORDER
    return current


def no_kernel_message(params: SDPParams, context: str) -> str:
    """The "No available kernel" error: ``context``, then why each fused backend was rejected."""
    lines = [f"{context} No available kernel. Aborting execution."]
    for name, label in (("efficient", "Memory efficient"), ("flash", "Flash attention"), ("cudnn", "cuDNN attention")):
        lines.append(f"  {label} kernel not used because: {WHY_NOT[name](params)}")
    return "\n".join(lines)


def select_sdp_backend(params: SDPParams) -> tuple[Backend, dict[str, str]]:
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
            reason = WHY_NOT[name](params)
            if reason is None:
                return name, rejected
            rejected[name] = reason
        else:
            raise RuntimeError("Invalid backend")
    raise RuntimeError(no_kernel_message(params, "scaled_dot_product_attention:"))


def make_params(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
    capability: tuple[int, int],
    cudnn_version: int | None,
    flags: SDPFlags,
) -> SDPParams:
    """The ``SDPParams`` of one call (``dropout_p``, ``is_causal``, ``enable_gqa`` normalised, capability checked)."""
    return SDPParams(
        query=query,
        key=key,
        value=value,
        attn_mask=attn_mask,
        dropout=float(dropout_p),
        is_causal=bool(is_causal),
        enable_gqa=bool(enable_gqa),
        capability=validate_capability(capability),
        cudnn_version=cudnn_version,
        flags=flags,
    )


def validate_capability(capability: Sequence[int]) -> tuple[int, int]:
    """``capability`` as a ``(major, minor)`` tuple of non-negative ints; ``ValueError`` otherwise."""
    cap = tuple(capability)
    if len(cap) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cap):
        raise ValueError(f"capability must be a (major, minor) pair of non-negative ints, got {capability!r}")
    return (cap[0], cap[1])


def validate_setting(setting: str) -> Setting:
    """``setting`` if it is one of ``SETTINGS``; ``ValueError`` otherwise."""
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
        capability: The GPU's compute capability ``(major, minor)``; see
            :mod:`fakeviz._engine.attention` for how it changes the choice.
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
    params = make_params(
        query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, capability, cudnn_version, SDPFlags.current()
    )
    return select_sdp_backend(params)
