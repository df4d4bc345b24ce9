"""The explorer in a real browser: Debian's Chromium driven by Playwright.

* ``test_report_offline``: a ``trace.to_html`` report opened from a file with every
  request that is not ``file:``/``blob:``/``data:`` aborted and the context offline:
  it renders, a click in the tree highlights the module everywhere, and a module whose
  class is called ``<script>alert(1)</script>`` (with a child called
  ``<img src=x onerror=...>``) shows as text, runs nothing and opens no dialog.
* ``test_jupyterlab_explorer``: JupyterLab 4 (started here on 127.0.0.1 with a token, in
  a temporary folder holding the explorer tour, ``tests/browser/explorer_tour.py``) runs it
  from its Run menu; both explorers render; the selection set from Python shows; a click
  on a tree node selects it (tree, timeline spans, ops table, bars share, alias graph),
  and re-running a cell shows the kernel got the click.
* ``test_notebook7_explorer``: the same notebook in Notebook 7 (``/notebooks/...``) renders
  the explorer, and a click in its tree links the views.
* ``test_report_html_comment_in_a_name``: a string from the trace holding ``<!--<script>``
  cannot put the HTML parser in its "script data double escaped" state (the report's JSON
  writes every ``<`` as ``\\u003c``); it renders as text.

Any console error, uncaught page error or dialog fails a test. The tests are skipped,
saying why, only where Chromium, playwright or JupyterLab are missing
(``scripts/setup.sh`` installs them all when run as root).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import explorer_tour
import pytest
import torch
from browser_util import (  # tests/ is on sys.path under pytest
    PageProblems,
    browser_missing,
    built_bundle,
    jupyter_missing,
    jupyter_server,
    local_only,
    run_all_cells,
    wait_cells_done,
    wait_kernel_idle,
)

import fakeviz as fv
from fakeviz._core.palette import CATEGORY_COLORS, EDGE_COLORS, PHASE_COLORS

warnings.filterwarnings("ignore", message=".*loss_type=None.*")

pytestmark = [pytest.mark.browser, pytest.mark.skipif(bool(browser_missing()), reason=str(browser_missing()))]

NOTEBOOK = "explorer_tour.ipynb"
EVIL_CLASS = "<script>alert(1)</script>"
EVIL_CHILD = "<img src=x onerror=alert(2)>"
LAB_VIEWPORT = {"width": 1440, "height": 1100}
# what the notebook selects from Python, and what the test clicks
PY_SELECTED = "LlamaForCausalLM.model.layers.0-3.mlp"
CLICKED = "LlamaForCausalLM.model.layers.0-3.self_attn"


# ----------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bundle() -> Path:
    """The explorer's ES module (browser_util.built_bundle: rebuilt from js/ when npm is here)."""
    out = built_bundle()
    if out is None:
        pytest.skip("npm is not installed and fakeviz/static/explorer.js was never built")
    return out


def _device() -> str:
    return "cuda:0" if fv.fake_cuda_status().cuda_ok else "cpu"


def _evil_trace() -> fv.Trace:
    """A tiny model whose class and child names are HTML."""

    class Evil(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(16, 32)
            self.add_module(EVIL_CHILD, torch.nn.Linear(32, 8))
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.inner(x)).view(4, 2, 32).transpose(0, 1).reshape(8, 32)
            return self.head(self._modules[EVIL_CHILD](h))

    Evil.__name__ = Evil.__qualname__ = EVIL_CLASS
    with fv.record(device=_device()) as trace:
        model = Evil()
        x = torch.randn(8, 16, requires_grad=True)
        model(x).sum().backward()
    return trace


# ------------------------------------------------------------------ shared checks
def _assert_views_rendered(root: Any) -> None:
    """Tree, bars, timeline, alias graph and ops table hold real content."""
    assert root.locator(".fv-tree .fv-node[data-path]").count() > 1
    assert root.locator(".fv-bars svg.fv-bar-svg rect.fv-bar-seg").count() > 0
    areas = root.locator(".fv-timeline svg.fv-timeline-svg path.fv-area")
    assert areas.count() > 0
    assert all(len(d or "") > 10 for d in areas.evaluate_all("els => els.map(e => e.getAttribute('d'))"))
    assert root.locator(".fv-alias svg.fv-alias-svg .fv-anode").count() > 0
    assert root.locator(".fv-ops .fv-op-row[data-seq]").count() > 0
    assert root.locator("[data-testid=fv-ops-count]").inner_text().strip()
    for testid in ("fv-tree", "fv-bars", "fv-timeline", "fv-alias", "fv-ops"):
        box = root.locator(f"[data-testid={testid}]").bounding_box()
        assert box and box["width"] > 100 and box["height"] > 40, (testid, box)


