"""The one palette: colours of memory categories, phases, alias-graph edges and everything else drawn.

The plotly views read it here, and the explorer gets it from Python in its payload (``state["summary"]["palette"]``),
so a colour changes in this file alone.
"""

from __future__ import annotations

from .schema import CATEGORIES, PHASES

__all__ = ["CATEGORY_COLORS", "EDGE_COLORS", "NONE_COLOR", "PALETTE", "PHASE_COLORS", "palette"]

CATEGORY_COLORS: dict[str, str] = {
    "Parameter": "#4C78A8",
    "Buffer": "#9ECAE9",
    "Gradient": "#F58518",
    "Optimizer state": "#E45756",
    "Activation": "#54A24B",
    "KV cache": "#72B7B2",
    "Temporary": "#EECA3B",
    "Input": "#B279A2",
    "Other": "#BAB0AC",
}
PHASE_COLORS: dict[str, str] = {
    "init": "#9E9E9E",
    "forward": "#4C78A8",
    "backward": "#F58518",
    "optimizer": "#E45756",
    "other": "#B279A2",
}
# colours given in turn to open-ended keys (devices, module classes, dtypes)
PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D",
    "#BAB0AC", "#1F77B4", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#17BECF", "#BCBD22",
)  # fmt: skip
NONE_COLOR = "#DDDDDD"
EDGE_COLORS = {"storage": "#BBBBBB", "view": "#4C78A8", "write": "#D62728", "name": "#72B7B2", "tied": "#F58518"}

assert tuple(CATEGORY_COLORS) == CATEGORIES and tuple(PHASE_COLORS) == PHASES


def palette() -> dict[str, object]:
    """The whole palette as plain data, for the explorer's payload."""
    return {
        "categories": [CATEGORY_COLORS[c] for c in CATEGORIES],
        "phases": [PHASE_COLORS[p] for p in PHASES],
        "edges": dict(EDGE_COLORS),
        "cycle": list(PALETTE),
        "none": NONE_COLOR,
    }
