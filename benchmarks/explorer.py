"""The explorer's cost on Llama-3-70B and 405B fwd+bwd traces (bf16, batch 1, seq 2048, fake cuda:0).

For each model it records the run once (timed) and reports

  * ``build_ratio``: ``Explorer.from_trace`` time (cold analysis cache, as right after a
    recording) / recording time of the same run;
  * ``alias_redraw_s``: a click in the tree with a live kernel redraws the alias graph around
    the module in Python (the MLP blocks, layer 0's attention, then back to no selection),
    and ``alias_redraw_ratio_max``, the slowest of them / recording time;
  * ``sent_bytes``: what the widget sends to the browser: its whole state (JSON) plus its
    binary buffers, ``_esm`` and ``_css`` included, and the share of each trait;
  * ``notebook_added_bytes``: a notebook that records the run and shows ``trace.explore()``,
    executed with nbclient (widget state stored, as JupyterLab saves it) and written, minus
    the same notebook with that display and the widget state cleared (goal < 2 MB);
  * ``first_paint_ms``: a ``trace.to_html`` report opened from a file in Chromium, offline:
    ms from navigation start to the first tree node in the DOM and to two animation frames
    later (painted), median of a few loads (goal < 3 s);
  * for the 70B, the same explorer in JupyterLab 4: ms from the widget's output arriving
    in the notebook to its first tree node, and a screenshot after a click on the MLP
    blocks (``results/explorer_jupyterlab.png``);
  * the anchor: the same views as plotly ``FigureWidget`` s (fakeviz.views), each one's
    state size (plotly.js travels as each widget's ``_esm``).

    python benchmarks/explorer.py [--models llama3-70b llama3-405b] [--layers N] [--seq 2048]
                                  [--skip-notebook] [--skip-browser] [--skip-lab] [--loads 5]

Needs the test extra (nbclient, playwright, jupyterlab) and Debian's chromium for the browser
parts. Results are printed and written to benchmarks/results/explorer.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # browser_util: Chromium and JupyterLab helpers

CLICK = "LlamaForCausalLM.model.layers.0-{last}.mlp"


def _record(name: str, layers: int | None, seq: int) -> tuple[Any, float, Any]:
    import torch

    import fakeviz as fv
    from fakeviz import models

    cfg = models.config(name, **({"num_hidden_layers": layers} if layers else {}))
    gc.collect()
    t0 = time.perf_counter()
    with fv.record(device="cuda:0") as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        model(ids, labels=ids).loss.backward()
    t_record = time.perf_counter() - t0
    del model
    gc.collect()
    return trace, t_record, cfg


def _state_bytes(widget: Any) -> dict[str, Any]:
    """Bytes of a widget's state as the comm sends it: JSON (less buffers) + binary buffers."""
    from ipywidgets.widgets.widget import _remove_buffers

    state = widget.get_state()
    per: dict[str, int] = {}
    for key, value in state.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            per[key] = memoryview(value).nbytes
        else:
            per[key] = len(json.dumps({key: value}, separators=(",", ":"), default=str).encode())
    stripped, _paths, buffers = _remove_buffers(state)
    json_bytes = len(json.dumps(stripped, separators=(",", ":"), default=str).encode())
    buf_bytes = sum(memoryview(b).nbytes for b in buffers)
    return {"total": json_bytes + buf_bytes, "json": json_bytes, "buffers": buf_bytes, "by_trait": per}


def _explorer_build(trace: Any, t_record: float) -> tuple[Any, dict[str, Any]]:
    from fakeviz._views.explorer import Explorer

    trace.clear_memo()
    gc.collect()
    t0 = time.perf_counter()
    w = Explorer.from_trace(trace, "H100")
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    Explorer.from_trace(trace, "H100")
    warm = time.perf_counter() - t0
    # a click in the tree (live kernel): the alias graph is redrawn around the module, in Python
    redraw = []
    layers = sum(1 for m in trace.strings("modules") if re.fullmatch(r".*\.layers\.\d+", m))
    for path in (CLICK.format(last=layers - 1), "LlamaForCausalLM.model.layers.0.self_attn", ""):
        t0 = time.perf_counter()
        w.selected_module = path
        redraw.append(time.perf_counter() - t0)
    return w, {
        "record_s": round(t_record, 3),
        "build_s": round(cold, 3),
        "build_ratio": round(cold / t_record, 4),
        "build_warm_s": round(warm, 3),
        "build_warm_ratio": round(warm / t_record, 4),
        "alias_redraw_s": [round(x, 3) for x in redraw],
        "alias_redraw_ratio_max": round(max(redraw) / t_record, 4),
    }