def _click_node(root: Any, path: str) -> None:
    node = root.locator(f'.fv-tree .fv-node[data-path="{path}"]')
    assert node.count() == 1, f"no tree node {path!r}: {_node_paths(root)}"
    node.click()


def _node_paths(root: Any) -> list[str]:
    return root.locator(".fv-tree .fv-node[data-path]").evaluate_all("els => els.map(e => e.dataset.path)")


def _assert_linked_selection(root: Any, path: str, module_re: str) -> None:
    """What a click on ``path`` in the tree does to every view (js/src/views/*.js)."""
    selected = root.locator(".fv-tree .fv-node.fv-selected")
    assert selected.count() == 1
    assert selected.get_attribute("data-path") == path
    assert selected.get_attribute("aria-selected") == "true"
    assert root.locator("[data-testid=fv-selection-label]").inner_text() == path
    # the timeline marks when the module ran
    assert root.locator(".fv-timeline.fv-has-selection").count() == 1
    assert root.locator(".fv-timeline .fv-span.fv-highlight").count() > 0
    # the ops table keeps only the module's ops
    count = root.locator("[data-testid=fv-ops-count]").inner_text()
    m = re.match(r"([\d,]+) of ([\d,]+) ops", count)
    assert m, count
    shown, total = (int(g.replace(",", "")) for g in m.groups())
    assert 0 < shown < total and count.endswith(f"in {path}"), count
    modules = root.locator(".fv-ops .fv-op-row[data-seq] .fv-c-module").all_inner_texts()
    assert modules and all(re.search(module_re, t) for t in modules), modules[:20]
    # the bars show the module's share of the peak
    assert root.locator("[data-testid=fv-bar-share]").count() >= 1
    assert root.locator(".fv-share-text.fv-highlight").first.inner_text().startswith(f"{path} holds ")
    # the alias graph knows a selection is active
    assert root.locator(".fv-alias .fv-alias-scroll.fv-has-selection").count() == 1


# ------------------------------------------------------------- the offline report
def test_report_offline(tmp_path, browser, bundle):
    trace = _evil_trace()
    report = trace.to_html(tmp_path / "report.html", "8GB")
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, java_script_enabled=True)
    try:
        blocked = local_only(context)
        context.set_offline(True)
        page = context.new_page()
        problems = PageProblems(page)
        page.add_init_script("window.__fvXss = 0;")
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.fvRendered !== undefined", timeout=30_000)
        assert page.evaluate("document.body.dataset.fvRendered") == "1", page.inner_text("#fv-root")[:2000]
        root = page.locator("#fv-root")
        _assert_views_rendered(root)

        # HTML in module names is text: shown literally, nothing parsed, nothing run
        paths = _node_paths(root)
        assert EVIL_CLASS in paths and f"{EVIL_CLASS}.{EVIL_CHILD}" in paths, paths
        names = root.locator(".fv-tree .fv-node-name").all_inner_texts()
        assert EVIL_CLASS in names and EVIL_CHILD in names, names
        assert page.evaluate("document.querySelectorAll('#fv-root script, #fv-root img, #fv-root iframe').length") == 0
        assert page.evaluate("document.scripts.length") == 3  # the report's state, module text and loader only

        _click_node(root, f"{EVIL_CLASS}.{EVIL_CHILD}")
        _assert_linked_selection(root, f"{EVIL_CLASS}.{EVIL_CHILD}", re.escape(EVIL_CHILD))
        detail = root.locator("[data-testid=fv-tree-detail]").inner_text()
        assert f"{EVIL_CLASS}.{EVIL_CHILD}" in detail and "Linear" in detail

        # hovering the timeline shows the op under the pointer
        root.locator(".fv-timeline .fv-overlay").first.hover()
        tooltip = root.locator("[data-testid=fv-tooltip]").first
        assert tooltip.is_visible() and tooltip.inner_text().startswith("op ")

        # the breadcrumb goes back to the whole tree
        root.locator(".fv-breadcrumb .fv-crumb", has_text="all").click()
        assert EVIL_CLASS in _node_paths(root)

        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        assert page.evaluate("window.__fvXss") == 0
        assert not blocked, f"the report tried to fetch: {blocked}"
        problems.check()
    finally:
        context.close()


