"""Plotly views of a trace, to compose in your own dashboards: layer tree, memory bars, timeline, alias graph, ops.

Every view is a pure function of a record (a :class:`fakeviz.Trace`, or the data built from it) that returns a
:class:`plotly.graph_objects.Figure`; the data each figure draws comes from a separate pure function, so it can be
checked or reused without plotly:

================================  ==========================  ==========================================
figure                            data                        shows
================================  ==========================  ==========================================
:func:`layer_tree_figure`         :func:`tree_data`           icicle of the module hierarchy, sized by a
                                                              measure, repeated blocks folded
:func:`memory_bars_figure`        :func:`bars_data`           per device, the peak split by category,
                                                              with capacity, headroom and the verdict
:func:`memory_timeline_figure`    :func:`timeline_data`,      live bytes by category against op seq,
                                  :func:`phase_runs`          phases shaded, the peak marked
:func:`alias_graph_figure`        :func:`alias_graph_data`    storages, the tensors viewing them, names,
                                                              tied weights and in-place writes
:func:`ops_table_figure`          :func:`ops_table_data`      the op log, filtered
================================  ==========================  ==========================================

A figure's name ends in ``_figure``; the data it draws ends in ``_data`` (or is the record's own noun, as
``trace.ops`` and ``trace.alias_graph()``). The names before this rule (``layer_tree``, ``memory_bars``,
``memory_timeline``, ``alias_graph``, ``ops_table``) still work and warn :class:`FakeVizDeprecationWarning`:
``fakeviz.views.alias_graph`` was a figure while ``trace.alias_graph()`` is two DataFrames.

Only NumPy, pandas and plotly are used (plotly imported inside the figure functions). All text taken from the
trace (module paths and classes, op names, user lines, parameter names) is HTML-escaped before it reaches the
figure: plotly renders a subset of HTML in titles, labels, hover text, annotations and table cells, and a module
class named ``<script>alert(1)</script>`` must show as text. User text never goes into a ``hovertemplate`` (where
``%{...}`` would be interpreted), only into ``hovertext`` / ``customdata`` values.

The implementation lives in :mod:`fakeviz._views`: ``tree`` (layer tree), ``memory`` (bars and timeline),
``graph`` (alias graph), ``table`` (ops table) and ``style`` (what they share).
"""

from __future__ import annotations

from ._core.errors import FakeVizDeprecationWarning, renamed
from ._core.fmt import esc, format_bytes, format_count, format_flops
from ._core.palette import CATEGORY_COLORS, PHASE_COLORS
from ._views.graph import GraphData, alias_graph_data, alias_graph_figure
from ._views.memory import (
    BarsData,
    bars_data,
    decimate,
    memory_bars_figure,
    memory_timeline_figure,
    phase_runs,
    timeline_data,
)
from ._views.style import MEASURES
from ._views.table import ops_table_data, ops_table_figure
from ._views.tree import TreeData, layer_tree_figure, tree_data

__all__ = [
    "CATEGORY_COLORS",
    "MEASURES",
    "PHASE_COLORS",
    "BarsData",
    "GraphData",
    "TreeData",
    "FakeVizDeprecationWarning",
    "alias_graph_data",
    "alias_graph_figure",
    "bars_data",
    "decimate",
    "esc",
    "format_bytes",
    "format_count",
    "format_flops",
    "layer_tree_figure",
    "memory_bars_figure",
    "memory_timeline_figure",
    "ops_table_data",
    "ops_table_figure",
    "phase_runs",
    "timeline_data",
    "tree_data",
]

#: The names before "figures end in _figure" (issue 34), old -> new: they work and warn.
RENAMED = {
    "layer_tree": "layer_tree_figure",
    "memory_bars": "memory_bars_figure",
    "memory_timeline": "memory_timeline_figure",
    "alias_graph": "alias_graph_figure",
    "ops_table": "ops_table_data",
}
__getattr__ = renamed(__name__, RENAMED, globals(), "figures end in _figure, the data they draw in _data")
