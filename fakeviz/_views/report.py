"""``trace.to_html(path)``: one self-contained interactive file, no network needed to open it.

The page carries the explorer's own built ES module (``fakeviz/static/explorer.js``)
and its CSS inline, the same data traits the widget gets (:func:`fakeviz._views.payload.build_state`,
binary packs as base64), and a twenty-line stand-in for the anywidget model
(``get``/``set``/``on``/``off``/``save_changes``), so the very ``render`` that runs in
Jupyter runs in the page. The module is loaded from a ``blob:`` URL made from the
inline text: nothing is fetched. Every string from the trace travels inside JSON
(every ``<`` written as ``\\u003c``) and is rendered by the explorer with ``textContent``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from .._core.fmt import html_text
from .._core.record import Record
from .payload import build_state
from .text import summary_html

__all__ = ["report_html", "to_html"]

_STATIC = Path(__file__).resolve().parent.parent / "static"

_SHIM = """
const state = JSON.parse(document.getElementById("fv-state").textContent);
const binary = new Set(state.__binary__);
const values = {};
for (const [k, v] of Object.entries(state.traits)) {
  if (binary.has(k)) {
    const raw = atob(v);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    values[k] = new DataView(bytes.buffer);
  } else {
    values[k] = v;
  }
}
const handlers = new Map();
const model = {
  get: (k) => values[k],
  set: (k, v) => { values[k] = v; for (const f of handlers.get("change:" + k) || []) f(); },
  on: (ev, f) => { if (!handlers.has(ev)) handlers.set(ev, []); handlers.get(ev).push(f); },
  off: (ev, f) => { const fs = handlers.get(ev) || []; const i = fs.indexOf(f); if (i >= 0) fs.splice(i, 1); },
  save_changes: () => {},
  send: () => {},
};
const src = document.getElementById("fv-esm").textContent;
const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
const mod = await import(url);
const el = document.getElementById("fv-root");
try {
  await mod.default.render({ model, el });
  document.body.dataset.fvRendered = "1";
} catch (err) {
  el.textContent = "fakeviz: the explorer failed to render: " + err;
  document.body.dataset.fvRendered = "error";
}
"""


def _bundle() -> tuple[str, str]:
    """The built explorer module and its CSS, as text."""
    js, css = _STATIC / "explorer.js", _STATIC / "explorer.css"
    if not js.is_file():
        raise FileNotFoundError(
            f"fakeviz: the explorer bundle {js} is missing; build it with `cd js && npm ci && npm run build` "
            "(pip install builds it automatically when npm is available)"
        )
    return js.read_text(encoding="utf-8"), css.read_text(encoding="utf-8") if css.is_file() else ""


def _script_safe(text: str) -> str:
    """``text`` safe inside a ``<script>`` or ``<style>`` element."""
    # inside <script> the only thing that can end the element early is "</"
    return text.replace("</", "<\\/")


def report_html(trace: Record, capacity: Any = None, *, title: str | None = None, **kwargs: Any) -> str:
    """The report page as a string (see :func:`to_html`)."""

    esm, css = _bundle()
    traits = build_state(trace, capacity, **kwargs)
    binary = [k for k, v in traits.items() if isinstance(v, (bytes, bytearray, memoryview))]
    payload = {
        "__binary__": binary,
        "traits": {k: (base64.b64encode(bytes(v)).decode("ascii") if k in binary else v) for k, v in traits.items()},
    }
    payload["traits"].update({"selected_module": "", "device": "", "phase": "", "search": "", "size_by": "params"})
    # every "<" in the JSON as \u003c: no "</script", "<!--" or "<script" can reach the HTML parser
    state = json.dumps(payload).replace("<", "\\u003c")
    title = title or f"fakeviz report: {trace.num_ops:,} ops"
    summary = summary_html(trace)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html_text(title)}</title>\n<style>{_script_safe(css)}</style></head>\n"
        "<body class='fv-report'>\n"
        f"<noscript>{summary}</noscript>\n"
        "<div id='fv-root'></div>\n"
        f"<script type='application/json' id='fv-state'>{state}</script>\n"
        f"<script type='text/plain' id='fv-esm'>{_script_safe(esm)}</script>\n"
        f"<script type='module'>{_SHIM}</script>\n"
        "</body></html>\n"
    )


def to_html(trace: Record, path: str | Path, capacity: Any = None, *, title: str | None = None, **kwargs: Any) -> Path:
    """Write ``trace`` as one self-contained interactive HTML file (the explorer, offline)."""
    path = Path(path)
    path.write_text(report_html(trace, capacity, title=title, **kwargs), encoding="utf-8")
    return path
