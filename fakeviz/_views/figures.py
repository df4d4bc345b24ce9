"""Views: plotly figures of a trace's analysis, usable on their own.

Every view is a pure function of a :class:`~fakeviz.Trace` (or of the data
built from it) that returns a :class:`plotly.graph_objects.Figure`; the data
each figure draws comes from a separate pure function, so it can be checked
or reused without plotly:

=====================  ==========================  ==============================================
figure                 data                        shows
=====================  ==========================  ==============================================
:func:`layer_tree`     :func:`tree_data`           icicle of the module hierarchy, sized by a
                                                   measure, repeated blocks folded
:func:`memory_bars`    :func:`bars_data`           per device, the peak split by category, with
                                                   capacity, headroom and the verdict
:func:`memory_timeline` :func:`timeline_data`,     live bytes by category against op seq, phases
                       :func:`phase_runs`          shaded, the peak marked
:func:`alias_graph`    :func:`alias_graph_data`    storages, the tensors viewing them, names,
                                                   tied weights and in-place writes
:func:`ops_table_figure` :func:`ops_table`         the op log, filtered
=====================  ==========================  ==============================================

Only NumPy, pandas and plotly are used (plotly imported inside the figure
functions). All text taken from the trace (module paths and classes, op
names, user lines, parameter names) is HTML-escaped before it reaches the
figure: plotly renders a subset of HTML in titles, labels, hover text,
annotations and table cells, and a module class named
``<script>alert(1)</script>`` must show as text. User text never goes into a
``hovertemplate`` (where ``%{...}`` would be interpreted), only into
``hovertext`` / ``customdata`` values.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._analysis.tree import FIGURES
from .._core.fmt import esc, format_bytes, format_count, format_flops
from .._core.gpus import GPUS, parse_capacity
from .._core.palette import CATEGORY_COLORS, PHASE_COLORS
from .._core.palette import EDGE_COLORS as _EDGE_COLORS
from .._core.palette import NONE_COLOR as _NONE_COLOR
from .._core.palette import PALETTE as _PALETTE
from .._core.schema import CATEGORIES, PHASES

if TYPE_CHECKING:  # pragma: no cover - typing only
    import plotly.graph_objects as go

    from .._core.record import Record as Trace

__all__ = [
    "CATEGORY_COLORS",
    "MEASURES",
    "PHASE_COLORS",
    "BarsData",
    "GraphData",
    "TreeData",
    "alias_graph",
    "alias_graph_data",
    "bars_data",
    "decimate",
    "esc",
    "format_bytes",
    "format_count",
    "format_flops",
    "layer_tree",
    "memory_bars",
    "memory_timeline",
    "ops_table",
    "ops_table_figure",
    "phase_runs",
    "timeline_data",
    "tree_data",
]

#: Measures :func:`layer_tree` can size boxes by: every figure of the layer tree, plus
#: ``flops`` (forward + backward FLOPs) and ``ops`` (forward + backward op count).
MEASURES: tuple[str, ...] = (*FIGURES, "flops", "ops")
_BYTE_FIGURES = {"param_bytes", "buffer_bytes", "act_bytes", "act_saved_bytes", "grad_bytes", "opt_bytes"}
_FLOP_FIGURES = {"flops_fwd", "flops_bwd", "flops"}


# ------------------------------------------------------------------ formatting
def _format_measure(measure: str, value: float) -> str:
    if measure in _BYTE_FIGURES:
        return format_bytes(value)
    if measure in _FLOP_FIGURES:
        return format_flops(value)
    return format_count(value)


def _byte_ticks(top: float, n: int = 6) -> tuple[list[float], list[str]]:
    """Tick values at round binary sizes from 0 to ``top``, and their labels."""
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


def _color_map(keys: Iterable[str], none_key: str | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in keys:
        if k in out:
            continue
        out[k] = _NONE_COLOR if k == none_key else _PALETTE[len([x for x in out if x != none_key]) % len(_PALETTE)]
    return out


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _is_trace(x: Any) -> bool:
    return hasattr(x, "peak") and hasattr(x, "memory") and hasattr(x, "col")


# ------------------------------------------------------------------ layer tree
@dataclass
class TreeData:
    """Rows of the layer-tree figure (see :func:`tree_data`).

    ``table`` has one row per (folded) module: ``id`` and ``parent_id`` (the
    module's path and its parent's, ``""`` for the root), ``label``, ``path``,
    ``class``, ``count``, ``odd``, every figure of the layer tree, ``measure``
    (the true figure), ``value`` (what the box is sized by: the measure, raised
    to the sum of its children where tied weights make the children add up to
    more than the parent), ``inflated``, ``color_key``, ``color`` and ``hover``
    (escaped HTML). Paths and labels are raw text; the figure escapes them.
    """

    table: pd.DataFrame
    measure: str
    color: str
    folded: bool
    colors: dict[str, str] = field(default_factory=dict)


def _param_split(trace: Trace, table: pd.DataFrame, folded: bool) -> pd.DataFrame:
    """``param_bytes:<device>:<dtype>`` columns for the rows of ``table`` (summed over fold members)."""
    mods = trace.modules
    cols = [c for c in mods.columns if str(c).startswith("param_bytes:")]
    if not folded:
        return mods[cols].reset_index(drop=True)
    mat = mods[cols].to_numpy(dtype=np.int64)
    index = {p: i for i, p in enumerate(mods["path"].tolist())}
    out = np.zeros((len(table), len(cols)), np.int64)
    for r, members in enumerate(table["members"].tolist()):
        rows = [index[m] for m in str(members).split("|") if m in index]
        if rows:
            out[r] = mat[rows].sum(axis=0)
    return pd.DataFrame(out, columns=cols)


def _color_keys(split: pd.DataFrame, classes: list[str], color: str) -> list[str]:
    if color == "class":
        return [c if c else "(no class)" for c in classes]
    if split.shape[1] == 0:
        return ["no parameters"] * len(split)
    groups: dict[str, list[int]] = {}
    for j, col in enumerate(split.columns):
        dev, dt = str(col)[len("param_bytes:") :].rsplit(":", 1)
        groups.setdefault(dev if color == "device" else dt, []).append(j)
    keys = list(groups)
    mat = split.to_numpy()
    sums = np.stack([mat[:, idx].sum(axis=1) for idx in groups.values()], axis=1)
    best = sums.argmax(axis=1)
    has = sums.max(axis=1) > 0
    return [keys[b] if h else "no parameters" for b, h in zip(best.tolist(), has.tolist())]


def _tree_hover(row: dict[str, Any], measure: str, split_cols: list[str], split_row: np.ndarray) -> str:
    lines = [f"<b>{esc(row['path'])}</b>", f"class: {esc(row['class'])}"]
    if row["count"] > 1:
        lines.append(f"folded: {row['count']} modules ({esc(row['label'])})")
    if row["odd"]:
        lines.append("<b>odd one out</b>: its structure differs from its numbered siblings")
    lines.append(f"<b>{measure}: {_format_measure(measure, row['measure'])}</b>")
    if row["inflated"]:
        lines.append(f"(box sized {_format_measure(measure, row['value'])}: its children share tied weights)")
    lines += [
        f"params: {format_count(row['params'])} ({format_bytes(row['param_bytes'])})",
        f"buffers: {format_bytes(row['buffer_bytes'])}",
        f"activations made: {format_bytes(row['act_bytes'])}, saved for backward: "
        f"{format_bytes(row['act_saved_bytes'])}",
        f"gradients: {format_bytes(row['grad_bytes'])}, optimizer state: {format_bytes(row['opt_bytes'])}",
        f"FLOPs: forward {format_flops(row['flops_fwd'])}, backward {format_flops(row['flops_bwd'])}",
        f"ops: forward {format_count(row['ops_fwd'])}, backward {format_count(row['ops_bwd'])}"
        + (f", {row['unknown_flop_ops']} without a FLOP formula" if row["unknown_flop_ops"] else ""),
    ]
    if row.get("tied"):
        lines.append("holds tied weights" + (f" (also {esc(row['tied_with'])})" if row.get("tied_with") else ""))
    parts = [f"{esc(c[len('param_bytes:') :])} {format_bytes(v)}" for c, v in zip(split_cols, split_row.tolist()) if v]
    if parts:
        lines.append("parameter bytes: " + ", ".join(parts))
    return "<br>".join(lines)


def tree_data(trace: Trace, measure: str = "params", color: str = "device", folded: bool = True) -> TreeData:
    """The rows of the layer-tree figure: one per (folded) module, sized by ``measure``.

    Args:
        trace: a recorded trace.
        measure: one of :data:`MEASURES` (``"params"``, ``"param_bytes"``,
            ``"act_bytes"``, ``"flops"`` = forward + backward FLOPs, ...).
        color: ``"device"`` or ``"dtype"`` (the one holding most of the module's
            parameter bytes) or ``"class"``.
        folded: fold repeated numbered blocks (``trace.folded_modules()``:
            ``layers.0-79 x80``, figures summed over the members).

    Returns:
        A :class:`TreeData`. Figures are inclusive, so a parent's ``value`` is
        at least the sum of its children's (plotly's ``branchvalues="total"``
        draws nothing otherwise); only tied weights, counted once in a parent
        but once in each child holding them, make a ``value`` larger than its
        ``measure`` (flagged ``inflated``). With several root modules a
        synthetic root ``"(all modules)"`` holds them.

    Raises:
        ValueError: unknown ``measure`` or ``color``.
    """
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; use one of {', '.join(MEASURES)}")
    if color not in ("device", "dtype", "class"):
        raise ValueError(f"unknown color {color!r}; use 'device', 'dtype' or 'class'")
    src = trace.folded_modules() if folded else trace.modules
    table = src.reset_index(drop=True).copy()
    if table.empty:  # no module was seen (plain tensor code)
        cols = ["id", "parent_id", "label", "path", "class", "depth", "count", "odd", *FIGURES, "measure", "value",
                "inflated", "color_key", "color", "hover"]  # fmt: skip
        return TreeData(table=pd.DataFrame(columns=cols), measure=measure, color=color, folded=folded)
    if not folded:
        table["count"] = 1
        table["odd"] = False
        table["members"] = table["path"]
    split = _param_split(trace, table, folded)
    split_cols = list(split.columns)
    for k in FIGURES:
        table[k] = table[k].astype(np.int64)
    if measure == "flops":
        meas = table["flops_fwd"] + table["flops_bwd"]
    elif measure == "ops":
        meas = table["ops_fwd"] + table["ops_bwd"]
    else:
        meas = table[measure]
    table["measure"] = meas.astype(np.int64)
    table["label"] = table["name"].astype(str)
    table["id"] = table["path"].astype(str)
    table["parent_id"] = [p if isinstance(p, str) else "" for p in table["parent"].tolist()]
    if "tied_with" not in table.columns:
        table["tied_with"] = ""
    table["class"] = table["class"].fillna("").astype(str)
    split_mat = split.to_numpy()

    roots = [i for i, p in enumerate(table["parent_id"].tolist()) if p == ""]
    if len(roots) > 1:
        root_id = "(all modules)"
        while root_id in set(table["id"]):
            root_id += " "
        row: dict[str, Any] = {k: int(table[k].iloc[roots].sum()) for k in (*FIGURES, "measure")}
        row.update(
            id=root_id, parent_id="", label=root_id, path=root_id, name=root_id, parent=None, depth=-1,
            count=1, odd=False, members="", tied=bool(table.get("tied", pd.Series([False])).any()), tied_with="",
        )  # fmt: skip
        row["class"] = ""
        table["parent_id"] = [root_id if i in roots else p for i, p in enumerate(table["parent_id"].tolist())]
        table = pd.concat([pd.DataFrame([row]), table], ignore_index=True)
        split_mat = np.vstack([split_mat.sum(axis=0, keepdims=True), split_mat]) if split_cols else split_mat
        split = pd.DataFrame(split_mat, columns=split_cols)

    # sizes: raise a parent to the sum of its children where tied weights make them exceed it.
    # plotly sums children left to right in data order in float64: do exactly that.
    ids = table["id"].tolist()
    pos = {k: i for i, k in enumerate(ids)}
    kids: list[list[int]] = [[] for _ in ids]
    for i, p in enumerate(table["parent_id"].tolist()):
        if p in pos:
            kids[pos[p]].append(i)
    value = table["measure"].astype(np.float64).to_numpy().copy()
    parent_of = [pos.get(p, -1) for p in table["parent_id"].tolist()]
    level = np.zeros(len(ids), np.int64)
    for i in range(len(ids)):
        j, d = parent_of[i], 0
        while j >= 0 and d <= len(ids):
            j, d = parent_of[j], d + 1
        level[i] = d
    for i in sorted(range(len(ids)), key=lambda i: -level[i]):  # deepest first
        if kids[i]:
            s = 0.0
            for k in kids[i]:
                s = s + float(value[k])
            if value[i] < s:
                value[i] = s
    table["value"] = value
    table["inflated"] = value > table["measure"].to_numpy(dtype=np.float64)

    keys = _color_keys(split, table["class"].tolist(), color)
    table["color_key"] = keys
    cmap = _color_map(keys, none_key="no parameters")
    table["color"] = [cmap[k] for k in keys]
    records = table.to_dict("records")
    table["hover"] = [
        _tree_hover(r, measure, split_cols, split_mat[i] if split_cols else np.zeros(0)) for i, r in enumerate(records)
    ]
    return TreeData(table=table, measure=measure, color=color, folded=folded, colors=cmap)


def layer_tree(
    source: Trace | TreeData,
    measure: str = "params",
    color: str = "device",
    folded: bool = True,
    *,
    kind: str = "icicle",
    max_depth: int | None = 4,
) -> go.Figure:
    """Icicle (or treemap) of the module hierarchy sized by ``measure``; click a box to drill down.

    Args:
        source: a trace, or :class:`TreeData` from :func:`tree_data`.
        measure: see :func:`tree_data` (ignored when ``source`` is TreeData).
        color: ``"device"``, ``"dtype"`` or ``"class"`` (see :func:`tree_data`).
        folded: fold repeated blocks (see :func:`tree_data`).
        kind: ``"icicle"`` or ``"treemap"``.
        max_depth: levels shown at once (``None``: all); deeper ones appear on drill-down.

    Returns:
        A plotly Figure: the icicle (``branchvalues="total"``, hover with every
        figure of the module), and one legend entry per colour.
    """
    go = _go()
    data = source if isinstance(source, TreeData) else tree_data(source, measure, color, folded)
    t = data.table
    if kind not in ("icicle", "treemap"):
        raise ValueError(f"unknown kind {kind!r}; use 'icicle' or 'treemap'")
    common = dict(
        ids=[esc(x) for x in t["id"]],
        parents=[esc(x) for x in t["parent_id"]],
        labels=[("⚠ " if o else "") + esc(x) for x, o in zip(t["label"], t["odd"])],
        values=t["value"].astype(float).tolist(),
        branchvalues="total",
        text=[_format_measure(data.measure, v) for v in t["measure"].tolist()],
        textinfo="label+text",
        hovertext=t["hover"].tolist(),
        hoverinfo="text",
        marker=dict(
            colors=t["color"].tolist(),
            line=dict(color=["#D62728" if o else "#FFFFFF" for o in t["odd"]], width=[3 if o else 1 for o in t["odd"]]),
        ),
        maxdepth=max_depth if max_depth is not None else -1,
        sort=False,
        name=esc(data.measure),
    )
    trace_ = go.Icicle(**common) if kind == "icicle" else go.Treemap(**common)
    fig = go.Figure(trace_)
    for key, col in data.colors.items():  # legend for the colours
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", marker=dict(size=12, color=col, symbol="square"),
                name=esc(key), showlegend=True, hoverinfo="skip",
            )
        )  # fmt: skip
    root = t.iloc[0] if len(t) else None
    total = _format_measure(data.measure, root["measure"]) if root is not None else "0"
    title = f"Layer tree by {esc(data.measure)} ({total}), colour: {esc(data.color)}"
    if data.folded:
        title += ", repeated blocks folded"
    if root is None:
        title += "<br><sup>nothing to draw: no module was seen in this trace</sup>"
    elif not root["value"]:
        title += "<br><sup>nothing to draw: the measure is 0 everywhere</sup>"
    fig.update_layout(
        title=dict(text=title),
        xaxis=dict(visible=False),
        yaxis=dict(visible=False),
        plot_bgcolor="white",
        margin=dict(t=60, l=10, r=10, b=10),
        legend=dict(title=dict(text=esc(data.color))),
    )
    return fig


# ------------------------------------------------------------------ memory bars
@dataclass
class BarsData:
    """Rows of the peak-memory bars (see :func:`bars_data`).

    ``table``: one row per device with the peak's bytes per category (one
    column per :data:`~fakeviz.CATEGORIES`), ``total`` (= ``trace.peak()[dev].bytes``),
    ``seq``, ``phase``, ``op``, ``module``, ``user_line``, ``allocated`` and
    ``reserved`` (caching-allocator model peaks, cuda only, else NaN),
    ``judged`` (what the verdict compares with the capacity: the reserved peak
    on cuda, raw bytes elsewhere; NaN on cpu), ``headroom`` and ``fits``.
    ``title`` is plain text (the verdict when a capacity is given).
    """

    table: pd.DataFrame
    capacity: int | None = None
    capacity_label: str | None = None
    verdict: dict[str, Any] | None = None
    title: str = ""


def _capacity_label(capacity: str | int | float, nbytes: int) -> str:
    if isinstance(capacity, str):
        norm = re.sub(r"[\s_\-]+", " ", capacity.strip().upper())
        for name in GPUS:
            if re.sub(r"[\s_\-]+", " ", name.upper()) == norm:
                return f"{name} ({format_bytes(nbytes)})"
    return format_bytes(nbytes)


def _device_order(devices: Iterable[str]) -> list[str]:
    def key(d: str) -> tuple[int, str, int]:
        kind, _, idx = d.partition(":")
        return (1 if kind in ("cpu", "meta") else 0, kind, int(idx) if idx.isdigit() else -1)

    return sorted(devices, key=key)


def bars_data(trace: Trace, capacity: str | int | float | None = None) -> BarsData:
    """Per device, the memory at that device's peak, split by category, and the verdict.

    Args:
        trace: a recorded trace.
        capacity: a GPU name from :data:`fakeviz._gpus.GPUS` (``"H100"``,
            ``"A100 80GB"``, ``"MI300X"``), bytes, or a size (``"80GB"``); ``None``
            uses the capacity the trace was recorded with, if any.

    Returns:
        A :class:`BarsData`; each row's categories add up to its ``total``,
        which is ``trace.peak()[device].bytes``.
    """
    if capacity is None:
        capacity = trace.meta.get("capacity") or None
    peaks = trace.peak()
    rows = []
    verdict = trace.verdict(capacity) if capacity is not None and peaks else None
    cap = parse_capacity(capacity) if capacity is not None else None
    for dev in _device_order(peaks):
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
            judged=float(judged["peak"]) if judged else np.nan,
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
        capacity=cap,
        capacity_label=_capacity_label(capacity, cap) if cap is not None else None,
        verdict=verdict,
        title=title,
    )


def memory_bars(source: Trace | BarsData, capacity: str | int | float | None = None) -> go.Figure:
    """One stacked bar per device at that device's peak, by category, with capacity and verdict.

    Args:
        source: a trace, or :class:`BarsData` from :func:`bars_data`.
        capacity: see :func:`bars_data` (ignored when ``source`` is BarsData).

    Returns:
        A plotly Figure: stacked bars (raw tensor bytes by category, totals =
        ``trace.peak()`` bytes), on cuda devices markers for the allocator
        model's allocated and reserved peaks, the capacity as a dashed line over
        each accelerator's bar with its headroom, and the verdict as the title.
    """
    go = _go()
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
                marker=dict(symbol=symbol, size=46, line=dict(width=3, color="#333333" if col == "allocated" else "#7F7F7F")),
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
        ymax = max(ymax, float(data.capacity))
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
                    x=devs[i], y=data.capacity, yref="y", xref="x", yshift=12, showarrow=False,
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
    tickvals, ticktext = _byte_ticks(ymax * 1.08)
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


# ------------------------------------------------------------------ timeline
def decimate(values: np.ndarray, max_points: int, keep: Iterable[int] = ()) -> np.ndarray:
    """Indices of at most ``max_points`` rows that keep the shape of ``values`` (min-max decimation).

    The same rule the explorer widget uses: :func:`fakeviz._memory.decimate_minmax`.
    """
    from .._analysis.memory import decimate_minmax

    return decimate_minmax(values, max_points, keep)


def timeline_data(trace: Trace, device: str | None = None, max_points: int = 4000) -> pd.DataFrame:
    """Live bytes by category on one device after each op, downsampled to at most ``max_points`` rows.

    Args:
        trace: a recorded trace.
        device: the device (default: the accelerator with the highest peak, else the first device).
        max_points: the most rows kept (:func:`decimate` on ``total``: the global
            peak, the first and last op, and on cuda the allocated and reserved
            peaks are always kept).

    Returns:
        A DataFrame of rows of ``trace.memory(device=...)`` (``device, seq, phase``,
        one column per category, ``total``, on cuda ``allocated`` and ``reserved``)
        plus ``op``, ``module`` and ``user_line`` of each op, in seq order.

    Raises:
        ValueError: the device has no memory in this trace.
    """
    device = _pick_device(trace, device)
    mem = trace.memory(device=device)
    if mem.empty:
        raise ValueError(f"no memory on {device!r} in this trace; devices: {', '.join(trace.peak())}")
    total = mem["total"].to_numpy()
    keep = [int(np.argmax(mem[c].to_numpy())) for c in ("allocated", "reserved") if c in mem.columns]
    idx = decimate(total, max_points, keep=keep)
    out = mem.iloc[idx].reset_index(drop=True)
    seqs = out["seq"].to_numpy()
    ops = trace.ops
    for col in ("op", "module", "user_line"):
        vals = ops[col].to_numpy(dtype=object)[seqs] if len(ops) else np.zeros(0, object)
        out[col] = [v if isinstance(v, str) else None for v in vals]
    return out


def _pick_device(trace: Trace, device: str | None) -> str:
    peaks = trace.peak()
    if device is not None:
        if device not in peaks:
            raise ValueError(f"no memory on {device!r} in this trace; devices: {', '.join(peaks) or 'none'}")
        return device
    if not peaks:
        raise ValueError("no memory was recorded in this trace")
    acc = {d: p.bytes for d, p in peaks.items() if not d.startswith(("cpu", "meta"))}
    pool = acc or {d: p.bytes for d, p in peaks.items()}
    return max(_device_order(pool), key=lambda d: pool[d])


def phase_runs(trace: Trace | np.ndarray) -> pd.DataFrame:
    """Contiguous runs of one phase: ``phase, start, end`` (inclusive op seqs), ``n_ops``.

    Args:
        trace: a trace, or its phase codes (indices into :data:`~fakeviz.PHASES`).
    """
    codes = np.asarray(trace.col("phase") if _is_trace(trace) else trace).astype(np.int64)
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


def memory_timeline(
    source: Trace | pd.DataFrame,
    device: str | None = None,
    max_points: int = 4000,
    *,
    capacity: str | int | float | None = None,
    runs: pd.DataFrame | None = None,
    max_phase_runs: int = 300,
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

    Returns:
        A plotly Figure: stacked areas (one per category, step-shaped), the
        allocator model's allocated and reserved lines on cuda, a star at the
        peak, one shaded band per phase run, hover naming the op, module and line.
    """
    go = _go()
    if isinstance(source, pd.DataFrame):
        df = source
        if runs is None:
            runs = phase_runs(np.array([PHASES.index(str(p)) for p in df["phase"]], np.int64))
            runs["start"] = df["seq"].to_numpy()[runs["start"].to_numpy()]
            runs["end"] = df["seq"].to_numpy()[runs["end"].to_numpy()]
    else:
        if device is None and not source.peak():
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
            fillcolor=PHASE_COLORS.get(run["phase"], _NONE_COLOR), opacity=0.12, line=dict(width=0), layer="below",
            name=str(run["phase"]),
        )  # fmt: skip
        if run["n_ops"] >= 0.04 * span:
            shape["label"] = dict(text=esc(run["phase"]), textposition="top center", font=dict(size=11))
        shapes.append(shape)
    if capacity is not None:
        cap = parse_capacity(capacity)
        ymax = max(ymax, float(cap))
        shapes.append(
            dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=cap, y1=cap, name="capacity",
                 line=dict(color="#D62728", width=2, dash="dash"),
                 label=dict(text=esc(f"capacity {_capacity_label(capacity, cap)}"), textposition="end"))
        )  # fmt: skip
    tickvals, ticktext = _byte_ticks(ymax * 1.08)
    n_rows = len(df)
    title = f"Memory on {esc(dev)}"
    if n_rows and len(x) and n_rows < int(x[-1] - x[0] + 1):
        title += f"<br><sup>{n_rows} of {int(x[-1] - x[0] + 1)} ops drawn (min-max decimation keeps the peak)</sup>"
    fig.update_layout(
        title=dict(text=title),
        hovermode="x unified",
        xaxis=dict(title=dict(text="op seq")),
        yaxis=dict(title=dict(text="live bytes"), tickvals=tickvals, ticktext=ticktext, range=[0, ymax * 1.1 or 1]),
        shapes=shapes,
        annotations=annotations,
        plot_bgcolor="white",
    )
    return fig


