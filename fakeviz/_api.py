"""The public entry points that compose the layers: :func:`record` (the engine making a :class:`~fakeviz.Trace`),
:func:`explore`, :func:`fake_cuda_status`."""

from __future__ import annotations

from typing import Any

import torch

from ._analysis import cuda_stats as _cuda_stats
from ._engine import cuda_shim as _cuda_shim
from ._engine import recorder as _recorder
from ._engine.recorder import FakeSession, Recording
from ._trace import Trace

__all__ = ["FakeSession", "Recording", "explore", "fake_cuda_status", "record"]


def record(
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    fake: bool = True,
    symbolic: bool = False,
    exclude: str | tuple[str, ...] | list[str] = (),
    modules: torch.nn.Module | tuple[torch.nn.Module, ...] | list[torch.nn.Module] = (),
    session: FakeSession | None = None,
    progress: Any = None,
    attention: str = "auto",
    gpu: str | None = None,
    gpus: int | str | None = None,
    routing: str | None = "balanced",
) -> Recording:
    return _recorder.record(
        device=device, dtype=dtype, fake=fake, symbolic=symbolic, exclude=exclude, modules=modules,
        session=session, progress=progress, attention=attention, gpu=gpu, record_cls=Trace, gpus=gpus,
        memory_stats=_cuda_stats.memory_stats, routing=routing,
    )  # fmt: skip


record.__doc__ = (_recorder.record.__doc__ or "").replace(
    "``trace`` (a ``record_cls``, :class:`~fakeviz._core.record.Record` by default; ``fakeviz.record`` makes a\n    :class:`~fakeviz.Trace`).",
    "``trace`` (a :class:`~fakeviz.Trace`).",
)


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
