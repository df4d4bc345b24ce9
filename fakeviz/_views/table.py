"""The ops table: the recorded ops filtered by module, phase, device and op name, and a plotly Table of them.

:func:`ops_table_data` is a pure function of a record (:func:`fakeviz._analysis.tables.ops_table` plus each op's FLOPs);
:func:`ops_table_figure` draws it, every cell escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .._analysis.tables import ops_table
from .._analysis.tree import folded_modules
from .._core.fmt import esc, format_bytes, format_flops
from .._core.record import Record
from .._core.schema import PHASES
from .style import plotly

if TYPE_CHECKING:  # pragma: no cover - typing only
    import plotly.graph_objects as go

__all__ = ["ops_table_data", "ops_table_figure"]


def _module_filter(trace: Record, ops: pd.DataFrame, module: str) -> np.ndarray:
    """Mask of the ops in ``module`` or under it; a folded path matches every member of the fold."""
    mods = ops["module"]
    cats = [str(c) for c in mods.cat.categories] if hasattr(mods, "cat") else sorted(set(mods.dropna().astype(str)))
    prefixes = [module]
    if module not in cats and not any(c.startswith(module + ".") for c in cats):
        folded = folded_modules(trace)
        hit = folded[folded["path"] == module]
        if not hit.empty:
            prefixes = str(hit["members"].iloc[0]).split("|")
    match = [c for c in cats if any(c == p or c.startswith(p + ".") for p in prefixes)]
    return mods.isin(match).to_numpy()


def ops_table_data(
    trace: Record,
    module: str | None = None,
    phase: str | Sequence[str] | None = None,
    device: str | None = None,
    op: str | None = None,
    limit: int | None = 500,
) -> pd.DataFrame:
    """The recorded ops, filtered (:func:`~fakeviz._analysis.tables.ops_table` plus each op's ``flops``, -1 without a
    formula).

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
    ops = ops_table(trace)
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
    matched = len(idx)
    if limit is not None:
        idx = idx[: max(0, int(limit))]
    out = ops.iloc[idx].copy()
    out["flops"] = flops[idx] if len(flops) else np.zeros(0, np.int64)
    out = out.reset_index(drop=True)
    out.attrs["matched"] = matched  # how many ops matched before the limit (the figure says "500 of 3,123")
    return out


def ops_table_figure(
    source: Record | pd.DataFrame,
    module: str | None = None,
    phase: str | Sequence[str] | None = None,
    device: str | None = None,
    op: str | None = None,
    limit: int | None = 500,
) -> go.Figure:
    """A plotly Table of :func:`ops_table_data` (every cell escaped).

    Args:
        source: a trace, or a DataFrame from :func:`ops_table_data` (filters then ignored).
        module: see :func:`ops_table_data`.
        phase: see :func:`ops_table_data`.
        device: see :func:`ops_table_data`.
        op: see :func:`ops_table_data`.
        limit: see :func:`ops_table_data`.

    Returns:
        A plotly Figure with one Table: seq, phase, op, module, output
        (dtype[shape] device), bytes, FLOPs, user line and arguments.
    """
    go = plotly()
    df = source if isinstance(source, pd.DataFrame) else ops_table_data(source, module, phase, device, op, limit)

    def text(col: str, width: int | None = None) -> list[str]:
        """Column ``col`` as escaped text, cut at ``width`` characters."""
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
    matched = int(df.attrs.get("matched", len(df)))
    shown = f"{len(df):,} of {matched:,} ops" if matched > len(df) else f"{len(df):,} ops"
    title = shown + (" (" + ", ".join(filt) + ")" if filt else "")
    if matched > len(df):
        title += f", the first {len(df):,} in op order"
    fig.update_layout(title=dict(text=title), margin=dict(t=50, l=10, r=10, b=10))
    return fig
