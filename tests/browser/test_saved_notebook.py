"""Issue 15 in a real JupyterLab (Chromium through Playwright): linked plotly panels, and a saved notebook reopened.

One JupyterLab server for the module, one notebook written here with nbformat (a tiny model recorded on a
fake ``cuda:0``, its trace displayed, ``trace.panels()``), one test that does what a user does:

* runs every cell: the explorer and the four plotly panels render; the static summary written beside
  each (Note: [static fallback] in ``fakeviz/_views/explorer.py``) is hidden while the widgets live;
* clicks a module in the icicle: the bars' title names it, the timeline shades where it ran, the alias
  graph is redrawn around it, and the browser logs no error (no NaN path from the drill-down);
* saves (JupyterLab's default: no widget state), stops the kernel, reloads the page: every widget
  output is replaced by its static summary (peaks by category, verdict, largest modules), no
  "Error displaying widget" shows, and at 800 px wide nothing scrolls sideways.

Screenshots of both states are written to the test's tmp folder.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser_util import (  # tests/ is on sys.path under pytest
    PageProblems,
    browser_missing,
    jupyter_missing,
    jupyter_server,
    local_only,
    run_all_cells,
    wait_cells_done,
    wait_kernel_idle,
)

pytestmark = [pytest.mark.browser, pytest.mark.skipif(bool(browser_missing()), reason=str(browser_missing()))]

NOTEBOOK = "saved.ipynb"
SETUP = """\
import torch
import fakeviz as fv

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))

with fv.record(device="cuda:0", gpu="H100") as trace:
    model = torch.nn.Sequential(Block(), Block())
    model(torch.randn(16, 64)).sum().backward()