def test_report_html_comment_in_a_name(tmp_path, browser, bundle):
    name = "<!--<script>"

    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module(name, torch.nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._modules[name](x)

    with fv.record(device=_device()) as trace:
        Odd()(torch.randn(2, 4)).sum().backward()
    report = trace.to_html(tmp_path / "odd.html")
    context = browser.new_context()
    try:
        local_only(context)
        page = context.new_page()
        problems = PageProblems(page)
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.fvRendered !== undefined", timeout=10_000)
        assert page.evaluate("document.body.dataset.fvRendered") == "1"
        assert f"Odd.{name}" in _node_paths(page.locator("#fv-root"))
        problems.check()
    finally:
        context.close()


def _rgb(color: str) -> str:
    """``#4C78A8`` as the browser computes it: ``rgb(76, 120, 168)``."""
    return "rgb({}, {}, {})".format(*(int(color[i : i + 2], 16) for i in (1, 3, 5)))


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_report_draws_python_colours(tmp_path, browser, bundle, scheme):
    """The bars, timeline areas, phase bands and alias-graph edges are drawn in fakeviz._core.palette's colours
    (sent in the summary; js/ defines none), in light and in dark mode, whose theme still applies around them."""
    trace = _evil_trace()
    report = trace.to_html(tmp_path / "colours.html", "8GB")
    context = browser.new_context(color_scheme=scheme)
    try:
        local_only(context)
        page = context.new_page()
        problems = PageProblems(page)
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.fvRendered !== undefined", timeout=30_000)
        assert page.evaluate("document.body.dataset.fvRendered") == "1"
        categories = list(fv.CATEGORIES)

        def computed(selector: str, prop: str, key: str) -> list[tuple[str, str]]:
            return page.eval_on_selector_all(
                f"#fv-root {selector}", f"els => els.map(e => [{key}, getComputedStyle(e).{prop}])"
            )

        bars = computed(".fv-bars rect.fv-bar-seg", "fill", "e.dataset.category")
        assert bars and all(fill == _rgb(CATEGORY_COLORS[cat]) for cat, fill in bars), bars
        legend = computed(".fv-bars .fv-legend .fv-swatch", "backgroundColor", "e.className")
        assert legend and all(bg == _rgb(CATEGORY_COLORS[categories[int(c.split("fv-cat-")[1])]]) for c, bg in legend)
        areas = computed(".fv-timeline path.fv-area", "fill", "e.className.baseVal")
        assert areas and all(
            fill == _rgb(CATEGORY_COLORS[categories[int(c.split("fv-cat-")[1])]]) for c, fill in areas
        ), areas
        bands = computed(".fv-timeline rect.fv-phase", "fill", "e.dataset.phase")
        assert bands and all(fill == _rgb(PHASE_COLORS[phase]) for phase, fill in bands), bands
        edges = computed(".fv-alias path.fv-edge", "stroke", "e.className.baseVal")
        assert edges and all(stroke == _rgb(EDGE_COLORS[c.split("fv-edge-")[1].split()[0]]) for c, stroke in edges), (
            edges
        )
        # the theme around the data colours follows the colour scheme
        background = page.eval_on_selector("#fv-root .fv-root", "e => getComputedStyle(e).backgroundColor")
        assert background == ("rgb(255, 255, 255)" if scheme == "light" else "rgb(13, 17, 23)"), background
        problems.check()
    finally:
        context.close()


# --------------------------------------------------------------------- JupyterLab
@pytest.fixture(scope="module")
def lab(tmp_path_factory, bundle):
    """A JupyterLab server on 127.0.0.1 (token, temporary root with the explorer tour), always stopped."""
    reason = jupyter_missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab")
    explorer_tour.write(root / NOTEBOOK)
    explorer_tour.write(root / f"nb7_{NOTEBOOK}")
    with jupyter_server(root) as server:
        yield server


# Notebook 7.6's own start-up errors, on every page it serves (its /tree page with no notebook
# open too), from its bundled JupyterLab plugins and never from the explorer: its shortcuts plugin
# reads the settings schema of a plugin it has not loaded, and a plugin runs the file browser's
# open-path command that Notebook's notebook page does not register (now and then)
NOTEBOOK7_STARTUP_ERRORS = (
    ("Cannot read properties of undefined (reading 'schema')", "/static/notebook/notebook_core."),
    ("Command 'filebrowser:open-path' not registered", "/static/notebook/"),
)


def _open_and_run(browser: Any, lab: Any, path: str, ignore: Sequence[tuple[str, str]] = ()) -> tuple[Any, ...]:
    context = browser.new_context(viewport=LAB_VIEWPORT)
    blocked = local_only(context, lab.origin)
    page = context.new_page()
    problems = PageProblems(page, ignore)
    page.goto(lab.url(path))
    wait_kernel_idle(page)
    run_all_cells(page)
    wait_cells_done(page)
    return context, page, problems, blocked


def _code_cell(page: Any, source_start: str) -> Any:
    cells = page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea-editor", has_text=source_start)
    )
    assert cells.count() == 1, f"{cells.count()} code cells start with {source_start!r}"
    return cells.first


