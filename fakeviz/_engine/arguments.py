"""Arguments every entry point reads the same way: a dtype by name, the devices fakeviz fakes.

``fv.record(dtype=...)``, ``fakeviz.models.build(dtype=...)``, ``fv.plan(dtype=...)`` and the command line's
``--dtype`` read a dtype with :func:`as_dtype`; ``fv.record(device=...)``, ``models.build(device=...)`` and
``--device`` check a device with :func:`fake_device`. A value they cannot honour is an
:class:`~fakeviz._core.errors.ArgumentError` naming the argument as written and what to give instead.
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.dtypes import DTYPE_NAMES, dtype_name
from .._core.errors import ArgumentError
from .._core.gpus import MAX_GPUS

__all__ = ["DEFAULT_DTYPES", "DTYPES", "FAKED_DEVICES", "as_dtype", "default_dtype", "fake_device", "one_or_many"]

#: Every dtype spelling fakeviz reads -> its torch dtype (the spellings are the core's one table,
#: :data:`fakeviz._core.dtypes.DTYPE_NAMES`; Note: [dtype spellings]).
DTYPES: dict[str, torch.dtype] = {spelled: getattr(torch, name) for spelled, name in DTYPE_NAMES.items()}
#: The dtypes ``torch.set_default_dtype`` takes: what ``fv.record(dtype=...)`` (the block's default) can be.
DEFAULT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: Device types fake tensors live on: fake GPUs (``cuda:0`` .. ``cuda:63``, any machine), the host, meta.
FAKED_DEVICES = ("cuda", "cpu", "meta")


def as_dtype(dtype: str | torch.dtype | None, *, written: str | None = None) -> torch.dtype | None:
    """A torch dtype from a dtype or a name (``"bf16"``, ``"bfloat16"``, ``"torch.float16"``); None stays None.

    The names are the core's one table (:func:`fakeviz._core.dtypes.dtype_name`, Note: [dtype spellings]).

    Raises:
        ArgumentError: (a ``ValueError``) a name that is not a dtype.
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, dtype_name(dtype, written=written))


def default_dtype(dtype: str | torch.dtype | None, *, written: str | None = None) -> torch.dtype | None:
    """:func:`as_dtype`, for a block's default floating dtype (``fv.record(dtype=...)``): one of
    :data:`DEFAULT_DTYPES`, the dtypes ``torch.set_default_dtype`` takes.

    Raises:
        ArgumentError: a name that is not a dtype, or a dtype torch cannot make the default.
    """
    out = as_dtype(dtype, written=written)
    if out is not None and out not in DEFAULT_DTYPES:
        raise ArgumentError(
            "dtype", dtype, f"{str(out).removeprefix('torch.')} cannot be the default dtype of a block",
            "record(dtype=...) is what torch.set_default_dtype takes: bf16, fp16, fp32 or fp64. For other "
            "dtypes, build the model with it (fakeviz.models.build(..., dtype=...)) or call .to(dtype).",
            written=written,
        )  # fmt: skip
    return out


def fake_device(
    device: str | torch.device | None, *, fake: bool = True, written: str | None = None
) -> torch.device | None:
    """``device`` as a ``torch.device``, refused when it is not a device name, or (``fake=True``) not one fake
    tensors live on (:data:`FAKED_DEVICES`: ``mps``, ``xla``, ``xpu``, ... are not faked). None stays None.

    Raises:
        ArgumentError: (a ``ValueError``) naming the devices fakeviz fakes.
    """
    if device is None:
        return None
    advice = (
        "Fake tensors live on cuda (cuda:0 .. cuda:63, answering as the GPU named by gpu=, on any machine), "
        "cpu or meta: give one of those."
    )
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise ArgumentError("device", device, f"a {type(device).__name__} is not a device", advice, written=written)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ArgumentError("device", device, "not a device name", advice, written=written) from None
    if fake and dev.type not in FAKED_DEVICES:
        raise ArgumentError("device", device, f"fakeviz does not fake {dev.type} devices", advice, written=written)
    if fake and dev.type == "cuda" and (dev.index or 0) >= MAX_GPUS:  # Note: [GPU counts]
        raise ArgumentError("device", device, f"fake cuda devices are cuda:0 .. cuda:{MAX_GPUS - 1}", advice,
                            written=written)  # fmt: skip
    return dev


def one_or_many(value: Any, kind: type | tuple[type, ...]) -> tuple[Any, ...]:
    """``value`` as a tuple: one ``kind`` on its own is one item (``exclude="transformers"`` is one package,
    ``modules=model`` one module), never iterated into its parts."""
    if isinstance(value, kind):
        return (value,)
    return tuple(value)
