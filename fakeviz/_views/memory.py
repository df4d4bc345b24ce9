"""Memory figures: per-device peak bars by category with the capacity and the verdict, and the timeline of live
bytes by category over the run with phases shaded and the peak marked.

:func:`bars_data`, :func:`timeline_data` and :func:`phase_runs` compute the data (pure functions of a record);
:func:`memory_bars_figure` and :func:`memory_timeline_figure` draw it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._analysis.memory import decimate_minmax, memory_timeline
from .._analysis.memory import peaks as peaks_of
from .._analysis.tables import ops_table
from .._analysis.verdict import verdict as verdict_of
from .._core.devices import device_order, is_host
from .._core.fmt import esc, format_bytes
from .._core.gpus import Capacity, capacity_of
from .._core.palette import CATEGORY_COLORS, NONE_COLOR, PHASE_COLORS
from .._core.record import Record
from .._core.schema import CATEGORIES, PHASES
from .style import byte_ticks, plotly

if TYPE_CHECKING:  # pragma: no cover - typing only
    import plotly.graph_objects as go

__all__ = [
    "BarsData",
    "bars_data",
    "decimate",
    "memory_bars_figure",
    "memory_timeline_figure",
    "phase_runs",
    "pick_device",
    "timeline_data",
]


@dataclass
class BarsData:
    """Rows of the peak-memory bars (see :func:`bars_data`).

    ``table``: one row per device with the peak's bytes per category (one
    column per :data:`~fakeviz.CATEGORIES`), ``total`` (= the :func:`~fakeviz._analysis.memory.peaks` bytes),
    ``seq``, ``phase``, ``op``, ``module``, ``user_line``, ``allocated`` and
    ``reserved`` (caching-allocator model peaks, cuda only, else NaN),
    ``judged`` (the bytes the verdict judged, Note: [the verdict] in :mod:`fakeviz._analysis.verdict`: the
    reserved peak under the capacity on cuda, raw bytes elsewhere; NaN on cpu), ``headroom`` and ``fits``.
    ``title`` is plain text (the verdict when a capacity is given).
    """

    table: pd.DataFrame
    capacity: int | None = None
    capacity_label: str | None = None
    verdict: dict[str, Any] | None = None
    title: str = ""


def bars_data(trace: Record, capacity: str | int | float | None = None) -> BarsData:
    """Per device, the memory at that device's peak, split by category, and the verdict.

    Args:
        trace: a recorded trace.
        capacity: a GPU name from :data:`fakeviz._core.gpus.GPUS` (``"H100"``,
            ``"A100 80GB"``, ``"MI300X"``), bytes, or a size (``"80GB"``); ``None``
            uses the capacity the trace was recorded with, if any.

    Returns:
        A :class:`BarsData`; each row's categories add up to its ``total``,
        which is the device's :func:`~fakeviz._analysis.memory.peaks` bytes.
    """
    cap = capacity_of(trace.meta, capacity)
    peaks = peaks_of(trace)
    rows = []
    verdict = verdict_of(trace, cap) if cap is not None and peaks else None
    for dev in device_order(peaks):
        pk = peaks[dev]
        row: dict[str, Any] = {"device": dev}
        row.update({c: int(pk.by_category.get(c, 0)) for c in CATEGORIES})
        judged = verdict["devices"].get(dev) if verdict else None
        row.update(
            total=int(pk.bytes), seq=int(pk.seq), phase=pk.phase, op=pk.op, module=pk.module, user_line=pk.user_line,
            allocated=float(pk.allocated) if pk.allocated is not None else np.nan,
            allocated_seq=pk.allocated_seq if pk.allocated_seq is not None else -1,
            reserved=float(pk.reserved) if pk.reserved is not None else np.nan,
            reserved_seq=pk.reserved_seq if pk.reserved_seq is not None else -1,
            judged=float(judged["judged"]) if judged else np.nan,
            headroom=float(judged["headroom"]) if judged else np.nan,
            fits=bool(judged["fits"]) if judged else None,
        )  # fmt: skip
        rows.append(row)
    cols = ["device", *CATEGORIES, "total", "seq", "phase", "op", "module", "user_line", "allocated",
            "allocated_seq", "reserved", "reserved_seq", "judged", "headroom", "fits"]  # fmt: skip
    table = pd.DataFrame(rows, columns=cols)
    if verdict is not None:
        title = verdict["text"]
    elif len(table):
        worst = table.loc[table["total"].idxmax()]
        title = f"peak memory: {worst['device']} peaks at {format_bytes(worst['total'])}"
    else:
        title = "no memory was recorded"
    return BarsData(
        table=table,
        capacity=cap.bytes if cap is not None else None,
        capacity_label=cap.label if cap is not None else None,
        verdict=verdict,
        title=title,
    )


def memory_bars_figure(
    source: Record | BarsData, capacity: str | int | float | None = None, *, full_capacity: bool = False
) -> go.Figure:
    """One stacked bar per device at that device's peak, by category, with capacity and verdict.

    Args:
        source: a trace, or :class:`BarsData` from :func:`bars_data`.
        capacity: see :func:`bars_data` (ignored when ``source`` is BarsData).

    Returns:
        A plotly Figure: stacked bars (raw tensor bytes by category, totals =
        :func:`~fakeviz._analysis.memory.peaks` bytes), on cuda devices markers for the allocator
        model's allocated and reserved peaks, the capacity as a dashed line over
        each accelerator's bar with its headroom, and the verdict as the title.
    """
    go = plotly()
    data = source if isinstance(source, BarsData) else bars_data(source, capacity)
    t = data.table
    devs = [esc(d) for d in t["device"]]
    fig = go.Figure()
    for cat in CATEGORIES:
        ys = t[cat].to_numpy(dtype=np.int64)
        if not ys.any():
            continue
        hover = [
            f"<b>{esc(cat)}</b> on {esc(r['device'])}: {format_bytes(y)} of {format_bytes(r['total'])} at the peak"
            for y, r in zip(ys.tolist(), t.to_dict("records"))
        ]
        fig.add_trace(
            go.Bar(
                x=devs, y=ys.tolist(), name=esc(cat), marker_color=CATEGORY_COLORS[cat], hovertext=hover,
                hoverinfo="text",
            )
        )  # fmt: skip
    # the peak's op, module and line, above each bar
    top_text = [
        f"{format_bytes(r['total'])} at op {r['seq']} ({esc(r['phase'])})<br>{esc(r['op'])}"
        + (f" in {esc(r['module'])}" if isinstance(r["module"], str) else "")
        for r in t.to_dict("records")
    ]
    fig.add_trace(
        go.Scatter(
            x=devs, y=t["total"].tolist(), mode="markers", marker=dict(size=1, color="rgba(0,0,0,0)"),
            name="peak", showlegend=False, hovertext=[
                s + (f"<br>{esc(r['user_line'])}" if isinstance(r["user_line"], str) else "")
                for s, r in zip(top_text, t.to_dict("records"))
            ], hoverinfo="text",
        )
    )  # fmt: skip
    ymax = float(t["total"].max()) if len(t) else 0.0
    cuda = t[t["allocated"].notna()]
    for col, symbol, label in (("allocated", "line-ew", "allocated"), ("reserved", "line-ew-open", "reserved")):
        if cuda.empty:
            continue
        seq_col = f"{col}_seq"
        fig.add_trace(
            go.Scatter(
                x=[esc(d) for d in cuda["device"]], y=cuda[col].tolist(), mode="markers",
                marker=dict(symbol=symbol, size=46,
                            line=dict(width=3, color="#333333" if col == "allocated" else "#7F7F7F")),
                name=f"{label} (allocator model)",
                hovertext=[f"{label} peak {format_bytes(v)} at op {s} (CUDA caching-allocator model)"
                           for v, s in zip(cuda[col].tolist(), cuda[seq_col].tolist())],
                hoverinfo="text",
            )
        )  # fmt: skip
        ymax = max(ymax, float(cuda[col].max()))
    shapes = []
    annotations = []
    if data.capacity is not None:
        ymax = _fit_capacity(ymax, data.capacity, data.capacity_label, full_capacity, annotations, 1.12)
        x_index = {d: i for i, d in enumerate(t["device"])}
        for r in t.to_dict("records"):
            if r["fits"] is None:
                continue  # cpu: not judged against the capacity
            i = x_index[r["device"]]
            shapes.append(
                dict(
                    type="line", xref="x", yref="y", x0=i - 0.45, x1=i + 0.45, y0=data.capacity, y1=data.capacity,
                    line=dict(color="#D62728", width=3, dash="dash"), name=f"capacity {r['device']}",
                )
            )  # fmt: skip
            room = r["headroom"]
            annotations.append(
                dict(
                    x=devs[i], y=min(data.capacity, ymax), yref="y", xref="x", yshift=12, showarrow=False,
                    text=(f"headroom {format_bytes(room)}" if room >= 0 else f"<b>over by {format_bytes(-room)}</b>"),
                    font=dict(color="#2CA02C" if r["fits"] else "#D62728"),
                )
            )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="lines", line=dict(color="#D62728", width=3, dash="dash"),
                name=f"capacity {esc(data.capacity_label)}", hoverinfo="skip",
            )
        )  # fmt: skip
    tickvals, ticktext = byte_ticks(ymax * 1.12)
    sub = "peak live tensor bytes per device, by category"
    if not cuda.empty:
        sub += "; markers: CUDA caching-allocator model"
    fig.update_layout(
        barmode="stack",
        title=dict(text=f"{esc(data.title)}<br><sup>{sub}</sup>"),
        yaxis=dict(title=dict(text="bytes"), tickvals=tickvals, ticktext=ticktext, range=[0, ymax * 1.12 or 1]),
        xaxis=dict(title=dict(text="device"), type="category"),
        shapes=shapes,
        annotations=annotations,
        legend=dict(traceorder="normal"),
        plot_bgcolor="white",
    )
    return fig


def _op_ticks(x: Any) -> dict[str, Any]:
    """Tick settings for an op-seq axis: one tick per op below a dozen ops, plotly's own above."""
    if not len(x):
        return {}
    lo, hi = int(x[0]), int(x[-1])
    if hi - lo < 12:
        return dict(tickmode="linear", tick0=lo, dtick=1, range=[lo - 0.5, hi + 0.5])
    return {}


