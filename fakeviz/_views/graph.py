"""The alias graph: storages, the tensors viewing them, parameter names, tied weights and in-place writes.

:func:`alias_graph_data` bounds and lays out :func:`fakeviz._analysis.alias.alias_graph` (a pure function of a
record); :func:`alias_graph_figure` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from .._analysis.alias import alias_graph, aliases, tensor_table
from .._core.fmt import esc, format_bytes
from .._core.palette import CATEGORY_COLORS, EDGE_COLORS, NONE_COLOR
from .._core.record import Record
from .style import plotly

if TYPE_CHECKING:  # pragma: no cover - typing only
    import plotly.graph_objects as go

__all__ = ["GraphData", "alias_graph_figure", "alias_graph_data"]


@dataclass
class GraphData:
    """The aliasing graph with a layout (see :func:`alias_graph_data`).

    ``nodes``: the columns of :func:`~fakeviz._analysis.alias.alias_graph` (id, kind, ref, label,
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


def _graph_candidates(trace: Record, around: Any) -> int:
    """Number of storages and tensors the graph would have without a bound."""
    tt = tensor_table(trace)
    if around is not None:
        if isinstance(around, tuple) and around and around[0] == "storage":
            sids = {int(around[1])}
        elif isinstance(around, tuple) and around and around[0] == "storages":
            sids = {int(x) for x in around[1]}
        else:
            sids = set(aliases(trace, around).storage.tolist())
        tt = tt[tt.storage.isin(sids)]
    tt = tt[tt.storage >= 0]
    return int(len(tt) + tt.storage.nunique())


def around_text(around: Any) -> str:
    """``around`` for a title: a tensor as its dtype, shape and device (not its repr, which a fake tensor fills
    with ``FakeTensor(...)``), ``("storage", 3)`` as ``storage 3``, a name or ``$N`` as itself."""
    if all(hasattr(around, a) for a in ("dtype", "shape", "device")):  # a tensor (views do not import torch)
        dtype = str(around.dtype).removeprefix("torch.")
        return f"a tensor {dtype}[{', '.join(map(str, around.shape))}] on {around.device}"
    if isinstance(around, tuple) and len(around) == 2 and around[0] == "storage":
        return f"storage {around[1]}"
    if isinstance(around, tuple) and len(around) == 2 and around[0] == "storages":
        ids = list(around[1])
        return "storages " + ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
    return str(around)


def alias_graph_data(trace: Record, around: Any = None, max_nodes: int = 200) -> GraphData:
    """Storages, tensors and parameter names from :func:`~fakeviz._analysis.alias.alias_graph`, bounded, laid out.

    Args:
        trace: a recorded trace.
        around: restrict to the storage of one tensor and what aliases it (a
            ``$N`` id, a parameter name such as ``"lm_head.weight"``, or
            ``("storage", id)``, or ``("storages", [ids])``); ``None`` for the whole run.
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
    # the analysis bounds storages + tensors; names come on top. Ask again for fewer
    # tensors until everything fits (names are what tells a parameter apart).
    request = max_nodes
    for _ in range(8):
        nodes, edges = alias_graph(trace, around, max_nodes=request)
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
        """View depth of tensor ``t``: 0 for one that views no shown tensor (memoised along the chain)."""
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
    dropped = max(0, total - int((nodes["kind"] != "name").sum()))
    return GraphData(nodes=nodes, edges=edges, total=total, dropped=dropped, around=around)


def _node_hover(r: dict[str, Any]) -> str:
    """The hover text of one node (a row of :attr:`GraphData.nodes`), escaped."""
    size = format_bytes(r.get("nbytes"))
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


def alias_graph_figure(source: Record | GraphData, around: Any = None, max_nodes: int = 200) -> go.Figure:
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
    go = plotly()
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
                line=dict(color=EDGE_COLORS[kind], width=width, dash="dot" if kind == "write" else "solid"),
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
                    x=mx, y=my, mode="markers", marker=dict(size=6, color=EDGE_COLORS[kind], symbol="circle-open"),
                    hovertext=texts, hoverinfo="text", showlegend=False, name=kind,
                )
            )  # fmt: skip
    recs = nodes.assign(is_tied=nodes["id"].isin(tied_ids)).to_dict("records")
    n_rows = int(-nodes["y"].min()) + 1 if len(nodes) else 1
    for kind, symbol in (("storage", "square"), ("tensor", "circle"), ("name", "diamond")):
        sel = [r for r in recs if r["kind"] == kind]
        if not sel:
            continue
        if kind == "storage":
            colors = [CATEGORY_COLORS.get(r["category"], NONE_COLOR) for r in sel]
            lines = ["#333333"] * len(sel)
        elif kind == "tensor":
            colors = ["#F58518" if r["tied"] else "#FFFFFF" for r in sel]
            lines = ["#D62728" if r["writes"] else "#4C78A8" for r in sel]
        else:
            colors = ["#F58518" if r["is_tied"] else "#72B7B2" for r in sel]
            lines = ["#333333"] * len(sel)
        fig.add_trace(
            go.Scatter(
                x=[r["x"] for r in sel], y=[r["y"] for r in sel], mode="markers+text",
                name=f"{kind}s", marker=dict(symbol=symbol, size=14 if kind == "storage" else 11, color=colors,
                line=dict(color=lines, width=2)), hovertext=[_node_hover(r) for r in sel], hoverinfo="text",
                text=[esc(_short(r["label"]) if kind != "storage" else f"s{r['ref']}") for r in sel],
                textposition="middle left" if kind == "name" else "top center", textfont=dict(size=9),
            )
        )  # fmt: skip
    counts = nodes["kind"].value_counts().to_dict()
    title = (
        f"Aliasing: {counts.get('storage', 0)} storages, {counts.get('tensor', 0)} tensors, "
        f"{counts.get('name', 0)} names"
    )
    if data.around is not None:
        title += f" around {esc(around_text(data.around))}"
    if data.dropped:
        shown = data.total - data.dropped
        title += f"<br><sup>showing {shown} of {data.total} storages and tensors (max_nodes)</sup>"
    # a column header over each kind of node, so the figure reads without hovering
    heads = [
        dict(x=float(nodes.loc[nodes["kind"] == kind, "x"].mean()), y=1, xref="x", yref="paper", yanchor="bottom",
             text=f"<b>{label}</b>", showarrow=False, font=dict(size=11), name=f"header {kind}")
        for kind, label in (("storage", "storages"), ("tensor", "tensors and views"), ("name", "names"))
        if (nodes["kind"] == kind).any()
    ]  # fmt: skip
    # at most _MAX_HEIGHT px: a taller graph shows its first rows and scrolls by dragging (pan)
    fit_rows = max(1, (_MAX_HEIGHT - 160) // _ROW_PX)
    yaxis: dict[str, Any] = dict(visible=False)
    if n_rows > fit_rows:
        yaxis["range"] = [-(fit_rows - 0.5), 0.6]
        title += f"<br><sup>rows 1-{fit_rows} of {n_rows}: drag up and down to scroll</sup>"
    fig.update_layout(
        title=dict(text=title),
        xaxis=dict(visible=False),
        yaxis=yaxis,
        plot_bgcolor="white",
        height=int(min(_MAX_HEIGHT, max(360, _ROW_PX * n_rows + 160))),
        hovermode="closest",
        dragmode="pan",
        annotations=heads,
        margin=dict(t=90, l=10, r=10, b=10),
    )
    return fig


_MAX_HEIGHT = 720  # px: the alias graph never grows taller than a screen
_ROW_PX = 26  # px per row of nodes, enough for a label


def _short(label: Any, width: int = 32) -> str:
    """A node label cut to ``width`` characters from the left (the end of a dotted name tells most)."""
    text = str(label)
    return text if len(text) <= width else "…" + text[-(width - 1) :]
