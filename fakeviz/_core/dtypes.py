"""The one reading of a dtype a user names: ``"bf16"``, ``"bfloat16"``, ``"torch.float16"``, ``"half"``, ``"fp8"``.

Every entry point that takes a dtype by name reads it here, through :func:`dtype_name` (the core may not import
torch, so the answer is torch's attribute name, ``"bfloat16"``; the engine's
:func:`~fakeviz._engine.arguments.as_dtype` turns it into the ``torch.dtype``): ``fv.record(dtype=)``,
``fakeviz.models.build(dtype=)``, ``fv.plan`` / ``sweep`` / ``fit`` / ``serve`` (``dtype=``), the command line's
``--dtype`` and ``%%fake --dtype``. The GPU speed table reads a dtype's kind of arithmetic with the same spellings
(:func:`fakeviz._core.gpu_specs.GPUSpec.peak_flops`).

Note: [dtype spellings]
Before issue 34 three tables spelled dtypes (``models/_build.py``, ``_frontends/cli.py``, the magic's) and each
refused some of the others' names. :data:`DTYPE_NAMES` is their union, plus vLLM's ``fp8_e4m3`` / ``fp8_e5m2``
(``fv.serve``'s ``kv_cache_dtype`` spellings) and ``f64`` (``f32`` and ``f16`` were there): a spelling one entry
point accepted is accepted by every one. Spellings are matched without case, surrounding blanks and a ``torch.``
prefix. ``"fp8"`` is ``float8_e4m3fn``, the format training and inference use on NVIDIA GPUs (torchao's and
vLLM's default). A dtype an entry point cannot use (``fv.record(dtype="fp8")``: not a default dtype torch takes)
is refused by that entry point after this reading, naming why.
"""

from __future__ import annotations

from typing import Any

from .errors import ArgumentError

__all__ = ["DTYPE_NAMES", "dtype_name", "spelling"]

#: Every spelling of a dtype fakeviz reads -> torch's attribute name (``getattr(torch, name)``).
DTYPE_NAMES: dict[str, str] = {
    "fp32": "float32", "float32": "float32", "float": "float32", "f32": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp64": "float64", "float64": "float64", "double": "float64", "f64": "float64",
    "fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
}  # fmt: skip


def spelling(dtype: Any) -> str:
    """``dtype`` as :data:`DTYPE_NAMES` keys it: its text, lower case, without blanks around or a ``torch.``
    prefix (``torch.bfloat16`` and ``"Torch.BFloat16 "`` both give ``"bfloat16"``)."""
    return str(dtype).strip().lower().removeprefix("torch.")


def dtype_name(dtype: Any, *, written: str | None = None) -> str:
    """Torch's name of the dtype the text ``dtype`` spells (``"bf16"`` -> ``"bfloat16"``).

    Args:
        dtype: a spelling of :data:`DTYPE_NAMES` (any case, ``torch.`` prefix allowed); anything but a ``str``
            (``16``, a NumPy dtype) is refused: a ``torch.dtype`` is the engine's to take as it is.
        written: the argument as the user wrote it, for the error (``"--dtype 'bf17'"``); default ``dtype=...``.

    Raises:
        ArgumentError: (a ``ValueError``) a spelling that is not a dtype fakeviz reads, naming the ones it does.
    """
    if isinstance(dtype, str):
        name = DTYPE_NAMES.get(spelling(dtype))
        if name is not None:
            return name
    raise ArgumentError(
        "dtype", dtype, "not a dtype fakeviz knows",
        "Give a torch.dtype or a name: bf16, fp16, fp32, fp64, fp8 (or bfloat16, float16, float32, ...).",
        written=written,
    )  # fmt: skip
