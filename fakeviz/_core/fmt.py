"""Numbers and names for people: byte sizes, FLOPs, counts, and text safe for HTML and plotly.

The one definition of each format; the explorer's JavaScript (``js/src/format.js``) mirrors
:func:`format_bytes` and ``tests/views`` checks the two agree.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["esc", "format_bytes", "format_count", "format_flops"]


def _missing(n: Any) -> bool:
    return n is None or (isinstance(n, float) and math.isnan(n))


def esc(text: Any) -> str:
    """``text`` as a string safe for plotly's HTML-like text (``<``, ``>``, ``&`` escaped).

    Quotes are left alone: plotly only knows a few named entities (``&quot;`` is
    not one of them) and quotes cannot open a tag.
    """
    if _missing(text):
        return ""
    return html.escape(str(text), quote=False)


def format_bytes(n: float | None) -> str:
    """Readable binary size: ``512 B``, ``1.5 KiB``, ``61.2 GiB``; ``?`` for None or NaN."""
    if _missing(n):
        return "?"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(x) < 1024 or unit == "PiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"  # pragma: no cover - unreachable


def _format_si(n: float | None, suffixes: Sequence[str], sep: str = " ") -> str:
    if _missing(n):
        return "?"
    x = float(n)
    for i, s in enumerate(suffixes):
        if abs(x) < 1000 or i == len(suffixes) - 1:
            return f"{int(round(x))}{sep}{s}".rstrip() if i == 0 else f"{x:.1f}{sep}{s}"
        x /= 1000
    return str(n)  # pragma: no cover - unreachable


def format_flops(n: float | None) -> str:
    """Readable FLOP count: ``512 FLOP``, ``3.1 TFLOP``."""
    return _format_si(n, ("FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP", "ZFLOP"))


def format_count(n: float | None) -> str:
    """Readable count: ``512``, ``8.3 K``, ``7.0 M``, ``1.2 B`` (parameters, ops)."""
    return _format_si(n, ("", "K", "M", "B", "T", "Q"))
