"""The static view of a trace: self-contained HTML with no script, for saved notebooks, nbviewer and GitHub.

A notebook saved without widget state (JupyterLab's default) cannot redraw the explorer or
the plotly panels when it is reopened: their models lived in the kernel. What stays is this
summary, written into the notebook next to the widget (Note: [static fallback] in
:mod:`fakeviz._views.explorer`): the verdict and, when a device does not fit, the first op
that would fail; per device the peak split by memory category (a stacked bar drawn with
inline styles) and "reserved at peak"; the largest modules of the folded layer tree.

It uses no script, no external resource and no stylesheet outside its own element, fits
a narrow notebook column (800 px and less: it wraps, it never scrolls sideways), and writes
module names with their bidirectional controls shown as ``<U+202E>`` (:func:`fakeviz._core.fmt.html_text`) so they cannot reorder
the text around them.
"""

from __future__ import annotations

from typing import Any

from .._analysis.memory import peaks as peaks_of
from .._analysis.tables import phase_counts
from .._analysis.tree import folded_modules
from .._analysis.verdict import verdict as verdict_of
from .._core.fmt import format_bytes, html_text, plain_name
from .._core.gpus import capacity_of
from .._core.palette import CATEGORY_COLORS
from .._core.record import Record
from .text import precision_text

__all__ = ["STATIC_CLASS", "plain_name", "static_html", "summary_div"]

STATIC_CLASS = "fv-static"

_CELL = "padding:2px 6px;text-align:left;vertical-align:top;border-bottom:1px solid rgba(128,128,128,.25)"
_NUM = "padding:2px 6px;text-align:right;vertical-align:top;white-space:nowrap;border-bottom:1px solid rgba(128,128,128,.25)"


def summary_div(static_id: str = "") -> str:
    """The opening ``<div>`` of a static summary (closed by the caller); ``static_id`` as in :func:`static_html`."""
    return (
        f"<div class='{STATIC_CLASS}' data-fv-static='{html_text(static_id)}' dir='ltr' style='max-width:100%;"
        "box-sizing:border-box;overflow-wrap:anywhere;font:13px/1.4 system-ui,sans-serif;unicode-bidi:isolate'>"
    )


def static_html(
    trace: Record, capacity: Any = None, *, modules: int = 8, static_id: str = "", note: str | None = None
) -> str:
    """The static summary of ``trace`` as one ``<div>`` (see the module docstring).

    Args:
        trace: the record.
        capacity: bytes, ``"80GB"`` or a GPU name (default the record's own ``meta["capacity"]``).
        modules: how many of the largest modules (by parameters, then activations) to list.
        static_id: written as ``data-fv-static`` so a live widget can hide this summary (the explorer does).
        note: the line under the summary (default: how to see the interactive explorer).
    """
    cap = capacity_of(trace.meta, capacity)
    counts = ", ".join(f"{k} {v:,}" for k, v in phase_counts(trace).items() if v)
    parts = [
        summary_div(static_id),
        f"<div><b>fakeviz trace</b>: {trace.num_ops:,} ops ({html_text(counts or 'none')})</div>",
    ]
    if trace.error:
        parts.append(
            f"<div style='color:#b00020'><b>Stopped by {html_text(trace.error.get('type') or 'an error')}</b> at "
            f"{html_text(trace.error.get('op') or 'an op')}: {html_text(str(trace.error.get('message') or '')[:300])}</div>"
        )
    verdict = verdict_of(trace, cap) if cap is not None else None
    if verdict is not None:
        color = "#1b7f3b" if verdict["fits"] else "#b00020"
        spec = trace.meta.get("capacity_spec") if capacity is None else None
        label = f" ({html_text(spec or cap.label)})"
        cls = "fv-fits" if verdict["fits"] else "fv-over"
        parts.append(f"<div class='{cls}' style='color:{color}'><b>{html_text(verdict['text'])}</b>{label}</div>")
    parts.append(_peaks_html(trace, verdict))
    weights = precision_text(trace)  # Note: [weight precision] in fakeviz/_engine/precision.py
    if weights:
        parts.append(f"<div class='fv-weights'><b>weights</b>: {html_text(weights)}</div>")
    parts.append(_modules_html(trace, modules))
    note_html = (
        html_text(note)
        if note is not None
        else "Static summary. Run the cell with a kernel for the interactive explorer; "
        "<code>trace.to_html(path)</code> writes the full explorer to one file."
    )
    parts.append(f"<div style='opacity:.7;font-size:12px'>{note_html}</div></div>")
    return "".join(parts)