# ------------------------------------------------------------------ alias graph
@dataclass
class GraphData:
    """The aliasing graph with a layout (see :func:`alias_graph_data`).

    ``nodes``: the columns of ``trace.alias_graph`` (id, kind, ref, label,
    nbytes, category, names, writes) plus ``x``, ``y``, ``depth`` (view depth of
    a tensor: 0 for a tensor that views no other shown tensor) and ``tied``.
    ``edges``: src, dst, kind (storage/view/write/name/tied), op, seq, between
    shown nodes. ``total`` is the number of storages and tensors that matched
    (before bounding) and ``dropped`` how many nodes are not shown.
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    total: int = 0
    dropped: int = 0
    around: Any = None


def _graph_candidates(trace: Trace, around: Any) -> int:
    """Number of storages and tensors the graph would have without a bound."""
    tt = trace.tensors
    if around is not None:
        if isinstance(around, tuple) and around and around[0] == "storage":
            sids = {int(around[1])}
        else:
            sids = set(trace.aliases(around).storage.tolist())
        tt = tt[tt.storage.isin(sids)]
    tt = tt[tt.storage >= 0]
    return int(len(tt) + tt.storage.nunique())


def alias_graph_data(trace: Trace, around: Any = None, max_nodes: int = 200) -> GraphData:
    """Storages, tensors and parameter names from ``trace.alias_graph``, bounded and laid out.

    Args:
        trace: a recorded trace.
        around: restrict to the storage of one tensor and what aliases it (a
            ``$N`` id, a parameter name such as ``"lm_head.weight"``, or
            ``("storage", id)``); ``None`` for the whole run.
        max_nodes: the most nodes shown (storages, tensors and names together).
            Names of untied parameters are folded into their tensor's hover
            first, then tied names, then the least important tensors go.

    Returns:
        A :class:`GraphData`. Layout (deterministic): storages in a column at
        ``x = 0`` in id order, each with a block of rows; the tensors on it at
        ``x = 1 + view depth``; parameter names at ``x = -1`` beside their tensor.

    Raises:
        ValueError: ``max_nodes`` < 2.
    """
    if max_nodes < 2:
        raise ValueError("max_nodes must be at least 2")
    # trace.alias_graph bounds storages + tensors; names come on top. Ask again for fewer
    # tensors until everything fits (names are what tells a parameter apart).
    request = max_nodes
    for _ in range(8):
        nodes, edges = trace.alias_graph(around, max_nodes=request)
        tied_names = set(edges.loc[edges["kind"] == "tied", "src"])
        excess = len(nodes) - max_nodes
        if excess <= 0 or request <= 2:
            break
        request = max(2, request - excess)
    total = _graph_candidates(trace, around)
    nodes = nodes.copy()
    nodes["names"] = nodes["names"].fillna("").astype(str)
    nodes["tied"] = [k != "storage" and "|" in n for k, n in zip(nodes["kind"], nodes["names"])]
    if len(nodes) > max_nodes:  # untied names go first (they stay in their tensor's hover)
        core = (nodes["kind"] != "name") | nodes["id"].isin(tied_names)
        room = max(0, max_nodes - int(core.sum()))
        extra = nodes.index[~core][:room]
        nodes = nodes[core | nodes.index.isin(extra)]
    if len(nodes) > max_nodes:
        nodes = nodes[nodes["kind"] != "name"]
    if len(nodes) > max_nodes:  # keep tensors by priority with their storages
        tens = nodes[nodes["kind"] == "tensor"]
        prio = (tens["names"] != "").astype(int) * 4 + (tens["writes"] > 0).astype(int) * 2
        tens = tens.assign(_p=prio).sort_values(["_p", "ref"], ascending=[False, True], kind="stable")
        storage_of = dict(
            zip(edges.loc[edges["kind"] == "storage", "src"], edges.loc[edges["kind"] == "storage", "dst"])
        )
        keep: set[str] = set()
        for tid in tens["id"].tolist():
            need = {tid, storage_of.get(tid, "")} - keep - {""}
            if len(keep) + len(need) > max_nodes:
                break
            keep |= need
        nodes = nodes[nodes["id"].isin(keep)]
    nodes = nodes.reset_index(drop=True)
    present = set(nodes["id"])
    edges = edges[edges["src"].isin(present) & edges["dst"].isin(present)].reset_index(drop=True)

    # ---- layout
    base = {d: s for s, d in zip(edges.loc[edges["kind"] == "view", "src"], edges.loc[edges["kind"] == "view", "dst"])}
    depth: dict[str, int] = {}

    def depth_of(t: str) -> int:
        if t in depth:
            return depth[t]
        chain = []
        cur = t
        while cur in base and cur not in depth and len(chain) <= len(base):
            chain.append(cur)
            cur = base[cur]
        d = depth.setdefault(cur, 0)
        for c in reversed(chain):
            if c != cur:
                d += 1
                depth[c] = d
        return depth[t]

    storage_edges = edges[edges["kind"] == "storage"]
    tensors_of: dict[str, list[str]] = {}
    for src, dst in zip(storage_edges["src"], storage_edges["dst"]):
        tensors_of.setdefault(dst, []).append(src)
    name_edges = edges[edges["kind"].isin(["name", "tied"])]
    names_of: dict[str, list[str]] = {}
    for src, dst in zip(name_edges["src"], name_edges["dst"]):
        names_of.setdefault(dst, []).append(src)
    ref = dict(zip(nodes["id"], nodes["ref"]))
    xs: dict[str, float] = {}
    ys: dict[str, float] = {}
    row = 0.0
    storages = nodes[nodes["kind"] == "storage"].sort_values("ref", kind="stable")["id"].tolist()
    for sid in storages:
        ts = sorted(tensors_of.get(sid, []), key=lambda t: (depth_of(t), ref[t]))
        by_depth: dict[int, int] = {}
        name_row = 0
        for t in ts:
            d = depth_of(t)
            k = by_depth.get(d, 0)
            by_depth[d] = k + 1
            xs[t], ys[t] = 1.0 + d, -(row + k)
            for n in sorted(names_of.get(t, [])):
                name_row = max(name_row, k)
                xs[n], ys[n] = -1.0, -(row + name_row)
                name_row += 1
        height = max([1, name_row, *by_depth.values()])
        xs[sid], ys[sid] = 0.0, -(row + (height - 1) / 2)
        row += height + 1
    for nid in nodes["id"]:  # anything left (a name whose tensor was dropped): below
        if nid not in xs:
            xs[nid], ys[nid] = -1.0, -row
            row += 1
    nodes["x"] = [xs[i] for i in nodes["id"]]
    nodes["y"] = [ys[i] for i in nodes["id"]]
    nodes["depth"] = [depth_of(i) if k == "tensor" else -1 for i, k in zip(nodes["id"], nodes["kind"])]
    return GraphData(nodes=nodes, edges=edges, total=total, dropped=max(0, total - int((nodes["kind"] != "name").sum())),
                     around=around)  # fmt: skip


def _node_hover(r: dict[str, Any]) -> str:
    nb = r.get("nbytes")
    size = format_bytes(nb) if nb is not None and not (isinstance(nb, float) and np.isnan(nb)) else "?"
    if r["kind"] == "storage":
        lines = [f"<b>{esc(r['label'])}</b>", f"{size}, {esc(r['category'])}"]
        if r["names"]:
            lines.append("holds " + esc(r["names"]).replace("|", ", "))
    elif r["kind"] == "tensor":
        lines = [f"<b>{esc(r['label'])}</b>", f"{size}"]
        if r["names"]:
            lines.append(("tied: " if r["tied"] else "name: ") + esc(r["names"]).replace("|", ", "))
        if r["writes"]:
            lines.append(f"written in place {int(r['writes'])} time(s)")
        if r["depth"] > 0:
            lines.append(f"view depth {r['depth']}")
    else:
        lines = [f"<b>{esc(r['label'])}</b>", "parameter/buffer name" + (" (tied)" if r.get("is_tied") else "")]
    return "<br>".join(lines)


def alias_graph(source: Trace | GraphData, around: Any = None, max_nodes: int = 200) -> go.Figure:
    """Storages and the tensors that view them, tied parameters and in-place writes highlighted.

    Args:
        source: a trace, or :class:`GraphData` from :func:`alias_graph_data`.
        around: see :func:`alias_graph_data` (ignored when ``source`` is GraphData).
        max_nodes: see :func:`alias_graph_data`.

    Returns:
        A plotly Figure: edges by kind (storage grey, view blue, write red, name
        teal, tied orange; hover at each view/write/tied edge's middle names the
        op), storages as squares coloured by category, tensors as circles (red
        ring: written in place, orange: tied), names as diamonds.
    """
    go = _go()
    data = source if isinstance(source, GraphData) else alias_graph_data(source, around, max_nodes)
    nodes, edges = data.nodes, data.edges
    pos = {i: (x, y) for i, x, y in zip(nodes["id"], nodes["x"], nodes["y"])}
    fig = go.Figure()
    tied_ids = set(edges.loc[edges["kind"] == "tied", "src"])
    for kind in ("storage", "view", "name", "tied", "write"):
        e = edges[edges["kind"] == kind]
        if e.empty:
            continue
        ex: list[float | None] = []
        ey: list[float | None] = []
        for s, d in zip(e["src"], e["dst"]):
            (x0, y0), (x1, y1) = pos[s], pos[d]
            ex += [x0, x1, None]
            ey += [y0, y1, None]
        width = {"storage": 1, "view": 1.5, "name": 1, "tied": 2.5, "write": 2}[kind]
        fig.add_trace(
            go.Scatter(
                x=ex, y=ey, mode="lines", name=f"{kind} edge", hoverinfo="skip",
                line=dict(color=_EDGE_COLORS[kind], width=width, dash="dot" if kind == "write" else "solid"),
            )
        )  # fmt: skip
        if kind in ("view", "write", "tied"):
            groups: dict[tuple[str, str], list[str]] = {}
            for s, d, op, seq in zip(e["src"], e["dst"], e["op"], e["seq"]):
                what = f"{esc(op) if isinstance(op, str) else kind}" + (f" at op {int(seq)}" if seq >= 0 else "")
                groups.setdefault((s, d), []).append(what)
            mx = [(pos[s][0] + pos[d][0]) / 2 for s, d in groups]
            my = [(pos[s][1] + pos[d][1]) / 2 for s, d in groups]
            texts = [
                f"<b>{kind}</b><br>" + "<br>".join(v[:8]) + (f"<br>... and {len(v) - 8} more" if len(v) > 8 else "")
                for v in groups.values()
            ]
            fig.add_trace(
                go.Scatter(
                    x=mx, y=my, mode="markers", marker=dict(size=6, color=_EDGE_COLORS[kind], symbol="circle-open"),
                    hovertext=texts, hoverinfo="text", showlegend=False, name=kind,
                )
            )  # fmt: skip
    recs = nodes.assign(is_tied=nodes["id"].isin(tied_ids)).to_dict("records")
    show_text = len(nodes) <= 60
    for kind, symbol in (("storage", "square"), ("tensor", "circle"), ("name", "diamond")):
        sel = [r for r in recs if r["kind"] == kind]
        if not sel:
            continue
        if kind == "storage":
            colors = [CATEGORY_COLORS.get(r["category"], _NONE_COLOR) for r in sel]
            lines = ["#333333"] * len(sel)
        elif kind == "tensor":
            colors = ["#F58518" if r["tied"] else "#FFFFFF" for r in sel]
            lines = ["#D62728" if r["writes"] else "#4C78A8" for r in sel]
        else:
            colors = ["#F58518" if r["is_tied"] else "#72B7B2" for r in sel]
            lines = ["#333333"] * len(sel)
        fig.add_trace(
            go.Scatter(
                x=[r["x"] for r in sel], y=[r["y"] for r in sel], mode="markers+text" if show_text else "markers",
                name=f"{kind}s", marker=dict(symbol=symbol, size=14 if kind == "storage" else 11, color=colors,
                line=dict(color=lines, width=2)), hovertext=[_node_hover(r) for r in sel], hoverinfo="text",
                text=[esc(r["label"] if kind != "storage" else f"s{r['ref']}") for r in sel] if show_text else None,
                textposition="middle left" if kind == "name" else "top center", textfont=dict(size=9),
            )
        )  # fmt: skip
    counts = nodes["kind"].value_counts().to_dict()
    title = (
        f"Aliasing: {counts.get('storage', 0)} storages, {counts.get('tensor', 0)} tensors, "
        f"{counts.get('name', 0)} names"
    )
    if data.around is not None:
        title += f" around {esc(data.around)}"
    if data.dropped:
        shown = data.total - data.dropped
        title += f"<br><sup>showing {shown} of {data.total} storages and tensors (max_nodes)</sup>"
    n_rows = int(-nodes["y"].min()) + 1 if len(nodes) else 1
    fig.update_layout(
        title=dict(text=title),
        xaxis=dict(visible=False),
        yaxis=dict(visible=False),
        plot_bgcolor="white",
        height=int(min(4000, max(450, 26 * n_rows + 140))),
        hovermode="closest",
    )
    return fig


# ------------------------------------------------------------------ ops table
def _module_filter(trace: Trace, ops: pd.DataFrame, module: str) -> np.ndarray:
    mods = ops["module"]
    cats = [str(c) for c in mods.cat.categories] if hasattr(mods, "cat") else sorted(set(mods.dropna().astype(str)))
    prefixes = [module]
    if module not in cats and not any(c.startswith(module + ".") for c in cats):
        folded = trace.folded_modules()
        hit = folded[folded["path"] == module]
        if not hit.empty:
            prefixes = str(hit["members"].iloc[0]).split("|")
    match = [c for c in cats if any(c == p or c.startswith(p + ".") for p in prefixes)]
    return mods.isin(match).to_numpy()


def ops_table(
    trace: Trace,
    module: str | None = None,
    phase: str | Sequence[str] | None = None,
    device: str | None = None,
    op: str | None = None,
    limit: int | None = 500,
) -> pd.DataFrame:
    """The recorded ops, filtered (``trace.ops`` plus each op's ``flops``, -1 without a formula).

    Args:
        trace: a recorded trace.
        module: a module path; matches it and its submodules (path prefix). A
            folded path (``"Model.layers.0-79"``) matches every member.
        phase: one phase or several (see :data:`~fakeviz.PHASES`).
        device: the device of the op's first output (``"cuda:0"``).
        op: a substring of the op name, case-insensitive (``"mm"``, ``"aten.add_"``).
        limit: the most rows returned (first ones in seq order); ``None``: all.

    Returns:
        A DataFrame of the matching ops in seq order.

    Raises:
        ValueError: unknown phase.
    """
    ops = trace.ops
    flops = trace.col("flops")
    mask = np.ones(len(ops), bool)
    if module is not None:
        mask &= _module_filter(trace, ops, module)
    if phase is not None:
        wanted = [phase] if isinstance(phase, str) else list(phase)
        bad = [p for p in wanted if p not in PHASES]
        if bad:
            raise ValueError(f"unknown phase {bad[0]!r}; use one of {', '.join(PHASES)}")
        mask &= ops["phase"].isin(wanted).to_numpy()
    if device is not None:
        mask &= (ops["device"].astype(object) == device).to_numpy()
    if op is not None:
        cats = [str(c) for c in ops["op"].cat.categories]
        needle = op.lower()
        mask &= ops["op"].isin([c for c in cats if needle in c.lower()]).to_numpy()
    idx = np.flatnonzero(mask)
    if limit is not None:
        idx = idx[: max(0, int(limit))]
    out = ops.iloc[idx].copy()
    out["flops"] = flops[idx] if len(flops) else np.zeros(0, np.int64)
    return out.reset_index(drop=True)


def ops_table_figure(
    source: Trace | pd.DataFrame,
    module: str | None = None,
    phase: str | Sequence[str] | None = None,
    device: str | None = None,
    op: str | None = None,
    limit: int | None = 500,
) -> go.Figure:
    """A plotly Table of :func:`ops_table` (every cell escaped).

    Args:
        source: a trace, or a DataFrame from :func:`ops_table` (filters then ignored).
        module: see :func:`ops_table`.
        phase: see :func:`ops_table`.
        device: see :func:`ops_table`.
        op: see :func:`ops_table`.
        limit: see :func:`ops_table`.

    Returns:
        A plotly Figure with one Table: seq, phase, op, module, output
        (dtype[shape] device), bytes, FLOPs, user line and arguments.
    """
    go = _go()
    df = source if isinstance(source, pd.DataFrame) else ops_table(source, module, phase, device, op, limit)

    def text(col: str, width: int | None = None) -> list[str]:
        vals = df[col].astype(object).tolist() if col in df.columns else [""] * len(df)
        out = []
        for v in vals:
            s = "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
            if width is not None and len(s) > width:
                s = s[: width - 1] + "…"
            out.append(esc(s))
        return out

    shapes, dtypes, devs = text("shape"), text("dtype"), text("device")
    output = [f"{d.replace('torch.', '')}[{s}] {v}".strip() if d else "" for d, s, v in zip(dtypes, shapes, devs)]
    flops = df["flops"].tolist() if "flops" in df.columns else [-1] * len(df)
    columns = {
        "seq": [str(int(s)) for s in df["seq"].tolist()],
        "phase": text("phase"),
        "op": text("op"),
        "module": text("module"),
        "output": output,
        "bytes": [format_bytes(b) if b else "" for b in df["nbytes"].tolist()] if "nbytes" in df.columns else [],
        "FLOPs": [format_flops(f) if f > 0 else ("?" if f < 0 else "") for f in flops],
        "line": text("user_line", 90),
        "args": text("args", 120),
    }
    fig = go.Figure(
        go.Table(
            header=dict(values=[f"<b>{k}</b>" for k in columns], fill_color="#E8EEF6", align="left"),
            cells=dict(values=list(columns.values()), align="left", height=22),
            columnwidth=[40, 60, 170, 170, 150, 60, 70, 260, 260],
        )
    )
    filt = [
        f"{k}={esc(v if isinstance(v, str) else ','.join(v))}"
        for k, v in (("module", module), ("phase", phase), ("device", device), ("op", op))
        if v is not None and not isinstance(source, pd.DataFrame)
    ]
    title = f"{len(df)} ops" + (" (" + ", ".join(filt) + ")" if filt else "")
    if limit is not None and len(df) >= limit and not isinstance(source, pd.DataFrame):
        title += f", first {limit} shown"
    fig.update_layout(title=dict(text=title), margin=dict(t=50, l=10, r=10, b=10))
    return fig
