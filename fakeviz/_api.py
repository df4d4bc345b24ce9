"""The public entry points that compose the layers: :func:`record` (the engine making a :class:`~fakeviz.Trace`),
:func:`explore`, :func:`fake_cuda_status`."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import torch

from ._analysis import cuda_stats as _cuda_stats
from ._engine import cuda_shim as _cuda_shim
from ._engine import recorder as _recorder
from ._engine.recorder import FakeSession, Recording
from ._trace import Trace

__all__ = ["FILLED", "RETURNS", "FakeSession", "Recording", "explore", "fake_cuda_status", "record"]


#: What ``fakeviz.record`` fills in of the engine's :func:`~fakeviz._engine.recorder.record`: the record class
#: (a :class:`~fakeviz.Trace`) and the memory figures ``torch.cuda`` answers with in the block (the caching allocator
#: replayed by the analysis layer, which the engine may not import). Every other parameter is the engine's.
FILLED: dict[str, Any] = {"record_cls": Trace, "memory_stats": _cuda_stats.memory_stats}

# Note: [one source for record's signature]
# fv.record is the engine's record with two parameters filled (FILLED). Its parameters, their defaults and
# annotations and their documentation are declared once, on the engine's function: the facade's signature is the
# engine's less FILLED (``__signature__``, what help(), inspect and Jupyter's tooltips read) and its docstring is
# the engine's plus RETURNS. A copy of the parameter list here drifted before (a parameter added to the engine and
# not to the facade is unreachable), and the docstring used to be made by replacing one sentence of the engine's,
# which silently did nothing when that sentence changed. tests/core/test_public_api.py checks that the signature is
# the engine's less FILLED and that every parameter is documented. A static reader (a type checker, griffe without
# inspection) sees ``record(**options)``.

RETURNS = """
    Returns:
        a :class:`~fakeviz.Recording`: ``with fakeviz.record(...) as trace:`` gives ``trace``, a
        :class:`~fakeviz.Trace` (the record with its analyses and views as methods), filled as the block runs.
"""


def _signature() -> inspect.Signature:
    sig = inspect.signature(_recorder.record)
    missing = set(FILLED) - set(sig.parameters)
    if missing:  # the engine renamed a parameter the facade fills: fail at import, not at the first record()
        raise TypeError(f"fakeviz._engine.recorder.record has no parameter {', '.join(sorted(missing))}")
    return sig.replace(parameters=[p for name, p in sig.parameters.items() if name not in FILLED])


def record(**options: Any) -> Recording:
    try:
        _SIGNATURE.bind(**options)  # an unknown keyword: the TypeError a written-out signature gives, and a near name
    except TypeError as exc:
        near = difflib.get_close_matches(
            next(iter(set(options) - set(_SIGNATURE.parameters)), ""), _SIGNATURE.parameters
        )
        raise TypeError(f"record() {exc}" + (f"; did you mean {near[0]!r}?" if near else "")) from None
    return _recorder.record(**options, **FILLED)


_SIGNATURE = _signature()
record.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
record.__doc__ = (_recorder.record.__doc__ or "").rstrip() + "\n" + RETURNS


def explore(trace_or_model: Any, capacity: Any = None, **selection: Any) -> Any:
    """The explorer widget for a :class:`Trace`, or for a (fake or real) model's structure.

    A model is explored without running it: its parameters and buffers are
    registered in an empty recording, which gives the layer tree and the bytes per
    device and dtype (no activations: record a forward for those).
    """
    if isinstance(trace_or_model, Trace):
        return trace_or_model.explore(capacity, **selection)
    if not isinstance(trace_or_model, torch.nn.Module):
        raise TypeError(f"explore() takes a fakeviz.Trace or a torch.nn.Module, not {type(trace_or_model).__name__}")
    with record(modules=[trace_or_model]) as trace:
        pass
    return trace.explore(capacity, **selection)


def fake_cuda_status() -> _cuda_shim.ShimStatus:
    """How fake cuda devices are provided in this process (native, shim or unavailable)."""
    return _cuda_shim.ensure_fake_cuda()
