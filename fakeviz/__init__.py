"""fakeviz: see a PyTorch model you cannot afford to run.

Build and drive a model under fake tensors (shape, dtype, stride, device and
storage identity, no data), record every dispatched aten op, and look at the
record: ops, storages, memory per device.

>>> import fakeviz as fv
>>> with fv.record(device="cuda:0") as trace:   # doctest: +SKIP
...     model = build_model(); model(ids).sum().backward()
>>> trace.ops                                    # doctest: +SKIP

This module is the thin public facade; CONTRIBUTING.md maps the layers behind it.
"""

from __future__ import annotations

from ._api import FakeSession, Recording, explore, fake_cuda_status, record
from ._core.errors import (
    CheckpointError,
    CheckpointMismatchError,
    DataDependentError,
    FakeVizDeprecationWarning,
    FakeVizError,
    FakeVizWarning,
    HubError,
    RecordError,
    SimulationError,
    TraceFormatError,
    UnknownModelError,
)
from ._engine import cuda_shim as _cuda_shim
from ._engine.session import fake_mode, fakeify, is_fake, meta_like
from ._export import ExportCheck, check_export
from ._frontends.distributed import Simulation, simulate
from ._frontends.fit import fit
from ._frontends.planning import Plan, compare, max_batch, max_seq, plan, sweep
from ._frontends.serving import Serving, serve
from ._fx import prop
from ._trace import CATEGORIES, PHASES, ROLES, Trace, load

__version__ = "0.1.0"

__all__ = [
    "PHASES",
    "CATEGORIES",
    "ROLES",
    "DataDependentError",
    "FakeSession",
    "FakeVizError",
    "FakeVizWarning",
    "RecordError",
    "Recording",
    "Trace",
    "TraceFormatError",
    "explore",
    "fake_cuda_status",
    "fake_mode",
    "fakeify",
    "is_fake",
    "load",
    "meta_like",
    "record",
    "prop",
    "ExportCheck",
    "check_export",
    "Plan",
    "plan",
    "sweep",
    "fit",
    "compare",
    "max_batch",
    "max_seq",
    "Serving",
    "serve",
    "Simulation",
    "SimulationError",
    "simulate",
    "UnknownModelError",
    "CheckpointError",
    "CheckpointMismatchError",
    "HubError",
    "FakeVizDeprecationWarning",
]


def load_ipython_extension(ip):
    """``%load_ext fakeviz``: register ``%%fake`` and ``%fake_reset`` (imports IPython only now)."""
    from ._frontends.magic import load_ipython_extension as _load

    _load(ip)


def unload_ipython_extension(ip):
    """``%unload_ext fakeviz``: remove the magics."""
    from ._frontends.magic import unload_ipython_extension as _unload

    _unload(ip)


# Load the fake-cuda shim as early as possible: before any real backward runs,
# so torch's autograd engine sizes its device queues for 64 fake cuda devices.
# See Note: [fake cuda on a CPU-only build].
_cuda_shim.ensure_fake_cuda()
