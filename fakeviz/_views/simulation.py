"""A simulation in a notebook (``fakeviz.simulate(...).explore()``): the classes of ranks, every recorded rank's
peak bars side by side on one axis, and a rank picker that shows the chosen rank's explorer.

A pure function of the ranks' records (each run: ``rank``, ``trace``, ``capacities``, ``label``, ``explore``).
Displayed as the explorer is (Note: [static fallback] in :mod:`fakeviz._views.explorer`): first a static summary
(the classes table and the first recorded rank's trace summary, no script), then the live box, which hides the
summary while it lives (a ``<style>`` in one of its HTML children); a notebook saved without widget state, GitHub
and nbviewer show the summary.
"""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from .._core.fmt import html_table, html_text
from .compare import compare_bars
from .explorer import display_with_fallback, fallback_bundle
from .static import static_html, summary_div

LABEL = "fakeviz simulation"
_ids = itertools.count()
_box: list[type] = []  # the VBox subclass, made at the first use (ipywidgets is imported lazily)

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
    head = ipywidgets.HTML(html_table(table, index=False, border=0))
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
    sid = f"fv-sim-{next(_ids)}"
    hide = ipywidgets.HTML(f"<style>[data-fv-static='{sid}']{{display:none}}</style>")
    box = _box_class()([hide, head, bars, picker, holder])
    box.static_html = summary_html(runs, table, capacity, static_id=sid)
    return box


def summary_html(runs: list[Any], table: pd.DataFrame, capacity: Any = None, *, static_id: str = "") -> str:
    """The static summary of a simulation: how many ranks were recorded, the classes table, and the first
    recorded rank's trace summary (:func:`fakeviz._views.static.static_html`)."""
    ranks = sorted(run.rank for run in runs)
    first = min(runs, key=lambda run: run.rank) if runs else None
    parts = [
        summary_div(static_id),
        f"<div><b>{LABEL}</b>: {len(ranks)} rank{'s' if len(ranks) != 1 else ''} recorded"
        + (f" ({html_text(', '.join(map(str, ranks[:16])))}{', ...' if len(ranks) > 16 else ''})" if ranks else "")
        + "</div>",
        html_table(table, index=False, border=0),
    ]
    if first is not None:
        parts.append(f"<div style='margin-top:6px'><b>rank {first.rank}</b></div>")
        parts.append(static_html(first.trace, capacity))
    parts.append("</div>")
    return "".join(parts)


def _box_class() -> type:
    if not _box:
        import ipywidgets

        class SimulationBox(ipywidgets.VBox):  # type: ignore[misc]
            """The simulation's box, displayed with its static summary (Note: [static fallback])."""

            static_html: str | None = None

            def _repr_mimebundle_(self, **kwargs: Any) -> Any:
                return fallback_bundle(super()._repr_mimebundle_(**kwargs), self.static_html, LABEL)

            def _ipython_display_(self) -> None:
                display_with_fallback(super()._repr_mimebundle_(), self.static_html, LABEL)

        _box.append(SimulationBox)
    return _box[0]
