"""A simulation in a notebook (``fakeviz.simulate(...).explore()``): the classes of ranks, every recorded rank's
peak bars side by side on one axis, and a rank picker that shows the chosen rank's explorer.

A pure function of the ranks' records (each run: ``rank``, ``trace``, ``capacities``, ``label``, ``explore``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .compare import compare_bars

__all__ = ["simulation_widget"]


def simulation_widget(runs: list[Any], *, classes: dict[int, int], table: pd.DataFrame, first: int | None = None,
                      capacity: Any = None) -> Any:  # fmt: skip
    """An ipywidgets box: a table of the rank classes, the per-rank bars (plotly), a rank picker (one entry per
    recorded rank, its class in the label: ``classes`` maps rank -> class, ``table`` is one row per class) and the
    picked rank's explorer, built when it is first picked."""
    import ipywidgets
    import plotly.graph_objects as go

    by_rank = {run.rank: run for run in runs}
    cls = classes
    head = ipywidgets.HTML(table.to_html(index=False, border=0))
    bars = go.FigureWidget(compare_bars(runs)) if runs else ipywidgets.HTML("no rank recorded")
    options = [(f"rank {r} (class {cls.get(r, '?')})", r) for r in sorted(by_rank)]
    start = first if first in by_rank else (options[0][1] if options else None)
    picker = ipywidgets.Dropdown(options=options, value=start, description="rank")
    holder = ipywidgets.Box()
    built: dict[int, Any] = {}

    def show(change: Any = None) -> None:
        r = picker.value
        if r is None:
            return
        if r not in built:
            built[r] = by_rank[r].trace.explore(capacity) if capacity is not None else by_rank[r].trace.explore()
        holder.children = (built[r],)

    picker.observe(show, names="value")
    show()
    return ipywidgets.VBox([head, bars, picker, holder])