def test_jupyterlab_explorer(browser, lab, tmp_path):
    context, page, problems, blocked = _open_and_run(browser, lab, f"lab/tree/{NOTEBOOK}")
    try:
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
        assert not tracebacks, tracebacks
        # both the trace's own display and explore() render a full explorer
        page.wait_for_selector("[data-testid=fv-explorer] .fv-tree .fv-node", timeout=60_000)
        assert page.locator("[data-testid=fv-explorer]").count() == 2
        shown = _code_cell(page, "%%fake --device cuda:0").locator("[data-testid=fv-explorer]")
        _assert_views_rendered(shown)
        assert "fits" in shown.locator("[data-testid=fv-verdict]").inner_text()

        panel = _code_cell(page, "explorer = trace.explore").locator("[data-testid=fv-explorer]")
        _assert_views_rendered(panel)
        assert panel.locator("[data-testid=fv-size-by]").input_value() == "act_bytes"
        # the selection set from Python (a later cell) moved the panel
        page.wait_for_function(
            "(p) => [...document.querySelectorAll('[data-testid=fv-selection-label]')].some(e => e.textContent === p)",
            arg=PY_SELECTED,
            timeout=30_000,
        )
        _assert_linked_selection(panel, PY_SELECTED, r"layers\.\d+\.mlp")

        # a click in the tree selects the module and drills into it; every view follows
        _click_node(panel, CLICKED)
        _assert_linked_selection(panel, CLICKED, r"layers\.\d+\.self_attn")
        assert {f"{CLICKED}.q_proj", f"{CLICKED}.o_proj"} <= set(_node_paths(panel))
        assert panel.locator(".fv-breadcrumb .fv-crumb").all_inner_texts()[-1] == "self_attn"
        # the kernel redrew the alias graph around the clicked module: its parameters, highlighted
        info = panel.locator("[data-testid=fv-alias-info]")
        info.filter(has_text=f"around {CLICKED}").wait_for(timeout=30_000)
        names = [n.splitlines()[0] for n in panel.locator(".fv-alias .fv-anode-name title").all_text_contents()]
        assert names and all(".layers.0.self_attn." in n for n in names), names[:10]
        assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= {n.split(".")[-2] for n in names}
        assert panel.locator(".fv-alias .fv-anode.fv-highlight").count() >= len(names)
        # the other explorer keeps its own selection
        assert shown.locator(".fv-tree .fv-node.fv-selected").count() == 0
        panel.screenshot(path=str(tmp_path / "explorer_jupyterlab.png"))

        # the kernel saw the click: run the cell that prints the trait again
        cell = _code_cell(page, 'print("selected:"')
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        expect_text = f"selected: {CLICKED}"
        cell.locator(".jp-OutputArea-output", has_text=expect_text).wait_for(timeout=30_000)

        assert not blocked, f"JupyterLab tried to reach outside 127.0.0.1: {blocked}"
        problems.check()
    finally:
        context.close()


def test_notebook7_explorer(browser, lab):
    context, page, problems, blocked = _open_and_run(
        browser, lab, f"notebooks/nb7_{NOTEBOOK}", ignore=NOTEBOOK7_STARTUP_ERRORS
    )
    try:
        page.wait_for_selector("[data-testid=fv-explorer] .fv-tree .fv-node", timeout=60_000)
        assert page.locator("[data-testid=fv-explorer]").count() == 2
        panel = _code_cell(page, "explorer = trace.explore").locator("[data-testid=fv-explorer]")
        _assert_views_rendered(panel)
        _click_node(panel, CLICKED)
        _assert_linked_selection(panel, CLICKED, r"layers\.\d+\.self_attn")
        assert not blocked, f"Notebook 7 tried to reach outside 127.0.0.1: {blocked}"
        problems.check()
    finally:
        context.close()
