"""Several runs side by side on one scale (``fakeviz.compare``): the peak bars of every device of every run
on one byte axis, and the live-bytes timelines in columns that share that axis; in a notebook, both figures
and each run's explorer side by side.

Pure functions of the records (plans are read through their ``trace`` and GPU capacities).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .._analysis.memory import peaks as peaks_of
from .._core.devices import is_host
from .._core.fmt import format_bytes
from .._core.palette import CATEGORY_COLORS
from .._core.schema import CATEGORIES
from .memory import bars_data, timeline_data
from .style import byte_ticks, plotly

__all__ = ["Comparison", "compare_bars", "compare_table", "compare_timelines"]


def _unpack(item: Any) -> tuple[Any, dict[str, int] | None, str]:
    """(record, per-device capacities or None, default label) of a plan, a simulation's rank or a trace."""
    trace = getattr(item, "trace", None)
    if trace is not None and hasattr(item, "capacities") and hasattr(item, "settings"):
        s = item.settings
        run = "train" if s["train"] else (f"gen {s['new_tokens']}" if s["new_tokens"] else "fwd")
        label = f"{s['device_map_kind']} b{s['batch']} s{s['seq']} {run}" + (" ckpt" if s["checkpointing"] else "")
        return trace, item.capacities, label
    if trace is not None and hasattr(item, "capacities"):  # a rank of a simulation
        return trace, item.capacities, str(getattr(item, "label", ""))
    return item, None, ""


def compare_table(items: list[Any], labels: list[str] | None = None) -> pd.DataFrame:
    """One row per (run, accelerator): the bytes per category at that device's peak, ``total``, ``capacity``
    (NaN when unknown) and ``fits``."""
    rows = []
    for i, item in enumerate(items):
        rec, caps, default = _unpack(item)
        label = labels[i] if labels else (default or f"run {i + 1}")
        for r in bars_data(rec).table.to_dict("records"):
            if is_host(r["device"]):
                continue
            cap = caps.get(r["device"]) if caps else None
            rows.append({
                "run": label, "device": r["device"], **{c: int(r[c]) for c in CATEGORIES}, "total": int(r["total"]),
                "capacity": float(cap) if cap is not None else np.nan,
                "fits": bool(r["total"] <= cap) if cap is not None else None,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=["run", "device", *CATEGORIES, "total", "capacity", "fits"])


def compare_bars(items: list[Any], labels: list[str] | None = None) -> Any:
    """Stacked bars by category, one per (run, device), on one byte axis, capacities as markers."""
    go = plotly()
    t = compare_table(items, labels)
    x = [[r for r in t.run], [d for d in t.device]]
    fig = go.Figure()
    for c in CATEGORIES:
        if (t[c] > 0).any():
            fig.add_trace(go.Bar(x=x, y=t[c], name=c, marker_color=CATEGORY_COLORS[c],
                                 customdata=[format_bytes(v) for v in t[c]],
                                 hovertemplate=f"{c}: %{{customdata}}<extra></extra>"))  # fmt: skip
    if t.capacity.notna().any():
        fig.add_trace(go.Scatter(x=x, y=t.capacity, mode="markers", name="capacity",
                                 marker={"symbol": "line-ew-open", "size": 30, "color": "#D62728"},
                                 customdata=[format_bytes(v) if v == v else "" for v in t.capacity],
                                 hovertemplate="capacity %{customdata}<extra></extra>"))  # fmt: skip
    top = float(np.nanmax([t.total.max() if len(t) else 0, t.capacity.max() if t.capacity.notna().any() else 0]))
    vals, text = byte_ticks(top * 1.05)
    fig.update_layout(barmode="stack", title="peak memory per device, side by side (one scale)",
                      yaxis={"tickvals": vals, "ticktext": text, "range": [0, top * 1.08]},
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 50, "b": 90})  # fmt: skip
    return fig


def compare_timelines(items: list[Any], labels: list[str] | None = None, max_points: int = 1500) -> Any:
    """One column per run: total live bytes of each accelerator after every op, all columns on one y axis."""
    go = plotly()
    from plotly.subplots import make_subplots

    names = []
    for i, item in enumerate(items):
        _, _, default = _unpack(item)
        names.append(labels[i] if labels else (default or f"run {i + 1}"))
    fig = make_subplots(rows=1, cols=len(items), shared_yaxes=True, subplot_titles=names, horizontal_spacing=0.02)
    top = 0.0
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
    for i, item in enumerate(items):
        rec, caps, _ = _unpack(item)
        devices = [d for d in peaks_of(rec) if not is_host(d)]
        for j, dev in enumerate(sorted(devices)):
            data = timeline_data(rec, dev, max_points=max_points)
            top = max(top, float(data.total.max()))
            fig.add_trace(go.Scatter(x=data.seq, y=data.total, mode="lines", name=dev, legendgroup=dev,
                                     showlegend=i == 0, line={"color": palette[j % len(palette)], "width": 1.5},
                                     hovertemplate=f"{dev} op %{{x}}: %{{y:.3s}}B<extra></extra>"),
                          row=1, col=i + 1)  # fmt: skip
            if caps and dev in caps:
                top = max(top, float(caps[dev]))
    vals, text = byte_ticks(top * 1.05)
    fig.update_yaxes(tickvals=vals, ticktext=text, range=[0, top * 1.08])
    fig.update_xaxes(title_text="op")
    fig.update_layout(title="live bytes per device over the run (one scale)", margin={"t": 70})
    return fig


class Comparison:
    """Runs side by side: ``.table`` (DataFrame), ``.bars()`` and ``.timelines()`` (plotly figures), ``.explore()``
    (each run's explorer in one row); in a notebook it shows the figures."""

    def __init__(self, items: list[Any], labels: list[str] | None = None) -> None:
        if not items:
            raise ValueError("compare: nothing to compare (give plans or traces)")
        if labels is not None and len(labels) != len(items):
            raise ValueError(f"compare: {len(labels)} labels for {len(items)} runs")
        self.items = list(items)
        self.labels = labels

    @property
    def table(self) -> pd.DataFrame:
        return compare_table(self.items, self.labels)

    def bars(self) -> Any:
        return compare_bars(self.items, self.labels)

    def timelines(self) -> Any:
        return compare_timelines(self.items, self.labels)

    def explore(self) -> Any:
        """The explorers of the runs side by side (an ipywidgets row)."""
        import ipywidgets

        boxes = []
        for item in self.items:
            boxes.append(item.explore())
        return ipywidgets.HBox(boxes)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.bars())
        display(self.timelines())

    def __repr__(self) -> str:
        t = self.table
        lines = [f"Comparison of {len(self.items)} runs"]
        for r in t.itertuples(index=False):
            cap = f" of {format_bytes(r.capacity)}" if r.capacity == r.capacity else ""
            lines.append(f"  {r.run:30s} {r.device:8s} {format_bytes(r.total)}{cap}")
        return "\n".join(lines)
