"""Issue 15: trace.panels() (linked plotly FigureWidgets), plotly.js once per notebook, the static fallback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fakeviz as fv

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from fakeviz._analysis.selection import module_ids  # noqa: E402
from fakeviz._core.gpus import Capacity  # noqa: E402
from fakeviz._views import panels as P  # noqa: E402
from fakeviz._views.static import plain_name, static_html  # noqa: E402

BUNDLE_BYTES = len(P._BUNDLE.read_text(encoding="utf-8"))
PANEL_LIMIT = 500_000  # bytes: what each figure or panel may add to a notebook, plotly.js aside


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 128)
        self.down = torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.fixture(scope="module")
def trace() -> fv.Trace:
    with fv.record(device="cuda:0", gpu="H100") as t:
        model = torch.nn.Sequential(Block(), torch.nn.ReLU(), Block())
        model(torch.randn(8, 32)).sum().backward()
    return t


def _published(obj: object) -> list[dict]:
    """What a real IPython shell publishes when ``obj`` is a cell's last expression."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.user_ns["obj"] = obj
    with capture_output() as cap:
        result = shell.run_cell("obj")
    assert result.success, result.error_in_exec
    return [o.data for o in cap.outputs]


def test_panels_figures_share_one_plotly_bundle(trace):
    p = trace.panels()
    figs = [p.tree, p.bars, p.timeline, p.graph]
    assert [f.data[0].type for f in figs[:1]] == ["icicle"] and len(p.children) == 4
    lib = P.plotly_library()
    assert len(lib.code) == BUNDLE_BYTES > 4_000_000  # plotly.js and plotly's widget code, held once
    for f in figs:
        assert f._fv_lib == lib.model_id  # every figure loads the one library
        assert len(f._esm) < 3_000  # a loader, not plotly.js
        assert len(json.dumps(f.get_state(), default=str)) < PANEL_LIMIT
    assert trace.panels().tree._fv_lib == lib.model_id  # a second panel reuses it
    # the axes fit the data, the capacity is named above them; full_capacity runs them up to it
    cap = Capacity.parse("H100").bytes
    assert p.bars.layout.yaxis.range[1] < cap and p.timeline.layout.yaxis.range[1] < cap
    full = trace.panels(full_capacity=True)
    assert full.bars.layout.yaxis.range[1] >= cap and full.timeline.layout.yaxis.range[1] >= cap


def test_click_in_the_icicle_shows_the_module_everywhere(trace):
    p = trace.panels()
    assert p._paths[0] == "Sequential"
    target = next(x for x in p._paths if x.endswith(".up"))
    shapes = len(p.timeline.layout.shapes)
    # what plotly's click callback hands over: the clicked sector's index
    p._on_click(p.tree.data[0], type("Points", (), {"point_inds": [p._paths.index(target)]})(), None)
    assert p.selected == target
    assert f"selected {target}" in p.bars.layout.title.text
    sel = next(tr for tr in p.bars.data if tr.name == "selected")
    assert sel.y[0] > 0  # the module's parameters are alive at the peak
    spans = [s for s in p.timeline.layout.shapes if s.name == "selected"]
    assert len(p.timeline.layout.shapes) == shapes + len(spans) and spans
    ran = np.flatnonzero(np.isin(trace.col("module"), module_ids(trace, target)))
    assert len(ran)
    assert all(any(s.x0 < q < s.x1 for s in spans) for q in ran)
    assert f"around {target}" in p.graph.layout.title.text
    # clearing restores every figure
    p.select("")
    assert "selected" not in p.bars.layout.title.text and len(p.timeline.layout.shapes) == shapes


def test_displays_write_the_static_summary_first(trace):
    """Note: [static fallback]: summary (text/html, no script), then the widget (widget-view + text/plain)."""
    for obj, label in ((trace, "explorer"), (trace.explore(), "explorer"), (trace.panels(), "panels")):
        first, second = _published(obj)
        assert set(first) == {"text/html", "text/plain"} and "data-fv-static" in first["text/html"]
        assert "<script" not in first["text/html"] and "fits: cuda:0" in first["text/html"]
        assert "application/vnd.jupyter.widget-view+json" in second and f"fakeviz {label}" in second["text/plain"]
        assert "text/html" not in second  # GitHub and nbviewer show the summary once
        static_id = first["text/html"].split("data-fv-static='")[1].split("'")[0]
        assert static_id  # the live widget hides the output holding this id
    # a bundle asked for directly carries all three
    bundle = trace.explore()._repr_mimebundle_()
    assert {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"} <= set(bundle)
    assert set(trace._repr_mimebundle_()) == {"text/plain", "text/html"}


def test_static_summary_names_what_a_user_needs():
    with fv.record(device="cuda:0", gpu="H100") as t:
        torch.nn.Linear(1024, 1024)(torch.randn(4, 1024)).sum().backward()
    html = static_html(t, 4 << 20)
    assert "does not fit 4.0 MiB" in html and "first fails at op" in html and " live" in html
    assert "reserved at peak" in html and "largest modules" in html and "Parameter" in html
    assert "<script" not in html and "http" not in html
    assert plain_name("a.\u202eb\u200f") == "a.<U+202E>b<U+200F>"


def test_notebook_sizes_plotly_once(tmp_path: Path):
    """Executed with nbclient (widget state stored, as JupyterLab's "save widget state" does): plotly's
    bundle is in the notebook once for three panels, each further panel adds under 500 KB; without widget
    state the notebook keeps the static summaries only."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    setup = (
        "import torch, fakeviz as fv\n"
        "with fv.record(device='cuda:0', gpu='H100') as trace:\n"
        "    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])\n"
        "    m(torch.randn(8, 64)).sum().backward()\n"
    )

    def run(cells: list[str]) -> dict:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in [setup, *cells]]
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True).execute()
        path = tmp_path / "nb.ipynb"
        nbformat.write(nb, path)
        return json.loads(path.read_text())

    one = run(["trace.panels()"])
    three = run(["trace.panels()", "trace.panels(measure='act_bytes')", "trace.panels()"])
    sizes = [len(json.dumps(nb)) for nb in (one, three)]
    for nb in (one, three):
        state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        big = [m for m in state.values() if len(json.dumps(m)) > PANEL_LIMIT]
        assert len(big) == 1 and big[0]["state"]["code"].startswith(P._BUNDLE.read_text(encoding="utf-8")[:200])
    assert (sizes[1] - sizes[0]) / 2 < PANEL_LIMIT  # each further panel
    assert sizes[0] < BUNDLE_BYTES + PANEL_LIMIT
    # saved without widget state: each panel output is its static summary and a line of text
    three["metadata"].pop("widgets")
    outputs = [o for c in three["cells"][1:] for o in c["outputs"]]
    assert len(outputs) == 6 and sum("data-fv-static" in "".join(o["data"].get("text/html", "")) for o in outputs) == 3
    assert len(json.dumps(three)) < 100_000
