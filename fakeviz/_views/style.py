"""What the plotly figures share: measure formatting, byte ticks, colour maps of open-ended keys, plotly itself.

Colours come from :mod:`fakeviz._core.palette`, numbers are written by :mod:`fakeviz._core.fmt`; this module
only combines them the way every figure draws them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._analysis.tree import FIGURES
from .._core.fmt import format_bytes, format_count, format_flops
from .._core.palette import NONE_COLOR, PALETTE

__all__ = ["MEASURES", "byte_ticks", "color_map", "format_measure", "plotly"]

#: Measures :func:`~fakeviz.views.layer_tree_figure` can size boxes by: every figure of the layer tree, plus
#: ``flops`` (forward + backward FLOPs) and ``ops`` (forward + backward op count).
MEASURES: tuple[str, ...] = (*FIGURES, "flops", "ops")
BYTE_FIGURES = frozenset({"param_bytes", "buffer_bytes", "act_bytes", "act_saved_bytes", "grad_bytes", "opt_bytes"})
FLOP_FIGURES = frozenset({"flops_fwd", "flops_bwd", "flops"})


def format_measure(measure: str, value: float) -> str:
    """``value`` written as its measure is: bytes (``61.2 GiB``), FLOPs (``3.1 TFLOP``) or a count (``7.0 B``)."""
    if measure in BYTE_FIGURES:
        return format_bytes(value)
    if measure in FLOP_FIGURES:
        return format_flops(value)
    return format_count(value)


def byte_ticks(top: float, n: int = 6) -> tuple[list[float], list[str]]:
    """Tick values at round binary sizes from 0 to ``top`` (at most about ``n`` of them), and their labels."""
    if not top or top <= 0 or not np.isfinite(top):
        return [0.0], ["0 B"]
    unit = 1.0
    for u in (2**10, 2**20, 2**30, 2**40, 2**50):
        if top >= u:
            unit = float(u)
    step = unit
    for mult in (0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500):
        step = unit * mult
        if top / step <= n:
            break
    if unit == 1.0:
        step = max(1.0, round(step))
    vals = list(np.arange(0, top * 1.0001 + step, step))
    return [float(v) for v in vals], [format_bytes(v) for v in vals]


def color_map(keys: Iterable[str], none_key: str | None = None) -> dict[str, str]:
    """One colour per distinct key, in order of first appearance, from the palette's cycle.

    ``none_key`` (``"no parameters"``) gets the palette's neutral colour and does not use up a colour of the cycle.
    """
    out: dict[str, str] = {}
    for k in keys:
        if k in out:
            continue
        out[k] = NONE_COLOR if k == none_key else PALETTE[len([x for x in out if x != none_key]) % len(PALETTE)]
    return out


def plotly() -> Any:
    """``plotly.graph_objects``, imported when a figure is first drawn (the data functions do without it)."""
    import plotly.graph_objects as go

    return go
