"""How an export check shows: a notebook HTML table of the exported graph's nodes (devices coloured), and text.

Pure functions of plain data (``ok``, ``reason``, the nodes DataFrame of
:func:`fakeviz._analysis.export_nodes.export_nodes`, whose shapes, dtypes and devices are already text, ``""``
for a node without a tensor); ``fakeviz.check_export``'s result calls them.
Devices get their colours from :func:`device_colors`: the palette's cycle in the device display order
(accelerators first), as :func:`~fakeviz._views.style.color_map` gives every open-ended key its colour.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .._core.devices import device_order
from .._core.fmt import format_bytes, html_text
from .style import color_map

__all__ = ["device_colors", "export_html", "export_repr", "export_text"]

#: The node columns the HTML table and the text show, in order.
SHOWN = ("name", "target", "kind", "shape", "dtype", "device", "bytes", "module", "user_line")
TEXT_SHOWN = ("name", "target", "shape", "dtype", "device", "module")


def device_colors(devices: Iterable[str]) -> dict[str, str]:
    """One palette colour per device, in display order (``cuda:0, cuda:1, ..., cpu``)."""
    return color_map(device_order({d for d in devices if d}))


def _devices(nodes: Any) -> list[str]:
    if nodes is None or not len(nodes):
        return []
    found: set[str] = set()
    for d in nodes["device"]:
        if isinstance(d, str) and d:  # "" for a node without a tensor
            found.update(x.strip() for x in d.split(","))
    return device_order(found)


def _counts(nodes: Any) -> str:
    if nodes is None or not len(nodes):
        return "no graph"
    ops = int((nodes["kind"] == "op").sum())
    devs = _devices(nodes)
    return f"{len(nodes)} nodes, {ops} ops" + (f" on {', '.join(devs)}" if devs else "")


def export_repr(ok: bool, nodes: Any, kind: str | None = None) -> str:
    """``<fakeviz.ExportCheck ok: 11 nodes, 5 ops on cuda:0, cpu>`` or ``<... failed (data-dependent)>``."""
    if ok:
        return f"<fakeviz.ExportCheck ok: {_counts(nodes)}>"
    return f"<fakeviz.ExportCheck failed ({kind or 'error'})>"


def _cell(col: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if col == "bytes":
        return format_bytes(int(value)) if int(value) >= 0 else ""
    return str(value)  # shape, stride, dtype and device are already text (fx_nodes writes them)


def _short_line(line: str) -> str:
    """``/long/path/model.py:14 in forward`` -> ``model.py:14 in forward``."""
    path, sep, rest = line.partition(":")
    return os.path.basename(path) + sep + rest if sep else line


def export_text(ok: bool, reason: str | None, nodes: Any, *, kind: str | None = None, max_rows: int = 60) -> str:
    """A plain-text report: a status line, the reason when the export failed, the nodes as an aligned table."""
    lines = [("export ok: " + _counts(nodes)) if ok else f"export failed ({kind or 'error'})"]
    if reason:
        lines += ["", reason]
    if nodes is not None and len(nodes):
        rows = [[_cell(c, v) for c, v in zip(TEXT_SHOWN, r)] for r in nodes[list(TEXT_SHOWN)].itertuples(index=False)]
        head = list(TEXT_SHOWN)
        widths = [min(40, max([len(h)] + [len(r[i]) for r in rows])) for i, h in enumerate(head)]

        def fmt(cells: list[str]) -> str:
            return "  ".join(c[:w].ljust(w) for c, w in zip(cells, widths)).rstrip()

        lines += ["", fmt(head)] + [fmt(r) for r in rows[:max_rows]]
        if len(rows) > max_rows:
            lines.append(f"... {len(rows) - max_rows} more nodes (`.nodes` has them all)")
    return "\n".join(lines)


def export_html(
    ok: bool,
    reason: str | None,
    nodes: Any,
    *,
    kind: str | None = None,
    strict: bool = False,
    max_rows: int = 300,
) -> str:
    """The notebook view: an ok / failed line, the reason, and the nodes table with each device cell coloured."""
    mode = "strict" if strict else "non-strict"
    if ok:
        status = f"<p class='fv-fits'><b>export ok</b> ({mode}): {html_text(_counts(nodes))}</p>"
    else:
        status = f"<p class='fv-over'><b>export failed</b> ({mode}, {html_text(kind or 'error')})</p>"
    why = f"<pre class='fv-export-reason'>{html_text(reason)}</pre>" if reason else ""
    table = ""
    if nodes is not None and len(nodes):
        colors = device_colors(_devices(nodes))
        head = "".join(f"<th>{html_text(c)}</th>" for c in SHOWN)
        body = []
        for r in nodes[list(SHOWN)].head(max_rows).itertuples(index=False):
            cells = []
            for col, value in zip(SHOWN, r):
                text = _cell(col, value)
                if col == "device" and text:
                    cells.append(f"<td>{_device_cell(text, colors)}</td>")
                elif col == "user_line" and text:
                    cells.append(f"<td title='{html_text(text)}'>{html_text(_short_line(text))}</td>")
                else:
                    cells.append(f"<td>{html_text(text)}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        more = ""
        if len(nodes) > max_rows:
            more = f"<p>... {len(nodes) - max_rows} more nodes (<code>.nodes</code> has them all)</p>"
        legend = " ".join(_device_cell(d, colors) for d in colors)
        table = (
            f"<p>devices: {legend}</p><table class='fv-export-nodes'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{more}"
        )
    return f"<div class='fv-export'><b>fakeviz export check</b>{status}{why}{table}</div>"


def _device_cell(text: str, colors: dict[str, str]) -> str:
    parts = []
    for d in (x.strip() for x in text.split(",")):
        color = colors.get(d)
        dot = (
            f"<span style='display:inline-block;width:0.75em;height:0.75em;border-radius:50%;"
            f"background:{color};margin-right:0.3em'></span>"
            if color
            else ""
        )
        parts.append(f"<span class='fv-device' data-device='{html_text(d)}'>{dot}{html_text(d)}</span>")
    return ", ".join(parts)
