"""What ``torch.cuda`` answers on a fake GPU, and the patches that route it there (Note: [torch.cuda on fake GPUs]).

Note: [torch.cuda on fake GPUs]
The public torch.cuda functions are thin Python over torch._C._cuda_* bindings that a CPU-only build
lacks. While a session answering as a GPU is on the stack we replace the *leaves* (the functions that
reach those bindings, in every module that bound them by name: torch.cuda, .memory, .random, .graphs,
.streams, torch.accelerator, .memory) with dispatchers: when the calling thread's newest session answers
as a GPU they answer from it, otherwise (also in every thread without a session: Note: [threads] in
fakeviz._engine.patches) they call torch's own function. Everything above the leaves stays torch's
code: get_device_capability and get_device_name call our
get_device_properties, memory_allocated calls our memory_stats, manual_seed's callbacks run at once
(is_initialized() is True) on our default_generators, torch.cuda.stream(...) and torch.cuda.device(i)
use our current_stream/set_stream/_exchange_device. Two consequences for the fake mode itself:
  * FakeTensorMode.avoid_device_init reads torch.cuda.is_available(); on a CPU-only build it must stay
    True (no real tensor can move to cuda: constant-propagating a _to_copy to cuda would try), so the
    property answers True while patched;
  * FakeTensor.__new__ asks torch.cuda.current_device() for a device without index once
    torch.cuda.is_initialized(), so torch.empty(2, device="cuda") inside torch.cuda.device(1) makes a
    cuda:1 tensor, as on a GPU. The current device is the shim's per-thread one, which torch's autograd
    engine sets on its device threads.
Memory: the recorder gives the session a reader (the facade wires fakeviz._analysis.cuda_stats, which
replays the storages recorded so far through the caching-allocator model), so memory_allocated()
between two ops equals the trace's allocator figures at that point. reset_peak_memory_stats keeps the
op index and the figures at the reset; a later peak is the larger of those and the model's running
maximum over the allocations made since. Everything is put back when the last session answering as a
GPU exits, also after an error; sessions nest (an inner cpu session answers as the build does).
"""

from __future__ import annotations

import functools
import importlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..._core.errors import FakeVizError
from .. import cuda_shim as _cuda_shim
from .. import patches as _patches
from . import objects
from .stack import ORIGINALS, DeviceProperties, GpuSession, active, device_index

__all__ = ["install", "refresh", "uninstall"]


def _set_device(s: GpuSession, device: Any) -> None:
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device)
    if index >= 0:
        _cuda_shim.exchange_device(device_index(s, index, what="set_device"))


def _exchange(s: GpuSession, index: int) -> int:
    return -1 if index < 0 else _cuda_shim.exchange_device(device_index(s, index))


def _stats(s: GpuSession, device: Any, what: str = "memory_stats") -> dict[str, int]:
    """The flat figures of one device, with the session's peak and accumulated resets applied."""
    if s.memory is None:
        raise FakeVizError(f"torch.cuda.{what}() on a fake GPU: {s.missing}")
    index = device_index(s, device)
    since, at_reset = s.resets.get(index, (-1, {}))
    key = (s.version() if s.version is not None else None, since)
    hit = s.cache.get(index)
    if hit is not None and key[0] is not None and hit[0] == key:
        raw = hit[1]
    else:
        raw = s.memory(f"cuda:{index}", since)
        s.cache[index] = (key, raw)
    out = dict(raw)
    for k, v in at_reset.items():
        out[k] = max(out[k], v)
    for k, v in s.accumulated.get(index, {}).items():
        out[k] -= v
    return out


def _memory_stats(s: GpuSession, device: Any = None) -> OrderedDict[str, int]:
    return OrderedDict(sorted(_stats(s, device).items()))


def _nested(s: GpuSession, device: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in _stats(s, device, "memory_stats_as_nested_dict").items():
        node = out
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = v
    return out


def _reset_peak(s: GpuSession, device: Any = None) -> None:
    if s.memory is None:
        return
    index = device_index(s, device)
    now = _stats(s, index)
    since = s.clock() if s.clock is not None else -1
    s.resets[index] = (since, {k: now[k[: -len("peak")] + "current"] for k in now if k.endswith(".peak")})


def _reset_accumulated(s: GpuSession, device: Any = None) -> None:
    if s.memory is None:
        return
    index = device_index(s, device)
    raw = s.memory(f"cuda:{index}", -1)
    counters = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    s.accumulated[index] = {k: v for k, v in raw.items() if k.endswith((".allocated", ".freed")) or k in counters}


def _mem_get_info(s: GpuSession, device: Any = None) -> tuple[int, int]:
    reserved = _stats(s, device, "mem_get_info")["reserved_bytes.all.current"]
    total = s.props.total_memory
    return max(total - reserved, 0), total


def _empty_cache(s: GpuSession) -> None:
    s.list_note("empty_cache", s.clock() if s.clock is not None else -1)


def _unsupported(what: str, instead: str) -> Callable[..., Any]:
    def answer(s: GpuSession, *args: Any, **kwargs: Any) -> Any:
        raise FakeVizError(f"torch.cuda.{what} is not answered on a fake GPU; {instead}")

    return answer


def _device_properties(s: GpuSession, device: Any = None) -> DeviceProperties:
    device_index(s, device)
    return s.props


def _synchronize(s: GpuSession, device: Any = None) -> None:
    device_index(s, device)


def _arch_list(s: GpuSession) -> list[str]:
    p = s.props
    return [p.gcnArchName] if p.gcnArchName else [f"sm_{p.major}{p.minor}"]


def _default_stream(s: GpuSession, device: Any = None) -> objects.Stream:
    return objects.Stream(stream_id=0, device_index=device_index(s, device))


def _set_stream_by_id(s: GpuSession, stream_id: int, device_index: int, device_type: int) -> None:
    objects.set_stream(s, objects.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))


