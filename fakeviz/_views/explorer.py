"""The explorer panel: an anywidget that shows a :class:`~fakeviz.Trace` in the browser.

``Explorer.from_trace(trace, capacity=None)`` computes everything the panel needs
once, in Python (:func:`fakeviz._views.payload.build_state`), and ships it as JSON and a
few compact binary buffers; all linking between the views (layer tree, memory bars,
memory timeline, alias graph, ops table) then happens in the browser, without a round
trip to the kernel, so a saved notebook keeps working without one.

The browser code is ``js/src/explorer.js``, bundled by esbuild into
``fakeviz/static/explorer.js`` (``npm run build`` in ``js/``, or any wheel build
through hatch-jupyter-builder).

Traits
------
Data (Python -> browser; the traits are the source of truth, the panel never writes them):
``summary``, ``tree``, ``memory``, ``ops``, ``alias`` and ``time``, described in :mod:`fakeviz._views.payload`.
When the kernel is alive and a module is selected, ``alias`` is redrawn in Python around
that module on each selection; setting ``gpu`` recomputes ``time`` on that GPU.

Selection (both ways): ``selected_module`` (a folded tree path such as
``Llama.model.layers.0-79.mlp``, or any module path of the trace), ``device``
(``""`` = all), ``phase`` (``""`` = all), ``search`` (text over module paths) and
``size_by`` (the tree figure that sizes the icicle) and ``x_axis`` (the timeline's x axis: ``"op"``, the op
index, or ``"time"``, each op at its estimated end on ``gpu``: Note: [time model] in
:mod:`fakeviz._analysis.timing`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets
from ipywidgets.widgets.trait_types import bytes_serialization

from .._analysis.selection import storage_modules
from .._core.gpu_specs import gpu_spec
from .._core.record import Record
from .._core.schema import PHASES
from .payload import SIZE_BY, alias_pack, build_state, time_gpu, time_pack, unpack
from .static import static_html

__all__ = ["STATIC", "X_AXES", "Explorer", "display_with_fallback", "fallback_bundle"]

STATIC = Path(__file__).resolve().parent.parent / "static"
_BUNDLE = STATIC / "explorer.js"
_STYLES = STATIC / "explorer.css"
X_AXES = ("op", "time")  # the timeline's x axis: op index, or estimated time
_PACKED = ("tree", "memory", "ops", "alias", "time")


def _bytes_trait(help: str) -> traitlets.Bytes:
    """A binary trait synced with the browser as a buffer (not base64 in the JSON)."""
    return traitlets.Bytes(b"", help=help).tag(sync=True, **bytes_serialization)


class Explorer(anywidget.AnyWidget):
    """The explorer panel of a trace: layer tree, memory bars and timeline, alias graph, ops table.

    Build it with :meth:`from_trace`; display it as the last expression of a
    notebook cell. Clicking a module in the tree filters the ops table, marks
    the module's ops on the timeline and its share of each device's peak in the
    bars, and sets :attr:`selected_module` here; setting the selection traits
    from Python moves the panel.
    """

    _esm = _BUNDLE if _BUNDLE.is_file() else ""
    _css = _STYLES if _STYLES.is_file() else ""

    summary = traitlets.Dict(help="devices, categories, phases, op count, capacity, verdict, peaks, palette").tag(
        sync=True
    )
    tree = _bytes_trait("the folded layer tree (FVPK pack)")
    memory = _bytes_trait("per-device memory timeline by category, decimated, with peak attribution (FVPK)")
    ops = _bytes_trait("the ops table columns and string tables (FVPK)")
    alias = _bytes_trait("a bounded alias-graph neighbourhood: nodes and edges (FVPK)")
    time = _bytes_trait("every op's estimated end, own time, kernel class and bound on one GPU (FVPK; empty: none)")

    selected_module = traitlets.Unicode("", help="selected module: a folded tree path or a module path").tag(sync=True)
    device = traitlets.Unicode("", help="device shown and filtered on ('' = all)").tag(sync=True)
    phase = traitlets.Unicode("", help="phase filtered on ('' = all)").tag(sync=True)
    search = traitlets.Unicode("", help="text searched in module paths").tag(sync=True)
    size_by = traitlets.Unicode("param_bytes", help=f"figure that sizes the tree: one of {SIZE_BY}").tag(sync=True)
    x_axis = traitlets.Unicode("op", help=f"the timeline's x axis: one of {X_AXES}").tag(sync=True)
    gpu = traitlets.Unicode("", help="the GPU of the estimated times (set it to recompute them; '' = none)").tag(
        sync=True
    )
    static_id = traitlets.Unicode("", help="data-fv-static of the static summary the live panel hides").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        """A panel with the given traits (use :meth:`from_trace`); needs the built JavaScript bundle."""
        if not _BUNDLE.is_file():
            raise FileNotFoundError(
                f"the explorer's JavaScript bundle {_BUNDLE} is missing: run `npm install && npm run build` "
                "in the js/ folder of a source checkout, or install fakeviz from a wheel"
            )
        for key, path in (("_esm", _BUNDLE), ("_css", _STYLES)):
            if not Explorer.__dict__[key] and path.is_file():  # built after this module was imported
                setattr(Explorer, key, path.read_text())
        super().__init__(**kwargs)

    _alias_source: Any = None  # (trace, storage_module, alias_nodes, around) for redrawing the alias graph
    _time_source: Any = None  # the trace, for estimating its times on another GPU

    @traitlets.validate("gpu")
    def _valid_gpu(self, proposal: Any) -> str:
        """A GPU the time model knows (its catalog name), or ``""`` for a panel without times."""
        value = proposal["value"]
        if not value:
            return ""
        try:
            return gpu_spec(value).name
        except ValueError as err:  # ArgumentError: not a GPU with a speed, with the close names
            raise traitlets.TraitError(str(err)) from None

    @traitlets.observe("gpu")
    def _retime(self, change: Any) -> None:
        """Estimate the times again on the new GPU (needs a live kernel and the trace)."""
        if self._time_source is None:
            return
        self.time = time_pack(self._time_source, change["new"]) if change["new"] else b""

    @traitlets.observe("selected_module")
    def _redraw_alias(self, change: Any) -> None:
        """Redraw the alias-graph neighbourhood around the selected module (needs a live kernel)."""
        if self._alias_source is None:
            return
        trace, storage_module, alias_nodes, around = self._alias_source
        if around is not None:  # the caller fixed the neighbourhood
            return
        self.alias = alias_pack(trace, storage_module, alias_nodes, None, module=change["new"] or None)

    @traitlets.validate("phase")
    def _valid_phase(self, proposal: Any) -> str:
        """``""`` or one of the schema's phases."""
        value = proposal["value"]
        if value and value not in PHASES:
            raise traitlets.TraitError(f"phase {value!r}: use '' or one of {', '.join(PHASES)}")
        return value

    @traitlets.validate("device")
    def _valid_device(self, proposal: Any) -> str:
        """``""`` or a device of the trace."""
        value = proposal["value"]
        devices = self.summary.get("devices") or []
        if value and devices and value not in devices:
            raise traitlets.TraitError(f"device {value!r} is not in this trace ({', '.join(devices)})")
        return value

    @traitlets.validate("x_axis")
    def _valid_x_axis(self, proposal: Any) -> str:
        """One of :data:`X_AXES`."""
        value = proposal["value"]
        if value not in X_AXES:
            raise traitlets.TraitError(f"x_axis {value!r}: use one of {', '.join(X_AXES)}")
        return value

    @traitlets.validate("size_by")
    def _valid_size_by(self, proposal: Any) -> str:
        """One of :data:`~fakeviz._views.payload.SIZE_BY`."""
        value = proposal["value"]
        if value not in SIZE_BY:
            raise traitlets.TraitError(f"size_by {value!r}: use one of {', '.join(SIZE_BY)}")
        return value

    @classmethod
    def from_trace(
        cls,
        trace: Record,
        capacity: str | int | float | None = None,
        *,
        max_points: int = 4000,
        alias_nodes: int = 200,
        around: Any = None,
        max_ops: int = 1_000_000,
        gpu: Any = None,
        **kwargs: Any,
    ) -> Explorer:
        """The panel of ``trace``.

        ``capacity`` (bytes, ``"80GB"`` or a GPU name; default the trace's own
        ``meta["capacity"]``, set by ``%%fake --gpu``) draws the capacity line and
        the verdict. ``max_points`` bounds the timeline points per device;
        ``alias_nodes`` bounds the alias graph (``around``: anything
        :func:`fakeviz._analysis.alias.alias_graph` takes); above ``max_ops`` ops, only the ``max_ops``
        consecutive ops around the highest peak go to the ops table (the
        timeline and tree still cover the whole run). ``gpu``: the GPU whose
        estimated times the timeline can show (default: the GPU ``capacity``
        names, else the record's, else H100: :func:`~fakeviz._views.payload.time_gpu`;
        ``False``: no times, a smaller payload). ``kwargs`` set the selection
        traits and ``x_axis`` (``"time"`` to start on the time axis).
        """
        selected = kwargs.pop("selected_module", "")
        spec = None if gpu is False else time_gpu(trace, gpu, capacity)
        state = build_state(trace, capacity, max_points=max_points, alias_nodes=alias_nodes, around=around,
                            max_ops=max_ops, gpu=False if spec is None else spec)  # fmt: skip
        widget = cls(**state, gpu=spec.name if spec is not None else "", **kwargs)
        widget._time_source = trace  # from now on, a new gpu estimates the times again
        widget._alias_source = (trace, storage_modules(trace), alias_nodes, around)
        widget._static = (trace, capacity)
        widget.static_id = f"fv-{widget.model_id}"
        widget.selected_module = selected  # draws the alias graph around it
        return widget

    _static: Any = None  # (trace, capacity) for the static summary

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget view plus ``text/plain`` and the static summary as ``text/html`` (one bundle).

        Displaying the panel in a notebook (:meth:`_ipython_display_`) writes the summary as an output
        of its own instead, the one JupyterLab shows when the widget model is gone (Note: [static fallback]).
        """
        return fallback_bundle(super()._repr_mimebundle_(**kwargs), self._static_html(), "fakeviz explorer")

    def _ipython_display_(self) -> None:
        """Show the static summary, then the live panel (which hides the summary while it runs)."""
        display_with_fallback(super()._repr_mimebundle_(), self._static_html(), "fakeviz explorer")

    def _static_html(self) -> str | None:
        if self._static is None:
            return None
        trace, capacity = self._static
        return static_html(trace, capacity, static_id=self.static_id)

    def decoded(self, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, list[str]]]:
        """One data trait (``tree``, ``memory``, ``ops``, ``alias`` or ``time``) decoded: ``(meta, arrays, strings)``."""
        if name not in _PACKED:
            raise ValueError(f"{name!r} is not a packed trait ({', '.join(_PACKED)})")
        return unpack(getattr(self, name))


# Note: [static fallback]
# JupyterLab saves a notebook without widget state by default. Reopened, an output whose bundle holds
# the widget-view mimetype is drawn by the widget manager, which finds no model and writes "Error
# displaying widget: model not found": it never falls back to the bundle's text/html
# (@jupyter-widgets/jupyterlab-manager's WidgetRenderer.renderModel, checked in tests/browser). So a
# widget is displayed as two outputs: first the static summary (text/html with no script, see
# fakeviz._views.static; nbviewer, GitHub and an untrusted notebook show it too), then the widget
# (widget-view and a one-line text/plain). While the widget lives, its front end hides the summary
# (found by ``data-fv-static``); once the model is gone, the summary's one CSS rule hides the widget's
# empty error line under it, so a reopened notebook shows the summary alone.
_HIDE_DEAD_WIDGET = (
    "<style>.jp-OutputArea-child:has([data-fv-static]) + .jp-OutputArea-child "
    ".jp-OutputArea-output.jupyter-widgets:not(:has(*)){display:none}</style>"
)


def fallback_bundle(widget_bundle: Any, html: str | None, label: str) -> dict[str, Any]:
    """A widget's mimebundle with ``text/plain`` (``label``) and ``html`` as ``text/html`` added."""
    data = widget_bundle[0] if isinstance(widget_bundle, tuple) else widget_bundle
    data = dict(data or {})
    data["text/plain"] = f"<{label}: run the cell with a kernel to see it>"
    if html is not None:
        data["text/html"] = html
    return data


def display_with_fallback(widget_bundle: Any, html: str | None, label: str) -> None:
    """Display ``html`` (the static summary), then the widget's own bundle, as two outputs.

    Note: [static fallback]. ``widget_bundle`` is what ipywidgets' ``_repr_mimebundle_`` gives.
    """
    from IPython.display import display

    if html is not None:
        display({"text/html": _HIDE_DEAD_WIDGET + html, "text/plain": f"{label} (static summary)"}, raw=True)
    display(fallback_bundle(widget_bundle, None, label), raw=True)
