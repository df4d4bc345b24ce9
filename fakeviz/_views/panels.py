"""Linked plotly panels: the layer tree icicle, memory bars, memory timeline and alias graph as ``FigureWidget``s.

``panels(trace)`` lays the four figures of :mod:`fakeviz.views` out in one ipywidgets ``VBox`` (one
figure per row, so it fits a narrow notebook column) and links them with plotly's click callback:
a click on a module in the icicle (which also drills into it) marks that module in the other three,
its share of each device's peak on the bars, the op ranges where it ran on the timeline, and its
storages and their aliases in the alias graph. :meth:`Panels.select` does the same from Python.

Note: [plotly.js once per notebook]
plotly's ``FigureWidget`` is an anywidget whose ``_esm`` is plotly's whole widget bundle
(``plotly/package_data/widgetbundle.js``: plotly.js and the widget code, about 5 MB). ``_esm`` is a
synced trait, so every figure sends it to the browser again and a notebook saved with widget state
stores it once per figure. :class:`FigureWidget` here replaces that ``_esm`` by a loader of a few
hundred bytes (``_LOADER``) that asks the widget manager for one shared :class:`PlotlyLibrary` model
(one per kernel, whose ``code`` trait holds the bundle) and imports the bundle from it once per page;
plotly's own widget code then runs unchanged on each figure's model. The bundle is sent, and stored
with widget state, once per kernel; each figure carries only its data and layout.

Saved without widget state, the panels show the static summary of the trace instead (Note: [static
fallback] in :mod:`fakeviz._views.explorer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import ipywidgets
import numpy as np
import plotly
import plotly.graph_objects as go
import traitlets

from .._analysis.selection import module_ids, module_storages, storage_modules
from .._analysis.tables import storages_table
from .._core.fmt import esc, format_bytes
from .._core.gpus import capacity_of
from .._core.record import Record
from .explorer import display_with_fallback, fallback_bundle
from .graph import alias_graph_data, alias_graph_figure
from .memory import bars_data, memory_bars_figure, memory_timeline_figure, pick_device
from .static import static_html
from .tree import layer_tree_figure

__all__ = ["FigureWidget", "Panels", "PlotlyLibrary", "panels", "plotly_library"]

_BUNDLE = Path(plotly.__file__).resolve().parent / "package_data" / "widgetbundle.js"

# Note: [plotly.js once per notebook]: the figure's ESM, a loader of plotly's bundle held by the library model
_LOADER = """
const cache = (globalThis.__fakevizPlotly ??= new Map());
async function bundle(model) {
  let id = model.get("_fv_lib");
  for (let i = 0; !id && i < 50; i++) { await new Promise((r) => setTimeout(r, 20)); id = model.get("_fv_lib"); }
  if (!cache.has(id)) {
    cache.set(id, model.widget_manager.get_model(id).then((lib) => {
      const url = URL.createObjectURL(new Blob([lib.get("code")], { type: "text/javascript" }));
      return import(/* webpackIgnore: true */ url);
    }));
  }
  return cache.get(id);
}
function hideStatic(id) {
  if (!id) return;
  for (const node of document.querySelectorAll("[data-fv-static]")) {
    if (node.getAttribute("data-fv-static") === id) (node.closest(".jp-OutputArea-child") || node).style.display = "none";
  }
}
export default () => {
  let inner = null;
  const ready = async (model) => {
    if (!inner) {
      const mod = await bundle(model);
      inner = typeof mod.default === "function" ? await mod.default() : mod.default;
    }
    return inner;
  };
  return {
    async initialize(ctx) { return (await ready(ctx.model)).initialize?.(ctx); },
    async render(ctx) { hideStatic(ctx.model.get("_fv_static")); return (await ready(ctx.model)).render(ctx); },
  };
};
"""


class PlotlyLibrary(anywidget.AnyWidget):
    """Holds plotly's widget bundle once per kernel for every :class:`FigureWidget` (draws nothing)."""

    _esm = "export default {};"
    code = traitlets.Unicode("", help="plotly's widget bundle (plotly.js and its widget code)").tag(sync=True)


_LIBRARY: PlotlyLibrary | None = None


def plotly_library() -> PlotlyLibrary:
    """The kernel's one :class:`PlotlyLibrary` (made again if it was closed)."""
    global _LIBRARY
    if _LIBRARY is None or getattr(_LIBRARY, "comm", None) is None:
        _LIBRARY = PlotlyLibrary(code=_BUNDLE.read_text(encoding="utf-8"))
    return _LIBRARY


