"""Numbers and names for people: byte sizes, FLOPs, counts, and text safe for HTML and plotly.

The one definition of each format; the explorer's JavaScript (``js/src/format.js``) mirrors
:func:`format_bytes` and :func:`visible`, and ``tests/views`` checks the byte formats agree.

Every string fakeviz writes into HTML (notebook reprs, the static summary, the report page, plotly's
HTML-like labels) goes through :func:`html_text` (or :func:`esc`, its plotly form, or :func:`html_table`
for a DataFrame): escaped, and with its bidirectional and other control characters written out as
``<U+202E>`` (:func:`visible`, which the command line's text uses too). A module
name, an error message or a title comes from the user's code or from a file, so a right-to-left override
in it must not reorder the text around it (Note: [bidi controls in names]).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "esc", "format_bytes", "format_count", "format_flops", "format_seconds", "html_table", "html_text", "plain_name",
    "visible",
]  # fmt: skip

# Note: [bidi controls in names]
# Marks (U+200E, U+200F, U+061C), embeddings and overrides (U+202A-U+202E) and isolates (U+2066-U+2069)
# reorder the text that follows them up to the end of the paragraph: a module named "a\u202e.fc" shows
# as "a" followed by ".fc" reversed, and everything after it on the line (sizes, other names) with it.
# C0 and C1 control characters (a carriage return, ESC's terminal sequences) rewrite a terminal's line.
# HTML escaping leaves them alone (they are not markup), so everything fakeviz shows a person goes through
# visible, which writes each such character out as "<U+202E>": the text shows in logical order and the
# reader sees that the name holds a control. The one definition: html_text / esc / html_table for HTML,
# the text summary and the command line's output; the explorer does the same in JS, in js/src/dom.js
# where every text and tooltip is set (visible in js/src/format.js). The record and the explorer's
# payload keep names as they are: a selection sent back to Python must name the module it was.
# A name (visible(name)) has its line breaks and tabs written out too; a text of several lines
# (visible(text, lines=True): a summary, an error message) keeps them.
_BIDI = "\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069"
_HIDDEN = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
_HIDDEN_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")


def _missing(n: Any) -> bool:
    return n is None or (isinstance(n, float) and math.isnan(n))


def visible(text: Any, *, lines: bool = False) -> str:
    """``text`` as a person should see it: each bidi control and C0/C1 control written out (``<U+202E>``).

    Ordinary letters of any script stay as they are (``"é"``, ``"注意"``); not HTML-escaped (a terminal, a
    ``repr``: :func:`html_text` escapes as well). With ``lines``, line breaks and tabs are kept (a text of
    several lines); without, they are written out too (a name). Note: [bidi controls in names].
    """
    return (_HIDDEN_IN_LINES if lines else _HIDDEN).sub(lambda m: f"<U+{ord(m.group()):04X}>", str(text))


def plain_name(text: Any) -> str:
    """:func:`visible` keeping line breaks and tabs: what every HTML writer shows (``<U+202E>`` for U+202E)."""
    return visible(text, lines=True)


def html_text(text: Any, *, quote: bool = True) -> str:
    """``text`` safe inside HTML: element text or a quoted attribute, bidi controls written out.

    The one escaping helper for every HTML fakeviz writes (Note: [bidi controls in names]);
    ``None`` and NaN give ``""``.
    """
    if _missing(text):
        return ""
    return html.escape(plain_name(text), quote=quote)


def esc(text: Any) -> str:
    """``text`` as a string safe for plotly's HTML-like text (``<``, ``>``, ``&`` escaped, bidi controls written out).

    Quotes are left alone: plotly only knows a few named entities (``&quot;`` is
    not one of them) and quotes cannot open a tag.
    """
    return html_text(text, quote=False)


def html_table(df: Any, **kwargs: Any) -> str:
    """A pandas DataFrame as an HTML ``<table>``, every string cell and column name through :func:`plain_name`.

    ``DataFrame.to_html`` escapes markup but not bidi controls; ``kwargs`` go to it (``escape`` is always on).
    Duck-typed: this module does not import pandas.
    """
    kwargs["escape"] = True
    clean = df.rename(columns=lambda c: plain_name(c) if isinstance(c, str) else c)
    strings = [c for c in clean.columns if getattr(clean[c].dtype, "kind", "O") == "O"]  # object, string, category
    if strings:
        clean = clean.copy()
        for c in strings:
            clean[c] = [plain_name(v) if isinstance(v, str) else v for v in clean[c]]
    return clean.to_html(**kwargs)


def format_bytes(n: float | None) -> str:
    """Readable binary size: ``512 B``, ``1.5 KiB``, ``61.2 GiB``; ``?`` for None or NaN."""
    if _missing(n):
        return "?"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(x) < 1024 or unit == "PiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"  # pragma: no cover - unreachable


def _format_si(n: float | None, suffixes: Sequence[str], sep: str = " ") -> str:
    if _missing(n):
        return "?"
    x = float(n)
    for i, s in enumerate(suffixes):
        if abs(x) < 1000 or i == len(suffixes) - 1:
            return f"{int(round(x))}{sep}{s}".rstrip() if i == 0 else f"{x:.1f}{sep}{s}"
        x /= 1000
    return str(n)  # pragma: no cover - unreachable


def format_flops(n: float | None) -> str:
    """Readable FLOP count: ``512 FLOP``, ``3.1 TFLOP``."""
    return _format_si(n, ("FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP", "ZFLOP"))


def format_count(n: float | None) -> str:
    """Readable count: ``512``, ``8.3 K``, ``7.0 M``, ``1.2 B`` (parameters, ops)."""
    return _format_si(n, ("", "K", "M", "B", "T", "Q"))


def format_seconds(s: float | None) -> str:
    """Readable duration, three significant digits in s, ms or µs: ``1.69 s``, ``512 ms``, ``12.3 µs``, ``0 s``;
    ``?`` for None or NaN (the explorer's ``fmtSeconds`` in ``js/src/format.js`` writes the same)."""
    if _missing(s):
        return "?"
    if float(s) == 0:
        return "0 s"
    v = float(f"{float(s):.3g}")  # rounded first: 9.99999e-6 is "10.0 µs", 0.9996 is "1.00 s"
    a = abs(v)
    x, unit = (v, "s") if a >= 1 else (v * 1e3, "ms") if a >= 1e-3 else (v * 1e6, "µs")
    m = abs(x)
    return f"{x:.{0 if m >= 100 else 1 if m >= 10 else 2}f} {unit}"