def _plotly_anchor(trace: Any) -> dict[str, Any]:
    """The same views as plotly FigureWidgets (what fakeviz.views draws)."""
    import plotly.graph_objects as go

    from fakeviz import views

    figs = {
        "layer_tree": lambda: views.layer_tree_figure(trace),
        "memory_bars": lambda: views.memory_bars_figure(trace, "H100"),
        "memory_timeline": lambda: views.memory_timeline_figure(trace, capacity="H100"),
        "alias_graph": lambda: views.alias_graph_figure(trace),
        "ops_table": lambda: views.ops_table_figure(trace),
    }
    out: dict[str, Any] = {}
    for name, make in figs.items():
        try:
            st = _state_bytes(go.FigureWidget(make()))
        except Exception as exc:  # noqa: BLE001 - an anchor only: say why it is missing
            out[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
            continue
        esm = st["by_trait"].get("_esm", 0)
        out[name] = {"total": st["total"], "without_esm": st["total"] - esm, "esm": esm}
    out["note"] = (
        "each FigureWidget carries plotly.js as its own _esm (saved once per widget in a notebook); "
        "ops_table is fakeviz.views.ops_table_figure's default first 500 rows, the explorer sends every op"
    )
    sized = [v for v in out.values() if isinstance(v, dict)]
    out["all_figures_total"] = sum(v["total"] for v in sized)
    out["all_figures_without_esm"] = sum(v["without_esm"] for v in sized)
    return out


def _record_cell(name: str, seq: int, layers: int | None):
    """The notebook cell that records the model's fwd+bwd as ``trace``."""
    import nbformat

    overrides = f", num_hidden_layers={layers}" if layers else ""
    return nbformat.v4.new_code_cell(
        "import torch, fakeviz as fv\nfrom fakeviz import models\n"
        f"cfg = models.config({name!r}{overrides})\n"
        'with fv.record(device="cuda:0") as trace:\n'
        "    model = models.build(cfg, dtype=torch.bfloat16)\n"
        f"    ids = torch.randint(0, cfg.vocab_size, (1, {seq}))\n"
        "    model(ids, labels=ids).loss.backward()\n"
        "del model"
    )


def _notebook_bytes(name: str, layers: int | None, seq: int, workdir: Path) -> dict[str, Any]:
    """Bytes that displaying the explorer adds to a saved notebook (nbclient keeps the widget state)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(
        cells=[
            _record_cell(name, seq, layers),
            nbformat.v4.new_code_cell('trace.explore("H100")'),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = env_path
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=1200, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(workdir)}}).execute()  # fmt: skip
    t_exec = time.perf_counter() - t0
    full = workdir / f"{name}_with_explorer.ipynb"
    nbformat.write(nb, full)
    widget_meta = json.dumps(nb.metadata.get("widgets", {}), separators=(",", ":"))
    display = json.dumps(nb.cells[1].outputs, separators=(",", ":"))
    nb.cells[1].outputs = []
    nb.metadata.pop("widgets", None)
    bare = workdir / f"{name}_cleared.ipynb"
    nbformat.write(nb, bare)
    added = full.stat().st_size - bare.stat().st_size
    return {
        "saved_bytes": full.stat().st_size,
        "cleared_bytes": bare.stat().st_size,
        "notebook_added_bytes": added,
        "widget_state_metadata_bytes": len(widget_meta),
        "display_output_bytes": len(display),
        "goal_bytes": 2_000_000,
        "meets_goal": added < 2_000_000,
        "execute_s": round(t_exec, 1),
    }


def _first_paint(trace: Any, workdir: Path, loads: int) -> dict[str, Any]:
    """A to_html report in Chromium (file:, offline): ms from navigation start to the first painted tree."""
    from browser_util import FIRST_PAINT_PROBE, PageProblems, launch, local_only
    from playwright.sync_api import sync_playwright

    report = trace.to_html(workdir / "report.html", "H100")
    nodes, paints, loaded = [], [], []
    with sync_playwright() as p:
        browser = launch(p)
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1440, "height": 1000})
                blocked = local_only(context)
                context.set_offline(True)
                page = context.new_page()
                problems = PageProblems(page)
                page.add_init_script(FIRST_PAINT_PROBE)
                page.goto(report.as_uri(), timeout=120_000)
                page.wait_for_function("window.__fvFirstPaint != null", timeout=120_000, polling=50)
                assert page.evaluate("document.body.dataset.fvRendered") == "1"
                nodes.append(page.evaluate("window.__fvFirstNode"))
                paints.append(page.evaluate("window.__fvFirstPaint"))
                loaded.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
                problems.check()
                assert not blocked, blocked
                context.close()
        finally:
            browser.close()
    return {
        "report_bytes": report.stat().st_size,
        "loads": loads,
        "first_node_ms": round(statistics.median(nodes), 1),
        "first_paint_ms": round(statistics.median(paints), 1),
        "first_paint_ms_all": [round(v, 1) for v in paints],
        "load_event_end_ms": round(statistics.median(loaded), 1),
        "goal_ms": 3000,
        "meets_goal": statistics.median(paints) < 3000,
    }


def _jupyterlab(name: str, layers: int | None, seq: int, n_layers: int, workdir: Path, shot: Path) -> dict[str, Any]:
    """The explorer of the run in JupyterLab 4: render time after the output arrives, and a screenshot."""
    import nbformat
    from browser_util import (
        FIRST_PAINT_PROBE,
        PageProblems,
        jupyter_server,
        launch,
        local_only,
        run_all_cells,
        wait_cells_done,
        wait_kernel_idle,
    )
    from playwright.sync_api import sync_playwright

    root = workdir / "lab"
    root.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(f"# fakeviz explorer: {name}, bf16, batch 1, seq {seq}, fwd+bwd"),
            _record_cell(name, seq, layers),
            nbformat.v4.new_code_cell('explorer = trace.explore("H100")\nexplorer'),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "explorer.ipynb")
    click = CLICK.format(last=n_layers - 1)
    with jupyter_server(root) as server, sync_playwright() as p:
        browser = launch(p)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 2600})
            blocked = local_only(context, server.origin)
            page = context.new_page()
            problems = PageProblems(page)
            page.add_init_script(FIRST_PAINT_PROBE)
            page.goto(server.url("lab/tree/explorer.ipynb"))
            wait_kernel_idle(page)
            run_all_cells(page)
            wait_cells_done(page, limit=1_200_000)
            page.wait_for_function("window.__fvFirstPaint != null", timeout=120_000, polling=50)
            out_at, node_at, paint_at = page.evaluate(
                "[window.__fvOutputAt, window.__fvFirstNode, window.__fvFirstPaint]"
            )
            panel = page.locator("[data-testid=fv-explorer]").first
            panel.locator(f'.fv-tree .fv-node[data-path="{click}"]').click()
            page.wait_for_selector(".fv-timeline .fv-span.fv-highlight")
            page.locator(".jp-Notebook").evaluate("n => n.scrollTop = 0")
            panel.scroll_into_view_if_needed()
            panel.screenshot(path=str(shot))
            problems.check()
            assert not blocked, blocked
            context.close()
        finally:
            browser.close()
    return {
        "output_to_first_node_ms": round(node_at - out_at, 1) if out_at is not None else None,
        "output_to_first_paint_ms": round(paint_at - out_at, 1) if out_at is not None else None,
        "screenshot": str(shot.relative_to(REPO)) if shot.is_relative_to(REPO) else str(shot),
        "clicked": click,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["llama3-70b", "llama3-405b"])
    ap.add_argument("--layers", type=int, default=None, help="fewer layers for a quick run")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--loads", type=int, default=5, help="report loads timed in Chromium")
    ap.add_argument("--skip-notebook", action="store_true")
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--skip-lab", action="store_true")
    args = ap.parse_args()

    from browser_util import browser_missing, jupyter_missing

    import fakeviz as fv

    if not fv.fake_cuda_status().cuda_ok:
        raise SystemExit("no fake cuda in this process (the shim needs a C++ compiler): cannot record on cuda:0")
    no_browser = None if not args.skip_browser else "skipped (--skip-browser)"
    no_browser = no_browser or browser_missing()
    results: dict[str, Any] = {
        "setup": f"bf16, batch 1, seq {args.seq}, fwd+bwd, fake cuda:0{f', {args.layers} layers' if args.layers else ''}; "
        "capacity H100; Chromium headless (Debian), offline",
        "models": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="fv-explorer-bench-"))
    try:
        for name in args.models:
            print(f"== {name}", flush=True)
            trace, t_record, cfg = _record(name, args.layers, args.seq)
            widget, timing = _explorer_build(trace, t_record)
            res: dict[str, Any] = {"ops": trace.num_ops, **timing}
            res["sent_bytes"] = _state_bytes(widget)
            print(json.dumps({k: v for k, v in res.items() if k != "sent_bytes"}), flush=True)
            res["plotly_figurewidget_anchor"] = _plotly_anchor(trace)
            if not args.skip_notebook:
                res["notebook"] = _notebook_bytes(name, args.layers, args.seq, workdir)
                print(json.dumps(res["notebook"]), flush=True)
            if no_browser:
                res["browser"] = f"not measured: {no_browser}"
            else:
                res["report_first_paint"] = _first_paint(trace, workdir, args.loads)
                print(json.dumps(res["report_first_paint"]), flush=True)
                lab_reason = "skipped (--skip-lab)" if args.skip_lab else jupyter_missing()
                if name == args.models[0] and not lab_reason:
                    full = args.layers is None and args.seq == 2048
                    shot = (HERE / "results" if full else Path(tempfile.gettempdir())) / "explorer_jupyterlab.png"
                    res["jupyterlab"] = _jupyterlab(name, args.layers, args.seq, cfg.num_hidden_layers, workdir, shot)
                    print(json.dumps(res["jupyterlab"]), flush=True)
                elif lab_reason:
                    res["jupyterlab"] = f"not measured: {lab_reason}"
            results["models"][name] = res
            del trace, widget
            gc.collect()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.layers is None and args.seq == 2048:
        out = HERE / "results" / "explorer.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    else:
        print("(a reduced run: benchmarks/results/explorer.json left as it was)")


if __name__ == "__main__":
    main()