"""
CELLS = [SETUP, "trace", "panels = trace.panels()\npanels"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = jupyter_missing()
    if reason:
        pytest.skip(reason)
    from fakeviz._views.explorer import STATIC

    if not (STATIC / "explorer.js").is_file():
        pytest.skip("fakeviz/static/explorer.js was never built (cd js && npm run build)")
    root = tmp_path_factory.mktemp("saved")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / NOTEBOOK)
    with jupyter_server(root) as server:
        yield server


def _api(lab: Any, method: str, path: str) -> Any:
    req = urllib.request.Request(lab.url(path), method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def _plot(page: Any, index: int) -> Any:
    return page.locator(".jp-CodeCell").nth(2).locator(".js-plotly-plot").nth(index)


def _layout(plot: Any, expr: str) -> Any:
    return plot.evaluate(f"(gd) => {expr}")


def test_panels_link_then_saved_notebook_shows_static(browser, lab, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    blocked = local_only(context, lab.origin)
    page = context.new_page()
    problems = PageProblems(page)
    try:
        page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
        wait_kernel_idle(page)
        run_all_cells(page)
        wait_cells_done(page)
        # live: the explorer and four plotly figures render; the static summaries are hidden
        page.wait_for_selector("[data-testid=fv-explorer] .fv-tree .fv-node", timeout=120_000)
        page.wait_for_function("() => document.querySelectorAll('.jp-CodeCell .js-plotly-plot').length >= 4",
                               timeout=120_000)  # fmt: skip
        statics = page.locator(".fv-static")
        assert statics.count() == 2
        assert not any(statics.nth(i).is_visible() for i in range(2)), "a live widget left its summary visible"
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)

        # click "0" (the first Block) in the icicle: the other figures show that module
        tree, bars, timeline, graph = (_plot(page, i) for i in range(4))
        shapes_before = _layout(timeline, "(gd.layout.shapes || []).length")
        sector = tree.locator("g.slice", has_text="0").first
        sector.click()
        page.wait_for_function(
            "(el) => (el.layout.title.text || '').includes('selected')",
            arg=bars.element_handle(),
            timeout=60_000,
        )
        assert "selected Sequential.0" in _layout(bars, "gd.layout.title.text")
        assert _layout(timeline, "(gd.layout.shapes || []).length") > shapes_before
        assert "around Sequential.0" in _layout(graph, "gd.layout.title.text")
        page.wait_for_timeout(1500)  # the icicle's drill-down transition has run
        problems.check()

        # save (no widget state: JupyterLab's default), stop the kernel, reload
        page.keyboard.press("Control+s")
        page.wait_for_function(
            "() => !document.querySelector('.jp-mod-dirty')", timeout=30_000
        )  # the tab's unsaved mark is gone
        saved = json.loads((Path(lab.root) / NOTEBOOK).read_text())
        assert "widgets" not in saved["metadata"]
        html = [o for c in saved["cells"] for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
        assert len(html) == 2 and all("data-fv-static" in "".join(o["data"]["text/html"]) for o in html)
        for s in _api(lab, "GET", "api/sessions"):
            _api(lab, "DELETE", f"api/sessions/{s['id']}")
        page.set_viewport_size({"width": 800, "height": 1000})
        page.reload()
        wait_kernel_idle(page)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.fv-static')].filter((e) => e.offsetParent).length === 2",
            timeout=60_000,
        )
        page.wait_for_timeout(3000)  # the widget manager has given up on the missing models
        shown_errors = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
            ".filter((e) => e.offsetParent && e.textContent.includes('Error displaying widget')).length"
        )
        assert shown_errors == 0, "a widget output without its model shows an error instead of the summary"
        summary = page.locator(".fv-static").first
        body = summary.inner_text()
        assert "fits: cuda:0" in body and "reserved at peak" in body and "largest modules" in body
        assert "Parameter" in body and "Gradient" in body
        # fits an 800 px window: no sideways scrolling of the summary or of the notebook
        assert summary.evaluate("(e) => e.scrollWidth <= e.clientWidth + 1")
        assert page.evaluate(
            "() => { const n = document.querySelector('.jp-WindowedPanel-outer, .jp-Notebook');"
            " return n.scrollWidth <= n.clientWidth + 1; }"
        )
        page.screenshot(path=str(tmp_path / "reopened_800px.png"), full_page=True)
        assert not blocked, f"JupyterLab tried to reach outside 127.0.0.1: {blocked}"
    finally:
        context.close()


def test_report_at_800px_bidi_names_and_one_op_ticks(browser, tmp_path):
    """At 800 px the report does not scroll sideways; a right-to-left override in a module name is written
    out and reorders nothing; a one-op timeline has one tick, "op 0"."""
    import torch

    import fakeviz as fv

    model = torch.nn.Sequential()
    model.add_module("attn\u202eq", torch.nn.Linear(8, 8))  # "q" after an RLO would show before "attn"
    model.add_module("mlp", torch.nn.Linear(8, 8))
    with fv.record(device="cuda:0", gpu="H100") as trace:
        model = model.to("cuda:0")
        model(torch.randn(2, 8)).sum().backward()
    with fv.record(device="cuda:0") as one:
        torch.empty(10)
    page = browser.new_page(viewport={"width": 800, "height": 1200})
    problems = PageProblems(page)
    try:
        for t, name in ((trace, "bidi"), (one, "one")):
            path = t.to_html(tmp_path / f"{name}.html", "H100")
            page.goto(path.as_uri())
            page.wait_for_selector(".fv-ops .fv-op-row[data-seq]")
            assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
            page.screenshot(path=str(tmp_path / f"{name}_800.png"), full_page=True)
        problems.check()
        # the one-op run: its ticks
        ticks = page.locator(".fv-timeline .fv-axis text.fv-tick").all_text_contents()
        assert ticks == ["op 0"]
        page.goto((tmp_path / "bidi.html").as_uri())
        page.wait_for_selector(".fv-ops .fv-op-row[data-seq]")
        cells = page.locator(".fv-ops .fv-op-row[data-seq] .fv-c-module bdi").all_inner_texts()
        assert "Sequential.attn<U+202E>q" in cells and "\u202e" not in "".join(cells)
        shown = page.locator(".fv-alias text, .fv-tree .fv-node-name").all_text_contents()
        assert any("<U+202E>" in t for t in shown) and not any("\u202e" in t for t in shown)
        problems.check()
    finally:
        page.close()
