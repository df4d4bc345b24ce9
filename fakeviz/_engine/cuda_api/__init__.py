"""The ``torch.cuda`` API of fake GPUs: inside a fake cuda session it answers as the named GPU would.

Library code asks the device before it runs (transformers' MoE layers ask
``get_device_capability``, ``torch.utils.checkpoint`` saves ``get_rng_state``, scripts print
``memory_allocated``). On a CPU-only build those calls say "no CUDA" or raise "Torch not compiled with
CUDA enabled", even while fake cuda tensors exist (Note: [fake cuda on a CPU-only build]). Inside a fake
cuda session this module makes them answer as a machine with the session's GPUs.

When it is on
-------------
Only on the shim (``cuda_shim.status().mode == "shim"``: a CPU-only build, or a CUDA build that sees no GPU;
a CUDA build with GPUs is never patched), and only in a *fake cuda session* (:func:`answers_as_gpu`):

* ``fakeviz.record(fake=True, device="cuda...")`` (also with ``session=``, a :class:`FakeSession`), or
  ``fakeviz.record(fake=True)`` with no device but ``gpu=`` or ``gpus=`` given;
* ``fakeviz.fake_mode(device="cuda...")``.

Not in ``record(fake=False)`` (a real run on this CPU machine), nor in a fake session on ``cpu``/``meta``
or with no device and no GPU named: those answer what the build always says, so a fake CPU run takes the
branches a real CPU run takes. Every fake session on the shim, cuda or not, keeps ``torch.autocast("cuda")``
working (:func:`autocast_support`, Note: [session patches]).

What it answers
---------------
The GPU is ``gpu=`` (a name of :data:`fakeviz._core.gpus.GPUS`; default ``"H100"``), the same on every
index. The session has ``device_count()`` GPUs: ``gpus=`` if given, else the session device's index + 1
(``cuda:3`` -> 4). Device properties, capability, name, memory and SM count come from
:mod:`fakeviz._core.gpus`. ``current_device``/``set_device``/``torch.cuda.device(i)`` read and set the
shim's per-thread current device (the one torch's autograd engine sets on its device threads).
Streams and events exist and order nothing: every stream is idle, ``query()`` is True,
``synchronize()`` returns at once. Default generators keep a Philox state (seed, offset) per device for
the process, as ``CUDAGeneratorImpl`` does: seeding, ``get_rng_state``/``set_rng_state`` round-trip,
``initial_seed`` (a seed queued by ``torch.manual_seed`` before the session counts, as at CUDA's lazy
init). Memory figures come from the record (:class:`GpuSession` ``memory``). How: Note: [torch.cuda on fake
GPUs] in ``patches.py``; ``stack.py`` holds the sessions and the GPU's properties, ``objects.py`` the
generators, streams and events.

Known limitations
-----------------
* A session answers in the thread that opened it and in autograd's device threads while they run its backward
  (Note: [threads] in ``fakeviz._engine.patches``); any other thread gets torch's own answers, also while the
  session is open. ``torch.cuda.default_generators`` is a tuple, not a function: while a session answering as
  a GPU is open, every thread reads its generators there (torch.cuda's own seeding functions, called in another
  thread, do not use them on a build that sees no GPU). Libraries that cache an answer (``functools.cache`` on
  ``is_available()``) keep it after the session.
* ``Event.elapsed_time`` returns 0.0 ms (no kernel runs; the trace's ``meta["cuda_api"]`` counts the
  calls). Random ops on fake tensors draw nothing, so a generator's offset does not advance as on a GPU;
  ``torch.Generator(device="cuda")`` stays unavailable on a CPU-only build.
* Each memory query replays the record so far through the allocator model: its cost grows with the
  storages recorded (a query per training step makes the run quadratic in its length).
  ``empty_cache()`` releases nothing in the model (listed in ``meta["cuda_api"]["empty_cache"]``); the
  CUDA context and cuBLAS/cuDNN workspaces are not in the figures; ``mem_get_info`` is the card's memory
  minus what the model reserved. ``memory_summary``, ``memory_snapshot`` and ``_snapshot`` raise: use
  ``trace.export_memory_snapshot()``. ``fake_mode()`` records nothing, so it has no memory figures.
* Not answered: ``can_device_access_peer``, ``Stream.priority_range``, CUDA graphs, NVML queries
  (``utilization``, ``temperature``), ``torch.version.cuda`` (None), ``torch.backends.cudnn``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import cuda_shim as _cuda_shim
from .. import patches as _patches
from . import objects, patches
from .stack import (
    DEFAULT_GPU,
    LOCK,
    ORIGINALS,
    STACK,
    DeviceProperties,
    GpuSession,
    InvalidDeviceError,
    MemoryReader,
    active,
    properties,
)  # fmt: skip

__all__ = [
    "DEFAULT_GPU", "DeviceProperties", "GpuSession", "InvalidDeviceError", "answers_as_gpu", "autocast_support",
    "device_count_for", "gpu_session", "properties",
]  # fmt: skip

_autocast_saved: dict[str, Any] = {}


def answers_as_gpu(*, fake: bool, device: str | torch.device | None, gpu: str | None, gpus: int | None) -> bool:
    """Whether a session answers ``torch.cuda`` as a GPU (the rule of "When it is on" above)."""
    if not fake or _cuda_shim.status().mode != "shim":
        return False
    if device is not None:
        return torch.device(device).type == "cuda"
    return gpu is not None or gpus is not None


def device_count_for(device: str | torch.device | None, gpus: int | None) -> int:
    """The session's ``device_count()``: ``gpus``, else the session device's index + 1 (1 without one).

    Raises:
        ValueError: ``gpus`` is not a count of fake devices, or leaves out the session's device.
    """
    dev = torch.device(device) if device is not None else None
    index = dev.index if dev is not None and dev.type == "cuda" and dev.index is not None else 0
    if gpus is None:
        return index + 1
    limit = _cuda_shim.status().device_count or 64
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= limit:
        raise ValueError(f"gpus={gpus!r}: give the number of GPUs of the fake machine, 1 .. {limit}")
    if index >= gpus:
        raise ValueError(f"device={dev} needs at least {index + 1} GPUs, but gpus={gpus}")
    return gpus


@contextlib.contextmanager
def gpu_session(
    *,
    on: bool,
    gpu: str | None = None,
    count: int = 1,
    memory: MemoryReader | None = None,
    version: Callable[[], Any] | None = None,
    clock: Callable[[], int] | None = None,
    meta: dict[str, Any] | None = None,
    missing: str | None = None,
) -> Iterator[GpuSession]:
    """Push a fake session on the stack for the ``with`` block (arguments: :class:`GpuSession`).

    While a session that is ``on`` is on the stack, ``torch.cuda`` is patched (Note: [torch.cuda on fake
    GPUs]); the session answers in the calling thread only (and in autograd's device threads running its
    backward). On exit, also after an error, the calling thread's current device and streams are put back
    and the patches are undone with the last ``on`` session.
    """
    s = GpuSession(on=on, props=properties(gpu), count=count, memory=memory, version=version, clock=clock,
                   meta=meta)  # fmt: skip
    if missing is not None:
        s.missing = missing
    if on and meta is not None:
        meta.setdefault("cuda_api", {}).update(gpu=s.props.name, device_count=count)
    saved_device = _cuda_shim.exchange_device(-1)
    saved_streams = objects.streams_snapshot()
    scope = _patches.enter("gpu-session")  # Note: [threads]: the session answers in this thread only
    with LOCK:
        STACK.append(s)
        try:
            if on and not ORIGINALS:
                patches.install()
            patches.refresh()
            if on:
                objects.replay_queued_seeds()
        except BaseException:
            STACK.remove(s)
            _leave()
            _patches.leave(scope)
            raise
    try:
        yield s
    finally:
        with LOCK:
            STACK.remove(s)
            _leave()
        _patches.leave(scope)
        _cuda_shim.exchange_device(saved_device)
        objects.restore_streams(saved_streams)


def _leave() -> None:
    if ORIGINALS and not any(x.on for x in STACK):
        patches.uninstall()
    else:
        patches.refresh()


def autocast_support(on: bool) -> None:
    """Keep ``torch.autocast("cuda")`` working in every fake session on the CPU-only shim (Note: [session
    patches]): torch disables it when ``amp_definitely_not_available()``. ``is_bf16_supported`` answers as
    the GPU in a session answering as one (capability 8.0 or more, or emulation allowed), else True (any
    fake cuda tensor may be bf16). ``session_patches`` calls this when the first session starts (``on``)
    and when the last one ends."""
    if on and _cuda_shim.status().mode == "shim" and not _autocast_saved:
        import torch.cuda.amp.common as amp_common

        original = torch.cuda.is_bf16_supported

        @functools.wraps(original)
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            s = active()
            if s is None:
                return True
            return s.props.gcnArchName != "" or s.props.major >= 8 or including_emulation

        _autocast_saved["tokens"] = [
            _patches.push(amp_common, "amp_definitely_not_available", lambda: False, entry="autocast"),
            _patches.push(torch.cuda, "is_bf16_supported", is_bf16_supported, entry="bf16-supported"),
        ]
    elif not on and _autocast_saved:
        for token in reversed(_autocast_saved.pop("tokens")):
            _patches.pop(token)
