"""Every HTML writer escapes markup and writes bidi controls out (Note: [bidi controls in names] in fakeviz._core.fmt).

A module name, an error message and a title holding U+202E (right-to-left override) and ``</script>`` go through
each writer: the notebook reprs, the static summary, the compact summary (the report's ``<noscript>``), the report
page, the CLI's fallback page, a peak, the export check and a simulation's summary. None may contain the raw
control or the raw markup.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import fakeviz as fv
from fakeviz._core.fmt import esc, html_table, html_text, plain_name
from fakeviz._views import report
from fakeviz._views.export import export_html
from fakeviz._views.static import static_html
from fakeviz._views.text import summary_html

NAME = "fc\u202e</script><b>x"
BIDI = ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f")


class Evil(nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.add_module(NAME, nn.Linear(8, 8))
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = getattr(self, NAME)(x)
        if self.fail:
            raise RuntimeError(f"stopped in {NAME}")
        return y


def _clean(html: str) -> None:
    for c in BIDI:
        assert c not in html, f"raw U+{ord(c):04X} in the HTML"
    assert "</script><b>" not in html and "<b>x" not in html


@pytest.fixture(scope="module")
def failed() -> fv.Trace:
    with pytest.raises(RuntimeError, match="stopped in"), fv.record(device="cuda:0", gpu="H100") as t:
        Evil(fail=True)(torch.randn(4, 8))
    assert t.error is not None and "\u202e" in t.error["message"]
    return t


def test_the_helper_escapes_and_writes_every_bidi_control_out() -> None:
    for c in BIDI:
        assert html_text(f"a{c}b") == f"a&lt;U+{ord(c):04X}&gt;b"
        assert plain_name(f"a{c}b") == f"a<U+{ord(c):04X}>b"
    assert html_text("<'\"&>") == "&lt;&#x27;&quot;&amp;&gt;"
    assert esc("<'\"&>") == "&lt;'\"&amp;&gt;"  # plotly's form leaves quotes alone
    assert html_text(None) == "" and html_text(float("nan")) == ""
    import pandas as pd

    table = html_table(pd.DataFrame({NAME: [NAME, 1.5], "n": [1, 2]}), index=False)
    _clean(table)
    assert table.count("fc&lt;U+202E&gt;&lt;/script&gt;&lt;b&gt;x") == 2


def test_trace_writers(failed: fv.Trace) -> None:
    pages = {
        "static": static_html(failed, 1024),
        "repr": failed._repr_html_(),
        "bundle": failed._repr_mimebundle_()["text/html"],
        "summary": summary_html(failed),
    }
    for name, page in pages.items():
        _clean(page)
        assert "&lt;U+202E&gt;" in page, name  # the error message, written out
    assert "fc&lt;U+202E&gt;&lt;/script&gt;" in pages["static"]  # the module's name too


def test_report_page_and_its_noscript_summary(failed: fv.Trace) -> None:
    if not (report._STATIC / "explorer.js").is_file():
        pytest.skip("the explorer bundle is not built")
    page = report.report_html(failed, title=f"title {NAME}")
    _clean(page)
    assert "<title>title fc&lt;U+202E&gt;&lt;/script&gt;&lt;b&gt;x</title>" in page
    noscript = page.split("<noscript>")[1].split("</noscript>")[0]
    assert "&lt;U+202E&gt;" in noscript


def test_cli_fallback_page(failed: fv.Trace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakeviz._frontends.cli import _write_html

    monkeypatch.setattr(report, "_STATIC", tmp_path / "no-bundle")  # the bundle was not built (no npm)
    out = tmp_path / "r.html"
    assert _write_html(failed, out, None, title=f"fakeviz: {NAME}") == "summary page"
    page = out.read_text(encoding="utf-8")
    _clean(page)
    assert "<title>fakeviz: fc&lt;U+202E&gt;" in page and "&lt;U+202E&gt;" in page.split("</title>")[1]


def test_peak(failed: fv.Trace) -> None:
    for pk in failed.peak().values():
        _clean(pk._repr_html_())
    with fv.record(device="cuda:0") as t:
        Evil()(torch.randn(64, 8))
    pk = t.peak()["cuda:0"]
    assert "\u202e" in pk.module and any("\u202e" in str(m) for m in pk.top.module)
    html = pk._repr_html_()
    _clean(html)
    # the peak's module in its line, and the alive storages' modules in its table
    assert html.count("Evil.fc&lt;U+202E&gt;&lt;/script&gt;&lt;b&gt;x") >= 2


def test_export_check() -> None:
    html = export_html(False, f"failed in {NAME}", None, kind=f"kind {NAME}")
    _clean(html)
    assert html.count("&lt;U+202E&gt;") == 2
    check = fv.check_export(Evil(), (torch.randn(2, 8),))
    assert check.ok
    html = check._repr_html_()
    _clean(html)
    assert "fc&lt;U+202E&gt;" in html  # the nodes' module column


def test_simulation_summary() -> None:
    from fakeviz._views.simulation import summary_html as simulation_html

    def step(rank: int, mesh: object) -> None:
        Evil()(torch.randn(4, 8)).sum().backward()

    sim = fv.simulate(step, 1, device="cpu")
    html = simulation_html(sim._runs(), sim.classes)
    _clean(html)
    assert "fc&lt;U+202E&gt;" in html


def test_no_writer_escapes_on_its_own() -> None:
    """``html.escape`` and ``DataFrame.to_html`` appear in fakeviz._core.fmt only: every other writer uses its helpers."""
    root = Path(fv.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "fmt.py" and path.parent.name == "_core":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and (
                (node.attr == "escape" and isinstance(node.value, ast.Name) and node.value.id == "html")
                # trace.to_html(path) is the report writer itself, not a DataFrame's
                or (node.attr == "to_html" and not (isinstance(node.value, ast.Name) and node.value.id == "trace"))
            ):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