def _fit_capacity(
    ymax: float, cap: int, label: Any, full: bool, annotations: list[dict[str, Any]], pad: float
) -> float:
    """The y axis top for data up to ``ymax`` and a capacity line at ``cap``.

    The axis fits the data: a capacity far above it (more than ``pad`` times the top) would squash
    the curves into the bottom of the plot, so it is named in a note at the top instead
    (``full=True`` runs the axis up to the capacity).
    """
    if full or cap <= ymax * pad:
        return max(ymax, float(cap))
    annotations.append(
        dict(
            xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="bottom", showarrow=False,
            text=f"capacity {esc(label) if label else format_bytes(cap)} is above the axis ↑",
            font=dict(color="#D62728", size=11), name="capacity-note",
        )
    )  # fmt: skip
    return ymax


# ------------------------------------------------------------------ timeline
def decimate(values: np.ndarray, max_points: int, keep: Iterable[int] = ()) -> np.ndarray:
    """Indices of at most ``max_points`` rows that keep the shape of ``values`` (min-max decimation).

    The same rule the explorer widget uses: :func:`fakeviz._analysis.memory.decimate_minmax`.
    """
    return decimate_minmax(values, max_points, keep)


def timeline_data(trace: Record, device: str | None = None, max_points: int = 4000) -> pd.DataFrame:
    """Live bytes by category on one device after each op, downsampled to at most ``max_points`` rows.

    Args:
        trace: a recorded trace.
        device: the device (default: the accelerator with the highest peak, else the first device).
        max_points: the most rows kept (:func:`decimate` on ``total``: the global
            peak, the first and last op, and on cuda the allocated and reserved
            peaks are always kept).

    Returns:
        A DataFrame of rows of :func:`~fakeviz._analysis.memory.memory_timeline` (``device, seq, phase``,
        one column per category, ``total``, on cuda ``allocated`` and ``reserved``)
        plus ``op``, ``module`` and ``user_line`` of each op, in seq order.

    Raises:
        ValueError: the device has no memory in this trace.
    """
    device = pick_device(trace, device)
    mem = memory_timeline(trace, device=device)
    if mem.empty:
        raise ValueError(f"no memory on {device!r} in this trace; devices: {', '.join(peaks_of(trace))}")
    total = mem["total"].to_numpy()
    keep = [int(np.argmax(mem[c].to_numpy())) for c in ("allocated", "reserved") if c in mem.columns]
    idx = decimate(total, max_points, keep=keep)
    out = mem.iloc[idx].reset_index(drop=True)
    seqs = out["seq"].to_numpy()
    ops = ops_table(trace)
    for col in ("op", "module", "user_line"):
        vals = ops[col].to_numpy(dtype=object)[seqs] if len(ops) else np.zeros(0, object)
        out[col] = [v if isinstance(v, str) else None for v in vals]
    return out


