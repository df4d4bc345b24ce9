"""fakeviz: see a PyTorch model you cannot afford to run.

Build and drive a model under fake tensors (shape, dtype, stride, device and
storage identity, no data), record every dispatched aten op, and look at the
record: ops, storages, memory per device.

>>> import fakeviz as fv
>>> with fv.record(device="cuda:0") as trace:   # doctest: +SKIP
...     model = build_model(); model(ids).sum().backward()
>>> trace.ops                                    # doctest: +SKIP
"""

from __future__ import annotations

from . import _cuda_shim
from ._errors import DataDependentError, FakeVizError, FakeVizWarning, RecordError, TraceFormatError
from ._recorder import FakeSession, Recording, record
from ._session import fake_mode, fakeify, is_fake, meta_like
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
]


def load_ipython_extension(ip):  # noqa: ANN001, ANN201 - IPython's extension hook
    """``%load_ext fakeviz``: register ``%%fake`` and ``%fake_reset`` (imports IPython only now)."""
    from ._magic import load_ipython_extension as _load

    _load(ip)


def unload_ipython_extension(ip):  # noqa: ANN001, ANN201 - IPython's extension hook
    """``%unload_ext fakeviz``: remove the magics."""
    from ._magic import unload_ipython_extension as _unload

    _unload(ip)


def explore(trace_or_model, capacity=None, **selection):  # noqa: ANN001, ANN201 - Trace | nn.Module -> Explorer
    """The explorer widget for a :class:`Trace`, or for a (fake or real) model's structure.

    A model is explored without running it: its parameters and buffers are
    registered in an empty recording, which gives the layer tree and the bytes per
    device and dtype (no activations: record a forward for those).
    """
    if isinstance(trace_or_model, Trace):
        return trace_or_model.explore(capacity, **selection)
    import torch

    if not isinstance(trace_or_model, torch.nn.Module):
        raise TypeError(f"explore() takes a fakeviz.Trace or a torch.nn.Module, not {type(trace_or_model).__name__}")
    with record(modules=[trace_or_model]) as trace:
        pass
    return trace.explore(capacity, **selection)


def fake_cuda_status() -> _cuda_shim.ShimStatus:
    """How fake cuda devices are provided in this process (native, shim or unavailable)."""
    return _cuda_shim.ensure_fake_cuda()


# Load the fake-cuda shim as early as possible: before any real backward runs,
# so torch's autograd engine sizes its device queues for 64 fake cuda devices.
# See Note: [fake cuda on a CPU-only build].
_cuda_shim.ensure_fake_cuda()
