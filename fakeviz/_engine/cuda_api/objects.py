"""The objects of a fake GPU: default generators (seeds and RNG states), streams and events.

Streams and events order nothing (no kernel runs on a fake GPU): every stream is idle, ``query()`` is
True, ``synchronize()`` returns at once, ``Event.elapsed_time`` is 0.0 ms and counted in the record's
``meta["cuda_api"]["elapsed_time"]``. The current stream is kept per thread and device, as CUDA does.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from ..._core.errors import FakeVizError
from .stack import CUDA_TYPE, GpuSession, active, device_index, outside

__all__ = [
    "DEFAULT_SEED", "Event", "FakeCudaGenerator", "Stream", "current_stream", "generator", "replay_queued_seeds",
    "restore_streams", "set_stream", "streams_snapshot",
]  # fmt: skip

DEFAULT_SEED = 67280421310721  # c10::detail::default_rng_seed_val: the seed of a fresh CUDA generator
_GEN_LOCK = threading.Lock()
_generators: dict[int, FakeCudaGenerator] = {}
_replayed: list[Any] = []  # torch.cuda's queued seed calls already applied to _generators
_tls = threading.local()  # per thread: {device index: current Stream}
_next_stream = [1]


class FakeCudaGenerator:
    """``torch.cuda.default_generators[i]`` of a fake GPU: the Philox (seed, offset) of ``CUDAGeneratorImpl``.

    ``get_state`` is torch's 16 bytes (seed as uint64, then offset as int64, little-endian) in a CPU
    ``uint8`` tensor made without any op (``frombuffer``), so nothing is recorded, as on a GPU.
    """

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)
        self._seed = DEFAULT_SEED
        self._offset = 0

    def manual_seed(self, seed: int) -> FakeCudaGenerator:
        seed = int(seed)
        if not -(2**63) <= seed < 2**64:
            raise RuntimeError("Overflow when unpacking long long")
        self._seed, self._offset = seed % 2**64, 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        self.manual_seed(secrets.randbits(64))
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> None:
        self._offset = int(offset)

    def get_state(self) -> torch.Tensor:
        raw = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little", signed=True)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> FakeCudaGenerator:
        if isinstance(new_state, FakeTensor):
            raise FakeVizError(
                "torch.cuda.set_rng_state: the state is a fake tensor (made inside the fake session), which has "
                "no bytes; pass the tensor torch.cuda.get_rng_state() returned (a real CPU tensor)"
            )
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
            raise TypeError("RNG state must be a torch.ByteTensor")
        with unset_fake_temporarily():
            raw = bytes(new_state.detach().cpu().contiguous().numpy().tobytes())
        if len(raw) not in (8, 16):
            raise RuntimeError("RNG state is wrong size")
        self._seed = int.from_bytes(raw[:8], "little")
        self._offset = int.from_bytes(raw[8:], "little", signed=True) if len(raw) == 16 else 0
        return self

    def __repr__(self) -> str:
        return f"<fakeviz fake CUDA generator {self.device} seed={self._seed} offset={self._offset}>"


def generator(index: int) -> FakeCudaGenerator:
    """The process's default generator of fake cuda device ``index`` (kept across sessions, as a GPU's)."""
    with _GEN_LOCK:
        gen = _generators.get(index)
        if gen is None:
            gen = _generators[index] = FakeCudaGenerator(index)
        return gen


def replay_queued_seeds() -> None:
    """Apply seeds torch.cuda queued before a session (``torch.manual_seed(42)`` outside one), as lazy init does."""
    tracker = getattr(torch.cuda, "_lazy_seed_tracker", None)
    for entry in tracker.get_calls() if tracker is not None else ():  # (callback, traceback), oldest first
        if entry and not any(entry is done for done in _replayed):
            _replayed[:] = [*_replayed[-3:], entry]
            entry[0]()


class Stream(torch.Stream):
    """``torch.cuda.Stream`` of a fake GPU: a ``torch.Stream`` on cuda that is always idle."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        s = active()
        if s is None:
            return outside("Stream")(device, priority, **kwargs)
        if "stream_id" in kwargs:
            return super().__new__(cls, stream_id=kwargs["stream_id"], device_index=kwargs["device_index"],
                                   device_type=kwargs.get("device_type", CUDA_TYPE), priority=priority)  # fmt: skip
        index = device_index(s, device)
        with _GEN_LOCK:
            sid = _next_stream[0]
            _next_stream[0] += 1
        return super().__new__(cls, stream_id=sid, device_index=index, device_type=CUDA_TYPE, priority=priority)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        event = event if event is not None else torch.cuda.Event()
        event.record(self)
        return event

    @property
    def cuda_stream(self) -> int:
        return int(self.stream_id)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device={self.device} cuda_stream={self.cuda_stream:#x}>"


class Event(torch.Event):
    """``torch.cuda.Event`` of a fake GPU: recording and waiting order nothing; no time passes."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                external: bool = False) -> Any:  # fmt: skip
        if active() is None:
            return outside("Event")(enable_timing, blocking, interprocess, external)
        ev = super().__new__(cls, torch.device("cuda"), enable_timing=enable_timing, blocking=blocking,
                             interprocess=interprocess)  # fmt: skip
        ev._fv_timing = bool(enable_timing)
        ev._fv_stream = None
        return ev

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        self._fv_stream = stream if stream is not None else torch.cuda.current_stream()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Any) -> float:
        if not (self._fv_timing and getattr(end_event, "_fv_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._fv_stream is None or getattr(end_event, "_fv_stream", None) is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        s = active()
        if s is not None:
            s.count_note("elapsed_time")
        return 0.0

    def ipc_handle(self) -> Any:
        raise FakeVizError("torch.cuda.Event.ipc_handle: a fake GPU has no events to share between processes")

    @property
    def cuda_event(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "<torch.cuda.Event (fakeviz, fake GPU)>"


def current_stream(s: GpuSession, device: Any = None) -> Stream:
    """The calling thread's current stream on ``device`` (the default stream, id 0, until one is set)."""
    index = device_index(s, device)
    st = getattr(_tls, "streams", {}).get(index)
    return st if st is not None else Stream(stream_id=0, device_index=index, device_type=CUDA_TYPE)


def set_stream(s: GpuSession, stream: Any) -> None:
    """Make ``stream`` the calling thread's current stream on its device (None: no-op, as torch)."""
    if stream is None:
        return
    index = device_index(s, stream.device_index)
    if not isinstance(stream, Stream):
        stream = Stream(stream_id=stream.stream_id, device_index=index, device_type=CUDA_TYPE)
    if not hasattr(_tls, "streams"):
        _tls.streams = {}
    _tls.streams[index] = stream


def streams_snapshot() -> dict[int, Stream]:
    """The calling thread's current streams (a session puts them back when it exits)."""
    return dict(getattr(_tls, "streams", {}))


def restore_streams(saved: dict[int, Stream]) -> None:
    _tls.streams = saved