def pick_device(trace: Record, device: str | None) -> str:
    """``device`` if it has memory in ``trace``, else by default the accelerator with the highest peak (the first in
    :func:`~fakeviz._core.devices.device_order` on a tie), else the host device with the highest peak."""
    peaks = peaks_of(trace)
    if device is not None:
        if device not in peaks:
            raise ValueError(f"no memory on {device!r} in this trace; devices: {', '.join(peaks) or 'none'}")
        return device
    if not peaks:
        raise ValueError("no memory was recorded in this trace")
    acc = {d: p.bytes for d, p in peaks.items() if not is_host(d)}
    pool = acc or {d: p.bytes for d, p in peaks.items()}
    return max(device_order(pool), key=lambda d: pool[d])


def phase_runs(trace: Record | np.ndarray) -> pd.DataFrame:
    """Contiguous runs of one phase: ``phase, start, end`` (inclusive op seqs), ``n_ops``.

    Args:
        trace: a record, or its phase codes (indices into :data:`~fakeviz.PHASES`).
    """
    codes = np.asarray(trace.col("phase") if isinstance(trace, Record) else trace).astype(np.int64)
    if len(codes) == 0:
        return pd.DataFrame({"phase": [], "start": [], "end": [], "n_ops": []})
    change = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change - 1, [len(codes) - 1]])
    return pd.DataFrame(
        {"phase": [PHASES[c] for c in codes[starts]], "start": starts, "end": ends, "n_ops": ends - starts + 1}
    )