def _peaks_html(trace: Record, verdict: dict[str, Any] | None) -> str:
    """Per device: the peak by category as a stacked bar and a legend, and reserved at peak."""
    rows = []
    for dev, pk in peaks_of(trace).items():
        total = max(pk.bytes, 1)
        segs = "".join(
            f"<span title='{html_text(cat)} {format_bytes(n)}' style='display:inline-block;height:100%;"
            f"width:{100 * n / total:.3f}%;background:{CATEGORY_COLORS[cat]}'></span>"
            for cat, n in pk.by_category.items()
            if n
        )
        legend = " ".join(
            f"<span style='white-space:nowrap'><span style='display:inline-block;width:.8em;height:.8em;"
            f"background:{CATEGORY_COLORS[cat]};margin-right:3px'></span>{html_text(cat)} {format_bytes(n)}</span>"
            for cat, n in pk.by_category.items()
            if n
        )
        extra = ""
        if pk.reserved is not None:  # Note: [reserved at peak] in fakeviz._analysis.memory
            extra = f"; {format_bytes(pk.reserved)} reserved at peak, {format_bytes(pk.allocated)} allocated"
        judged = (verdict or {}).get("devices", {}).get(dev) or {}
        oom = judged.get("first_oom")
        fail = ""
        if oom:
            fail = f"<div style='color:#b00020'><bdi>{html_text(oom['where'])}</bdi></div>"  # verdict's one text
        where = f"op {pk.seq:,} {html_text(pk.op)} ({html_text(pk.phase)}, <bdi>{html_text(pk.module or '<top level>')}</bdi>)"
        rows.append(
            f"<div style='margin:6px 0'><div><b>{html_text(dev)}</b> peaks at {format_bytes(pk.bytes)} of tensors{extra}, "
            f"at {where}</div>"
            f"<div style='display:flex;height:12px;width:100%;background:rgba(128,128,128,.15)'>{segs}</div>"
            f"<div style='font-size:12px'>{legend}</div>{fail}</div>"
        )
    return "".join(rows) or "<div>no memory was recorded</div>"


def _modules_html(trace: Record, n: int) -> str:
    """The ``n`` largest modules of the folded tree (parameters, then activations), one table row each."""
    mt = folded_modules(trace)
    if not len(mt) or n <= 0:
        return ""
    top = mt[mt.depth >= 1] if (mt.depth >= 1).any() else mt
    top = top.sort_values(["param_bytes", "act_bytes"], ascending=False, kind="stable").head(n)
    head = "".join(
        f"<th style='{_CELL if i == 0 else _NUM}'>{h}</th>"
        for i, h in enumerate(("module", "params", "param bytes", "activations"))
    )
    body = "".join(
        f"<tr><td style='{_CELL}'><bdi>{html_text(r.path)}</bdi>{f' x{r.count}' if r.count > 1 else ''}</td>"
        f"<td style='{_NUM}'>{int(r.params):,}</td><td style='{_NUM}'>{format_bytes(int(r.param_bytes))}</td>"
        f"<td style='{_NUM}'>{format_bytes(int(r.act_bytes))}</td></tr>"
        for r in top.itertuples()
    )
    return (
        "<div style='margin-top:6px'><b>largest modules</b></div>"
        f"<table style='border-collapse:collapse;width:100%;table-layout:auto'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )
