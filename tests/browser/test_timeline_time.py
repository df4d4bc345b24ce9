"""The timeline's time axis in a real browser (issue 32): Debian's Chromium driven by Playwright.

* ``test_report_time_axis``: a ``trace.to_html`` report opened offline; the x-axis control switches the memory
  timeline from op index to the estimated time on the record's GPU: the ticks are seconds up to the step's
  estimated end, the peak sits at its op's end, and hovering an op shows its estimated time and bound, as
  ``trace.time(gpu)`` gives them.
* ``test_jupyterlab_time_axis``: JupyterLab 4 runs a notebook that shows ``trace.explore(x_axis="time")`` and then
  sets ``explorer.gpu = "A100"`` from Python: the panel redraws on the A100's times; switching the axis back in the
  browser reaches the kernel (a re-run cell prints ``x_axis``).

Any console error, uncaught page error or dialog fails a test; skipped, saying why, without Chromium, playwright
or JupyterLab.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import nbformat as nbf
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
from nbcells import write_notebook

import fakeviz as fv
from fakeviz._core.fmt import format_seconds as _seconds  # what js/src/format.js's fmtSeconds writes

warnings.filterwarnings("ignore", message=".*loss_type=None.*")

pytestmark = [pytest.mark.browser, pytest.mark.skipif(bool(browser_missing()), reason=str(browser_missing()))]


@pytest.fixture(scope="module")
def bundle() -> Path:
    """The explorer's ES module (browser_util.built_bundle: rebuilt from js/ when npm is here)."""
    out = built_bundle()
    if out is None:
        pytest.skip("npm is not installed and fakeviz/static/explorer.js was never built")
    return out


def _mlp_step() -> fv.Trace:
    """A 4-block MLP's training step on a fake L4 (large enough for compute- and memory-bound kernels)."""
    device = "cuda:0" if fv.fake_cuda_status().cuda_ok else "cpu"
    with fv.record(device=device, **({"gpu": "L4"} if device.startswith("cuda") else {})) as trace:
        model = torch.nn.Sequential(
            *[torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU()) for _ in range(4)]
        )
        x = torch.randn(4096, 2048)
        model(x).square().mean().backward()
        torch.optim.AdamW(model.parameters()).step()
    return trace


def _ticks(root: Any) -> list[str]:
    return root.locator(".fv-timeline .fv-tl-device").first.locator(".fv-tick").all_text_contents()


def test_report_time_axis(tmp_path, browser, bundle):
    trace = _mlp_step()
    gpu = trace.meta.get("gpu") or "H100"
    times = trace.time(gpu)
    end = float(times["end_s"].astype("float32").iloc[-1])
    report = trace.to_html(tmp_path / "time.html")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        blocked = local_only(context)
        context.set_offline(True)
        page = context.new_page()
        problems = PageProblems(page)
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.fvRendered !== undefined", timeout=30_000)
        assert page.evaluate("document.body.dataset.fvRendered") == "1", page.inner_text("#fv-root")[:2000]
        root = page.locator("#fv-root")
        axis = root.locator("[data-testid=fv-x-axis]")
        assert axis.is_visible() and axis.input_value() == "op"
        assert axis.locator("option").all_inner_texts() == ["x: op index", f"x: estimated time on {gpu}"]
        step = trace.step_time(gpu)
        assert root.locator("[data-testid=fv-step-time]").inner_text() == (
            f"estimated step {_seconds(step.step_s)} on {gpu} ({step.bound} bound); timed: {step.timed}"
        )  # which step it timed (Note: [one step])
        assert _ticks(root)[0] == "op 0"

        axis.select_option("time")
        assert _ticks(root) == ["0 s", _seconds(end / 2), _seconds(end)]
        assert f"x: estimated time on {gpu}" in root.locator(".fv-tl-title").first.inner_text()
        # the peak sits at its op's estimated end
        pk = trace.peak()[trace.meta["device"] if trace.meta["device"] in trace.peak() else next(iter(trace.peak()))]
        overlay = root.locator(".fv-timeline .fv-overlay").first
        left, width = float(overlay.get_attribute("x")), float(overlay.get_attribute("width"))
        peak_x = float(root.locator(".fv-peak-line").first.get_attribute("x1"))
        assert (peak_x - left) / width == pytest.approx(float(times["end_s"].iloc[pk.seq]) / end, abs=2e-3)

        # hover the middle of the longest op: the tooltip names it with its estimated time and bound
        longest = int(times["est_s"].idxmax())
        row = times.iloc[longest]
        t_mid = float(row["end_s"] - row["est_s"] / 2)
        box = overlay.bounding_box()
        overlay.hover(position={"x": box["width"] * t_mid / end, "y": box["height"] / 2})
        tooltip = root.locator("[data-testid=fv-tooltip]").first
        text = tooltip.inner_text()
        assert text.startswith(f"op {longest:,}"), text
        assert f"est {_seconds(row['est_s'])} · {row['bound']} bound · {row['cls']}" in text, text
        assert f"ends at {_seconds(row['end_s'])} on {gpu}" in text, text

        root.locator("[data-testid=fv-timeline]").screenshot(path=str(tmp_path / "time_axis.png"))

        # and back to the op index
        axis.select_option("op")
        assert _ticks(root)[0] == "op 0"
        assert not blocked, f"the report tried to fetch: {blocked}"
        problems.check()
    finally:
        context.close()


NOTEBOOK = "time_axis.ipynb"
_cells = [
    nbf.v4.new_code_cell("import torch\nimport fakeviz as fv"),
    nbf.v4.new_code_cell(
        'with fv.record(device="cuda:0", gpu="L4") as trace:\n'
        "    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048))\n"
        "    model(torch.randn(4096, 2048)).square().mean().backward()"
    ),
    nbf.v4.new_code_cell('explorer = trace.explore(x_axis="time")\nexplorer'),
    nbf.v4.new_code_cell('explorer.gpu = "A100"'),
    nbf.v4.new_code_cell('print("x_axis:", explorer.x_axis, explorer.gpu)'),
]


@pytest.mark.skipif(bool(jupyter_missing()), reason=str(jupyter_missing()))
@pytest.mark.skipif(not fv.fake_cuda_status().cuda_ok, reason="no fake cuda in this process")
def test_jupyterlab_time_axis(tmp_path, browser, bundle):
    write_notebook(_cells, tmp_path / NOTEBOOK)
    with jupyter_server(tmp_path) as lab:
        context = browser.new_context(viewport={"width": 1440, "height": 1100})
        try:
            blocked = local_only(context, lab.origin)
            page = context.new_page()
            problems = PageProblems(page)
            page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
            wait_kernel_idle(page)
            run_all_cells(page)
            wait_cells_done(page)
            panel = page.locator(".jp-CodeCell", has=page.locator(".jp-InputArea-editor", has_text="explorer = trace"))
            root = panel.locator("[data-testid=fv-explorer]")
            root.locator(".fv-timeline .fv-tick").first.wait_for(timeout=60_000)
            axis = root.locator("[data-testid=fv-x-axis]")
            # the later cell's explorer.gpu = "A100" re-estimated the times in Python and the panel redrew them
            page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=fv-step-time]')].some(e => /on A100/.test(e.textContent))",
                timeout=30_000,
            )
            assert axis.input_value() == "time"
            assert axis.locator("option").all_inner_texts()[1] == "x: estimated time on A100"
            assert _ticks(root)[0] == "0 s" and re.fullmatch(r"[\d.]+ (s|ms|µs)", _ticks(root)[-1])
            # the browser's switch reaches the kernel
            axis.select_option("op")
            assert _ticks(root)[0] == "op 0"
            cell = page.locator(".jp-CodeCell", has=page.locator(".jp-InputArea-editor", has_text='print("x_axis:"'))
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            cell.locator(".jp-OutputArea-output", has_text="x_axis: op A100").wait_for(timeout=30_000)
            panel.screenshot(path=str(tmp_path / "time_axis_lab.png"))
            assert not blocked, f"JupyterLab tried to reach outside 127.0.0.1: {blocked}"
            problems.check()
        finally:
            context.close()