def _limit_runs(runs: pd.DataFrame, max_runs: int) -> pd.DataFrame:
    """At most ``max_runs`` runs, the longest first, but at least one of every phase present."""
    if len(runs) <= max_runs:
        return runs
    order = runs.sort_values(["n_ops", "start"], ascending=[False, True], kind="stable")
    first_of_phase = order.drop_duplicates("phase")
    rest = order.drop(first_of_phase.index).head(max(0, max_runs - len(first_of_phase)))
    return pd.concat([first_of_phase, rest]).sort_values("start")


def memory_timeline_figure(
    source: Record | pd.DataFrame,
    device: str | None = None,
    max_points: int = 4000,
    *,
    capacity: str | int | float | None = None,
    runs: pd.DataFrame | None = None,
    max_phase_runs: int = 300,
    full_capacity: bool = False,
) -> go.Figure:
    """Live bytes by category against op seq, phases shaded, the peak marked.

    Args:
        source: a trace, or a DataFrame from :func:`timeline_data`.
        device: see :func:`timeline_data` (ignored when ``source`` is a DataFrame).
        max_points: see :func:`timeline_data`.
        capacity: draw the capacity (GPU name, bytes or size) as a line.
        runs: phase runs (:func:`phase_runs`); taken from the trace when ``source`` is one,
            else from the downsampled rows.
        max_phase_runs: the most phase bands drawn (the longest, and one of every phase).
        full_capacity: let the y axis run up to the capacity. By default it fits the data, and a
            capacity above it is named in a note at the top instead of squashing the curves.

    Returns:
        A plotly Figure: stacked areas (one per category, step-shaped), the
        allocator model's allocated and reserved lines on cuda, a star at the
        peak, one shaded band per phase run, hover naming the op, module and line.
    """
    go = plotly()
    if isinstance(source, pd.DataFrame):
        df = source
        if runs is None:
            runs = phase_runs(np.array([PHASES.index(str(p)) for p in df["phase"]], np.int64))
            runs["start"] = df["seq"].to_numpy()[runs["start"].to_numpy()]
            runs["end"] = df["seq"].to_numpy()[runs["end"].to_numpy()]
    else:
        if device is None and not peaks_of(source):
            fig = go.Figure()
            fig.update_layout(title=dict(text="Memory: no memory was recorded"), plot_bgcolor="white")
            return fig
        df = timeline_data(source, device, max_points)
        if runs is None:
            runs = phase_runs(source)
    dev = str(df["device"].iloc[0]) if len(df) else (device or "")
    x = df["seq"].to_numpy()
    fig = go.Figure()
    recs = df.to_dict("records")
    for cat in CATEGORIES:
        ys = df[cat].to_numpy(dtype=np.int64)
        if not ys.any():
            continue
        fig.add_trace(
            go.Scatter(
                x=x, y=ys, name=esc(cat), stackgroup="memory", mode="lines", line=dict(width=0.5, shape="hv",
                color=CATEGORY_COLORS[cat]), fillcolor=CATEGORY_COLORS[cat],
                customdata=[format_bytes(v) for v in ys.tolist()], hovertemplate="%{customdata}",
            )
        )  # fmt: skip
    hover = [
        f"<b>total {format_bytes(r['total'])}</b> after op {r['seq']} ({esc(r['phase'])})<br>{esc(r['op'])}"
        f"<br>module: {esc(r['module']) if r['module'] else 'top level'}<br>{esc(r['user_line'] or 'unknown line')}"
        for r in recs
    ]
    fig.add_trace(
        go.Scatter(
            x=x, y=df["total"].to_numpy(), name="total", mode="lines", line=dict(color="#222222", width=1,
            shape="hv"), customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        )
    )  # fmt: skip
    ymax = float(df["total"].max()) if len(df) else 0.0
    for col, dash in (("allocated", "dot"), ("reserved", "dash")):
        if col in df.columns:
            ys = df[col].to_numpy(dtype=np.float64)
            fig.add_trace(
                go.Scatter(
                    x=x, y=ys, name=f"{col} (allocator model)", mode="lines", line=dict(color="#555555", width=1.5,
                    dash=dash, shape="hv"), customdata=[format_bytes(v) for v in ys.tolist()],
                    hovertemplate="%{customdata}",
                )
            )  # fmt: skip
            ymax = max(ymax, float(np.nanmax(ys)) if len(ys) else 0.0)
    annotations = []
    if len(df):
        i = int(np.argmax(df["total"].to_numpy()))
        r = recs[i]
        text = f"peak {format_bytes(r['total'])} at op {r['seq']}<br>{esc(r['op'])}"
        if r["module"]:
            text += f" in {esc(r['module'])}"
        fig.add_trace(
            go.Scatter(
                x=[r["seq"]], y=[r["total"]], mode="markers", name="peak", marker=dict(symbol="star", size=14,
                color="#D62728", line=dict(color="white", width=1)), customdata=[hover[i]],
                hovertemplate="<b>peak</b><br>%{customdata}<extra></extra>",
            )
        )  # fmt: skip
        annotations.append(
            dict(x=r["seq"], y=r["total"], text=text, showarrow=True, arrowhead=2, ax=40, ay=-40, font=dict(size=11))
        )
    shapes = []
    span = float(x[-1] - x[0] + 1) if len(x) else 1.0
    for run in _limit_runs(runs, max_phase_runs).to_dict("records"):
        shape = dict(
            type="rect", xref="x", yref="paper", x0=run["start"] - 0.5, x1=run["end"] + 0.5, y0=0, y1=1,
            fillcolor=PHASE_COLORS.get(run["phase"], NONE_COLOR), opacity=0.12, line=dict(width=0), layer="below",
            name=str(run["phase"]),
        )  # fmt: skip
        if run["n_ops"] >= 0.04 * span:
            shape["label"] = dict(text=esc(run["phase"]), textposition="top center", font=dict(size=11))
        shapes.append(shape)
    # generation steps (Note: [KV cache storages]): a dotted line where prefill and each decode step begin
    steps = (source.meta.get("steps") or []) if isinstance(source, Record) else []
    every = max(1, len(steps) // 12)  # label at most about a dozen
    for k, (start, _stop, label) in enumerate(steps):
        shape = dict(
            type="line", xref="x", yref="paper", x0=start - 0.5, x1=start - 0.5, y0=0, y1=1, name=str(label),
            line=dict(color="#555555", width=1, dash="dot"), layer="below",
        )  # fmt: skip
        if k % every == 0:
            shape["label"] = dict(text=esc(label), textposition="end", textangle=-90, font=dict(size=10))
        shapes.append(shape)
    if capacity is not None:
        spec = Capacity.parse(capacity)
        cap = spec.bytes
        ymax = _fit_capacity(ymax, cap, spec.label, full_capacity, annotations, 1.1)
        shapes.append(
            dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=cap, y1=cap, name="capacity",
                 line=dict(color="#D62728", width=2, dash="dash"),
                 label=dict(text=esc(f"capacity {spec.label}"), textposition="end"))
        )  # fmt: skip
    tickvals, ticktext = byte_ticks(ymax * 1.1)
    n_rows = len(df)
    title = f"Memory on {esc(dev)}"
    if n_rows and len(x) and n_rows < int(x[-1] - x[0] + 1):
        title += f"<br><sup>{n_rows} of {int(x[-1] - x[0] + 1)} ops drawn (min-max decimation keeps the peak)</sup>"
    fig.update_layout(
        title=dict(text=title),
        hovermode="x unified",
        # whole op numbers only; a handful of ops gets one tick per op (a one-op run: one tick, "0")
        xaxis=dict(title=dict(text="op seq"), tickformat="d", **_op_ticks(x)),
        yaxis=dict(title=dict(text="live bytes"), tickvals=tickvals, ticktext=ticktext, range=[0, ymax * 1.1 or 1]),
        shapes=shapes,
        annotations=annotations,
        plot_bgcolor="white",
    )
    return fig