_SNAPSHOT = "use trace.export_memory_snapshot() after the block for PyTorch's snapshot of the allocator model"
# (home module, name, answer(session, *args)): the leaves of Note: [torch.cuda on fake GPUs]
_LEAVES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("torch.cuda", "is_available", lambda s: True),
    ("torch.cuda", "is_initialized", lambda s: True),
    ("torch.cuda", "device_count", lambda s: s.count),
    ("torch.cuda", "current_device", lambda s: _cuda_shim.current_device()),
    ("torch.cuda", "set_device", _set_device),
    ("torch.cuda", "_exchange_device", _exchange),
    ("torch.cuda", "_maybe_exchange_device", _exchange),
    ("torch.cuda", "get_device_properties", _device_properties),
    ("torch.cuda", "get_arch_list", _arch_list),
    ("torch.cuda", "synchronize", _synchronize),
    ("torch.cuda", "current_stream", objects.current_stream),
    ("torch.cuda", "default_stream", _default_stream),
    ("torch.cuda", "set_stream", objects.set_stream),
    ("torch.cuda", "_set_stream_by_id", _set_stream_by_id),
    ("torch.cuda.graphs", "is_current_stream_capturing", lambda s: False),
    ("torch.cuda.memory", "memory_stats", _memory_stats),
    ("torch.cuda.memory", "memory_stats_as_nested_dict", _nested),
    ("torch.cuda.memory", "reset_peak_memory_stats", _reset_peak),
    ("torch.cuda.memory", "reset_accumulated_memory_stats", _reset_accumulated),
    ("torch.cuda.memory", "empty_cache", _empty_cache),
    ("torch.cuda.memory", "mem_get_info", _mem_get_info),
    ("torch.cuda.memory", "memory_summary", _unsupported("memory_summary", "print torch.cuda.memory_stats()")),
    ("torch.cuda.memory", "memory_snapshot", _unsupported("memory_snapshot", _SNAPSHOT)),
    ("torch.cuda.memory", "_snapshot", _unsupported("memory._snapshot", _SNAPSHOT)),
    ("torch.accelerator", "is_available", lambda s: True),
    ("torch.accelerator", "device_count", lambda s: s.count),
    ("torch.accelerator.memory", "memory_stats", lambda s, d=None, /: _memory_stats(s, d)),
    ("torch.accelerator.memory", "reset_peak_memory_stats", lambda s, d=None, /: _reset_peak(s, d)),
    ("torch.accelerator.memory", "reset_accumulated_memory_stats", lambda s, d=None, /: _reset_accumulated(s, d)),
    ("torch.accelerator.memory", "get_memory_info", lambda s, d=None, /: _mem_get_info(s, d)),
    ("torch.accelerator.memory", "empty_cache", _empty_cache),
)
# modules that bind some leaves by name (``from . import current_device``): patched where they hold the same object
_MODULES = ("torch.cuda", "torch.cuda.memory", "torch.cuda.random", "torch.cuda.graphs", "torch.cuda.streams",
            "torch.accelerator", "torch.accelerator.memory")  # fmt: skip


def _dispatcher(answer: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        s = active()
        if s is None:
            return original(*args, **kwargs)
        return answer(s, *args, **kwargs)

    return call


_TOKENS: list[int] = []  # the registry's tokens of this module's changes (Note: [patch registry])


def _set(owner: Any, name: str, value: Any, entry: str) -> None:
    key = (owner, name)
    if key not in ORIGINALS:
        ORIGINALS[key] = _patches.original(owner, name)
    _TOKENS.append(_patches.push(owner, name, value, entry=entry))


def install() -> None:
    """Route the leaves to the stack's answering session (callers hold ``stack.LOCK``)."""
    mods = {m: importlib.import_module(m) for m in _MODULES}
    for home, name, answer in _LEAVES:
        original = getattr(mods[home], name, None)
        if original is None:  # another torch version without this leaf
            continue
        patched = _dispatcher(answer, original)
        for mod in mods.values():
            if getattr(mod, name, None) is original:
                _set(mod, name, patched, "torch-cuda-leaves")
    for mod in (torch.cuda, mods["torch.cuda.streams"]):
        _set(mod, "Stream", objects.Stream, "torch-cuda-objects")
        _set(mod, "Event", objects.Event, "torch-cuda-objects")
    avoid = FakeTensorMode.__dict__["avoid_device_init"]
    _set(FakeTensorMode, "avoid_device_init", property(lambda m: True if active() is not None else avoid.fget(m)),
         "avoid-device-init")  # fmt: skip
    ORIGINALS[(torch.cuda, "default_generators")] = torch.cuda.default_generators
    refresh()


_generators: list[int] = []  # the token of the answering session's torch.cuda.default_generators


def refresh() -> None:
    """Values that are not functions: ``torch.cuda.default_generators`` of the answering session."""
    if (torch.cuda, "default_generators") not in ORIGINALS:
        return
    while _generators:
        _patches.pop(_generators.pop())
    s = active()
    if s is not None:
        gens = tuple(objects.generator(i) for i in range(s.count))
        _generators.append(_patches.push(torch.cuda, "default_generators", gens, entry="torch-cuda-objects"))


def uninstall() -> None:
    """Put back every attribute :func:`install` replaced, newest first."""
    while _generators:
        _patches.pop(_generators.pop())
    while _TOKENS:
        _patches.pop(_TOKENS.pop())
    ORIGINALS.clear()
