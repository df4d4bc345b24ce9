"""Plotly views of a trace, to compose in your own dashboards: layer tree, memory bars, timeline, alias graph, ops.

Every function takes a :class:`fakeviz.Trace` (or the ``*_data`` it computes) and returns a plotly figure or
plain data; the implementation lives in :mod:`fakeviz._views.figures`.
"""

from ._views.figures import *  # noqa: F403 - this module re-exports the figures' public names
from ._views.figures import __all__  # noqa: F401

