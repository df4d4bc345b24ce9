"""The layer tree: an icicle (or treemap) of the module hierarchy sized by a measure, repeated blocks folded.

:func:`tree_data` computes the rows (a pure function of a record), :func:`layer_tree_figure` draws them. The colour of a
module is the device or dtype holding most of its parameter bytes (:func:`color_keys`), which the explorer's
payload uses too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .._analysis.tree import FIGURES, folded_modules, modules
from .._core.fmt import esc, format_bytes, format_count, format_flops
from .._core.record import Record
from .style import MEASURES, color_map, format_measure, plotly

if TYPE_CHECKING:  # pragma: no cover - typing only
    import plotly.graph_objects as go

__all__ = ["NO_PARAMETERS", "TreeData", "color_keys", "layer_tree_figure", "param_split", "tree_data"]

#: The colour key of a module that holds no parameter (drawn in the palette's neutral colour).
NO_PARAMETERS = "no parameters"


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


def param_split(trace: Record, table: pd.DataFrame, folded: bool) -> pd.DataFrame:
    """``param_bytes:<device>:<dtype>`` columns for the rows of ``table`` (summed over fold members).

    ``table`` is :func:`~fakeviz._analysis.tree.folded_modules` (``folded``) or :func:`~fakeviz._analysis.tree.modules`
    of ``trace``, reindexed from 0.
    """
    mods = modules(trace)
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


def color_keys(split: pd.DataFrame, classes: list[str], color: str) -> list[str]:
    """The colour key of each row: its class (``color="class"``), or the device or dtype (``"device"``, ``"dtype"``)
    holding most of its parameter bytes in ``split`` (:func:`param_split`), :data:`NO_PARAMETERS` without any."""
    if color == "class":
        return [c if c else "(no class)" for c in classes]
    if split.shape[1] == 0:
        return [NO_PARAMETERS] * len(split)
    groups: dict[str, list[int]] = {}
    for j, col in enumerate(split.columns):
        dev, dt = str(col)[len("param_bytes:") :].rsplit(":", 1)
        groups.setdefault(dev if color == "device" else dt, []).append(j)
    keys = list(groups)
    mat = split.to_numpy()
    sums = np.stack([mat[:, idx].sum(axis=1) for idx in groups.values()], axis=1)
    best = sums.argmax(axis=1)
    has = sums.max(axis=1) > 0
    return [keys[b] if h else NO_PARAMETERS for b, h in zip(best.tolist(), has.tolist())]


def _tree_hover(row: dict[str, Any], measure: str, split_cols: list[str], split_row: np.ndarray) -> str:
    """The hover text of one tree row: every figure of the module, escaped."""
    lines = [f"<b>{esc(row['path'])}</b>", f"class: {esc(row['class'])}"]
    if row.get("precision"):  # Note: [weight precision] in fakeviz/_engine/precision.py
        lines.append(f"weights: {esc(row['precision'])}")
    if row["count"] > 1:
        lines.append(f"folded: {row['count']} modules ({esc(row['label'])})")
    if row["odd"]:
        lines.append("<b>odd one out</b>: its structure differs from its numbered siblings")
    lines.append(f"<b>{measure}: {format_measure(measure, row['measure'])}</b>")
    if row["inflated"]:
        lines.append(f"(box sized {format_measure(measure, row['value'])}: its children share tied weights)")
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


def tree_data(trace: Record, measure: str = "params", color: str = "device", folded: bool = True) -> TreeData:
    """The rows of the layer-tree figure: one per (folded) module, sized by ``measure``.

    Args:
        trace: a recorded trace.
        measure: one of :data:`MEASURES` (``"params"``, ``"param_bytes"``,
            ``"act_bytes"``, ``"flops"`` = forward + backward FLOPs, ...).
        color: ``"device"`` or ``"dtype"`` (the one holding most of the module's
            parameter bytes) or ``"class"``.
        folded: fold repeated numbered blocks (:func:`~fakeviz._analysis.tree.folded_modules`:
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
    src = folded_modules(trace) if folded else modules(trace)
    table = src.reset_index(drop=True).copy()
    if table.empty:  # no module was seen (plain tensor code)
        cols = ["id", "parent_id", "label", "path", "class", "depth", "count", "odd", *FIGURES, "measure", "value",
                "inflated", "color_key", "color", "hover"]  # fmt: skip
        return TreeData(table=pd.DataFrame(columns=cols), measure=measure, color=color, folded=folded)
    if not folded:
        table["count"] = 1
        table["odd"] = False
        table["members"] = table["path"]
    split = param_split(trace, table, folded)
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

    keys = color_keys(split, table["class"].tolist(), color)
    table["color_key"] = keys
    cmap = color_map(keys, none_key=NO_PARAMETERS)
    table["color"] = [cmap[k] for k in keys]
    records = table.to_dict("records")
    table["hover"] = [
        _tree_hover(r, measure, split_cols, split_mat[i] if split_cols else np.zeros(0)) for i, r in enumerate(records)
    ]
    return TreeData(table=table, measure=measure, color=color, folded=folded, colors=cmap)


def layer_tree_figure(
    source: Record | TreeData,
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
    go = plotly()
    data = source if isinstance(source, TreeData) else tree_data(source, measure, color, folded)
    t = data.table
    if kind not in ("icicle", "treemap"):
        raise ValueError(f"unknown kind {kind!r}; use 'icicle' or 'treemap'")
    t = _drawable(t)
    common = dict(
        ids=[esc(x) for x in t["id"]],
        parents=[esc(x) for x in t["parent_id"]],
        labels=[("⚠ " if o else "") + esc(x) for x, o in zip(t["label"], t["odd"])],
        values=t["value"].astype(float).tolist(),
        branchvalues="total",
        text=[format_measure(data.measure, v) for v in t["measure"].tolist()],
        textinfo="label+text",
        hovertext=t["hover"].tolist(),
        hoverinfo="text",
        marker=dict(
            colors=t["color"].tolist(),
            # one width for every sector: a per-sector width array makes plotly.js animate the drill-down
            # through NaN paths (console errors); odd blocks keep their red outline and the ⚠ label
            line=dict(color=["#D62728" if o else "#FFFFFF" for o in t["odd"]], width=2),
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
    total = format_measure(data.measure, root["measure"]) if root is not None else "0"
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


def _drawable(t: pd.DataFrame) -> pd.DataFrame:
    """The rows an icicle can draw: the root, and every module of positive size under a drawn parent.

    A zero-size sector (a module without parameters, in a tree sized by parameters) is an empty box
    plotly.js cannot label or click; they are left out, as the explorer leaves them out, and the hover
    of their parent still counts them.
    """
    if not len(t):
        return t
    values = t["value"].astype(float).to_numpy()
    keep = np.isfinite(values) & (values > 0)
    keep[0] = True
    kept: set[str] = set()
    rows = []
    for i, (ident, parent) in enumerate(zip(t["id"].tolist(), t["parent_id"].tolist())):
        if i == 0 or (keep[i] and parent in kept):  # parents come before their children
            kept.add(ident)
            rows.append(i)
    return t.iloc[rows]