class FigureWidget(go.FigureWidget):
    """plotly's ``FigureWidget`` whose JavaScript is shipped once per kernel (Note: [plotly.js once per notebook])."""

    _esm = _LOADER
    _fv_lib = traitlets.Unicode("", help="model id of the PlotlyLibrary holding plotly's bundle").tag(sync=True)
    _fv_static = traitlets.Unicode("", help="data-fv-static of the summary this figure hides when live").tag(sync=True)

    @traitlets.default("_fv_lib")
    def _library_id(self) -> str:
        return plotly_library().model_id


class Panels(ipywidgets.VBox):
    """The four linked figures (:attr:`tree`, :attr:`bars`, :attr:`timeline`, :attr:`graph`) in one column.

    :attr:`selected` is the selected module (a folded tree path such as ``Llama.model.layers.0-79.mlp``,
    or ``""``); a click in the icicle sets it, :meth:`select` sets it from Python.
    """

    selected = traitlets.Unicode("", help="the selected module ('' = none)")

    def __init__(self, trace: Record, capacity: Any = None, *, device: str | None = None, measure: str = "params",
                 max_points: int = 2000, alias_nodes: int = 60, full_capacity: bool = False) -> None:  # fmt: skip
        self._trace = trace
        self._capacity = capacity_of(trace.meta, capacity)
        cap = self._capacity.bytes if self._capacity is not None else None
        self._device = pick_device(trace, device)
        self._alias_nodes = alias_nodes
        self._storage_module = storage_modules(trace)
        self._static_id = f"fv-panels-{id(self):x}"
        tree_fig = layer_tree_figure(trace, measure)
        self._tree_ids = list(tree_fig.data[0].ids or ())
        self._paths = _unescaped_ids(trace, measure, self._tree_ids)
        self._bars_data = bars_data(trace, cap)
        bars_fig = memory_bars_figure(self._bars_data, full_capacity=full_capacity)
        timeline_fig = memory_timeline_figure(
            trace, self._device, max_points, capacity=cap, full_capacity=full_capacity
        )
        graph_fig = alias_graph_figure(trace, max_nodes=alias_nodes)
        self.tree = FigureWidget(_sized(tree_fig, 420))
        self.tree._fv_static = self._static_id
        self.bars = FigureWidget(_sized(bars_fig, 380))
        self.timeline = FigureWidget(_sized(timeline_fig, 380))
        self.graph = FigureWidget(_sized(graph_fig, None))
        self._base_shapes = tuple(self.timeline.layout.shapes or ())
        self._base_title = self.bars.layout.title.text
        self.tree.data[0].on_click(self._on_click)
        super().__init__(
            children=[self.tree, self.bars, self.timeline, self.graph],
            layout=ipywidgets.Layout(width="100%", max_width="100%"),
        )

    # ------------------------------------------------------------------ linking
    def _on_click(self, _trace: Any, points: Any, _state: Any) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        if inds and 0 <= inds[0] < len(self._paths):
            self.select(self._paths[inds[0]])

    def select(self, module: str | None) -> None:
        """Show ``module`` (a folded tree path or a module path; ``None``/``""``: none) in the linked figures."""
        self.selected = module or ""

    @traitlets.observe("selected")
    def _show(self, change: Any) -> None:
        module = change["new"]
        ids = module_ids(self._trace, module) if module else np.zeros(0, np.int64)
        self._mark_bars(module, ids)
        self._mark_timeline(module, ids)
        self._redraw_graph(module, ids)

    def _mark_bars(self, module: str, ids: np.ndarray) -> None:
        """A marker per device at the bytes the module holds at that device's peak, and a line in the title."""
        t = self._bars_data.table
        st = storages_table(self._trace)
        owned = np.isin(self._storage_module, ids) if len(ids) else np.zeros(len(st), bool)
        alloc, free = st["alloc_seq"].to_numpy(), st["free_seq"].to_numpy()
        nbytes, dev_col = st["nbytes"].to_numpy(), st["device"].astype(object).to_numpy()
        share = []
        for dev, seq in zip(t["device"], t["seq"]):
            alive = owned & (dev_col == dev) & (np.maximum(alloc, 0) <= seq) & ((free < 0) | (free > seq))
            share.append(int(nbytes[alive].sum()))
        with self.bars.batch_update():
            self.bars.data = [tr for tr in self.bars.data if tr.name != "selected"]
            title = self._base_title
            if module:
                self.bars.add_trace(
                    go.Scatter(
                        x=[esc(d) for d in t["device"]], y=share, mode="markers", name="selected",
                        marker=dict(symbol="line-ew", size=60, line=dict(width=4, color="#111111")),
                        hovertext=[f"{esc(module)} holds {format_bytes(b)} at the peak of {esc(d)}"
                                   for d, b in zip(t["device"], share)], hoverinfo="text",
                    )
                )  # fmt: skip
                held = ", ".join(f"{esc(d)} {format_bytes(b)}" for d, b in zip(t["device"], share))
                title = f"{title}<br><sup>selected {esc(module)}: holds {held} at the peak</sup>"
            self.bars.layout.title.text = title

    def _mark_timeline(self, module: str, ids: np.ndarray, max_spans: int = 200) -> None:
        """Shade the op ranges where the module ran (at most ``max_spans``, the longest)."""
        spans: list[dict[str, Any]] = []
        if module and len(ids):
            ran = np.isin(self._trace.col("module"), ids)
            edges = np.flatnonzero(np.diff(np.concatenate([[0], ran.astype(np.int8), [0]])))
            starts, stops = edges[0::2], edges[1::2]
            if len(starts) > max_spans:
                keep = np.sort(np.argsort(stops - starts, kind="stable")[-max_spans:])
                starts, stops = starts[keep], stops[keep]
            spans = [
                dict(type="rect", xref="x", yref="paper", x0=a - 0.5, x1=b - 0.5, y0=0, y1=1, layer="above",
                     fillcolor="rgba(17,17,17,0.12)", line=dict(width=0), name="selected")
                for a, b in zip(starts.tolist(), stops.tolist())
            ]  # fmt: skip
        with self.timeline.batch_update():
            self.timeline.layout.shapes = self._base_shapes + tuple(spans)

    def _redraw_graph(self, module: str, ids: np.ndarray) -> None:
        """The alias graph around the module's storages (the whole run's most telling ones when none)."""
        if module and len(ids):
            sids = module_storages(self._trace, self._storage_module, ids, limit=max(1, self._alias_nodes // 3))
            around = ("storages", sids) if sids else None
        else:
            around = None
        data = alias_graph_data(self._trace, around, self._alias_nodes)
        if module:
            data.around = module
        fig = _sized(alias_graph_figure(data), None)
        with self.graph.batch_update():
            self.graph.data = []
            self.graph.add_traces(list(fig.data))
            self.graph.layout = fig.layout

    # ------------------------------------------------------------------ display
    def _static_html(self) -> str:
        return static_html(self._trace, self._capacity.bytes if self._capacity is not None else None,
                           static_id=self._static_id)  # fmt: skip

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget view plus ``text/plain`` and the static summary as ``text/html``."""
        return fallback_bundle(super()._repr_mimebundle_(**kwargs), self._static_html(), "fakeviz panels")

    def _ipython_display_(self) -> None:
        """The static summary, then the panels (which hide it while they live): Note: [static fallback]."""
        display_with_fallback(super()._repr_mimebundle_(), self._static_html(), "fakeviz panels")


def panels(trace: Record, capacity: Any = None, **kwargs: Any) -> Panels:
    """The linked plotly panels of ``trace`` (see the module docstring).

    Args:
        trace: the record.
        capacity: a GPU name, bytes or a size (default the record's own), drawn as a line.
        **kwargs: ``device`` (the timeline's device), ``measure`` (what sizes the icicle),
            ``max_points`` (timeline points), ``alias_nodes`` (the most alias-graph nodes) and
            ``full_capacity`` (run the y axes up to the capacity instead of fitting the data).
    """
    return Panels(trace, capacity, **kwargs)


def _sized(fig: Any, height: int | None) -> Any:
    """``fig`` at the column's width (autosize), ``height`` px when given, with margins a narrow column affords."""
    fig.update_layout(autosize=True, width=None)
    if height is not None:
        fig.update_layout(height=height)
    return fig


def _unescaped_ids(trace: Record, measure: str, shown: list[str]) -> list[str]:
    """The module path of each drawn icicle sector (the figure holds them HTML-escaped)."""
    from .tree import tree_data

    by_escaped = {esc(x): str(x) for x in tree_data(trace, measure).table["id"]}
    return [by_escaped.get(i, i) for i in shown]
