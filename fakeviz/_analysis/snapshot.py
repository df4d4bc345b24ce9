"""Export a trace as a PyTorch CUDA memory snapshot (``torch.cuda.memory._snapshot()`` format).

:func:`export_memory_snapshot` replays every cuda device of a
:class:`~fakeviz.Trace` through the allocator model (:mod:`fakeviz._analysis.allocator`)
and writes what ``torch.cuda.memory._dump_snapshot()`` would have written had
the run been recorded with ``torch.cuda.memory._record_memory_history()`` on a
real GPU: the segments held at the end, with their blocks, and one trace of
allocator actions per device. The result opens in PyTorch's viewers:
https://pytorch.org/memory_viz (drag the pickle in) or
``python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o out.html``.

Format (see the docstring of ``torch.cuda.memory._snapshot`` and
``torch/cuda/_memory_viz.py``)::

    {"segments": [Segment, ...],          # sorted by (device, address)
     "device_traces": [[TraceEntry, ...], ...],  # indexed by the CUDA device index
     "allocator_settings": {...}, "fakeviz": {...}}

* ``Segment``: ``device, address, total_size, allocated_size, active_size,
  requested_size, stream, segment_type ("small"/"large"), segment_pool_id,
  is_expandable, frames, blocks``; each block ``address, size,
  requested_size, state ("active_allocated"/"inactive"), frames``.
* ``TraceEntry``: ``action`` (``alloc``, ``free_requested`` and
  ``free_completed`` for every free, ``segment_alloc``, ``segment_free``,
  ``oom``), ``addr`` (``device_free`` for ``oom``), ``size`` (requested bytes
  for blocks, segment bytes for segments), ``stream`` (0), ``time_us`` and ``frames``.

What differs from a real snapshot:

* Addresses are the model's virtual addresses, not device pointers.
* ``time_us`` is the op index of the event (0 for storages that existed
  before recording), not microseconds.
* Frames are not a Python/C++ stack: innermost first, they name the aten op
  (``filename`` ``"aten"``, ``line`` = op index), the module path and phase
  (``filename`` ``"module"``, ``name`` ``"Root.layer.0 (forward)"``; outside
  modules ``filename`` ``"phase"``), and the user's line (``filename``,
  ``line``, ``name`` from ``"file:line in func"``). A free carries the frames
  of the last op before it; storages that existed before recording carry one
  ``"<existed before recording>"`` frame.
* Only what the model models is there (see :mod:`fakeviz._analysis.allocator`): no
  cuBLAS/cuDNN workspaces, one stream.

The snapshot is written with :mod:`pickle` protocol 4, the format PyTorch's
readers take (the web viewer's own unpickler stops at protocol 4); fakeviz
never reads pickles.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

from .._core.gpus import Capacity
from .allocator import ALLOC, FREE, OOM, SEGMENT_ALLOC, SEGMENT_FREE, AllocatorRun, replay_trace
from .tables import ops_table, storages_table

__all__ = ["export_memory_snapshot"]

# The web viewer (pytorch.org/memory_viz, torch/utils/viz/MemoryViz.js) has its own
# unpickler, which accepts protocols 2 to 4 only; Python 3.14 defaults to 5.
_PICKLE_PROTOCOL = 4
_USER_LINE = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<func>.*)$")
_BEFORE = [{"filename": "fakeviz", "line": 0, "name": "<existed before recording>"}]


def _cuda_index(device: str) -> int | None:
    """CUDA device index of a device string (``"cuda"`` is 0), None for other devices."""
    m = re.fullmatch(r"cuda(?::(\d+))?", device.strip())
    if m is None:
        return None
    return int(m.group(1) or 0)


class _Frames:
    """Frame lists per op index, built once and shared (pickle stores a shared list once)."""

    def __init__(self, trace: Any) -> None:
        ops = ops_table(trace)
        self.n = len(ops)
        self.op = ops["op"].astype(object).tolist()
        self.module = ops["module"].astype(object).tolist()
        self.phase = ops["phase"].astype(object).tolist()
        self.line = ops["user_line"].astype(object).tolist()
        self.cache: dict[int, list[dict[str, Any]]] = {}

    def __call__(self, seq: int) -> list[dict[str, Any]]:
        """Frames of op ``seq``, innermost first (op, module, user line); before-recording frames for -1."""
        if seq < 0 or seq >= self.n:
            return _BEFORE
        got = self.cache.get(seq)
        if got is not None:
            return got
        frames: list[dict[str, Any]] = [{"filename": "aten", "line": seq, "name": str(self.op[seq])}]
        module = self.module[seq]
        phase = self.phase[seq]
        if isinstance(module, str):
            frames.append({"filename": "module", "line": 0, "name": f"{module} ({phase})"})
        elif isinstance(phase, str):
            frames.append({"filename": "phase", "line": 0, "name": phase})
        line = self.line[seq]
        if isinstance(line, str) and line:
            m = _USER_LINE.match(line)
            if m:
                frames.append({"filename": m["file"], "line": int(m["line"]), "name": m["func"]})
            else:
                frames.append({"filename": line, "line": 0, "name": ""})
        self.cache[seq] = frames
        return frames


def _device_trace(run: AllocatorRun, frames: _Frames) -> list[dict[str, Any]]:
    """The allocator actions of one device as ``device_traces`` entries."""
    out: list[dict[str, Any]] = []
    append = out.append
    for action, seq, _sid, addr, size in run.events:
        time_us = max(seq, 0)
        if action == FREE:
            fr = frames(seq - 1) if seq > 0 else _BEFORE
            for act in ("free_requested", "free_completed"):
                append({"action": act, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": fr})
        elif action == OOM:
            entry = {"action": "oom", "device_free": addr, "size": size, "stream": 0, "time_us": time_us}
            append({**entry, "frames": frames(seq)})
        elif action in (ALLOC, SEGMENT_ALLOC, SEGMENT_FREE):
            entry = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us}
            append({**entry, "frames": frames(seq)})
        else:  # pragma: no cover - the model emits no other action
            raise AssertionError(f"unknown allocator action {action!r}")
    return out


def _segments(run: AllocatorRun, device: int, frames: _Frames) -> list[dict[str, Any]]:
    """The segments held at the end of the run, in the layout of ``SegmentInfo``/``BlockInfo``."""
    row_of = {sid: i for i, sid in enumerate(run.storage.tolist())}
    nbytes = run.nbytes.tolist()
    alloc_seq = run.alloc_seq.tolist()
    out = []
    for seg in run.segments:
        blocks = []
        allocated = requested = 0
        for addr, size, sid in seg.blocks:
            if sid < 0:
                blocks.append({"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []})
                continue
            row = row_of[sid]
            allocated += size
            requested += nbytes[row]
            state = "active_allocated"
            block = {"address": addr, "size": size, "requested_size": nbytes[row], "state": state}
            blocks.append({**block, "frames": frames(alloc_seq[row])})
        out.append(
            {
                "device": device,
                "address": seg.address,
                "total_size": seg.size,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": 0,
                "segment_type": "small" if seg.is_small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": frames(seg.seq),
                "blocks": blocks,
            }
        )
    return out


def export_memory_snapshot(
    trace: Any, path: str | Path | None = None, *, capacity: int | str | None = None
) -> dict[str, Any]:
    """A ``torch.cuda.memory._snapshot()``-style dict of the modelled allocator over a trace.

    Every cuda device of the trace is replayed through the allocator model
    (:func:`fakeviz._analysis.allocator.replay_trace`), and its segments and actions
    are reported under its CUDA device index.

    Args:
        trace: a :class:`~fakeviz.Trace` with at least one cuda device.
        path: if given, the snapshot is also pickled there (what
            ``torch.cuda.memory._dump_snapshot`` writes and
            ``python -m torch.cuda._memory_viz`` / pytorch.org/memory_viz read).
        capacity: memory available to the allocator per device (bytes, ``"80GB"``
            or a GPU name); allocations past it release cached segments and are
            then reported as ``oom`` entries.

    Returns:
        The snapshot dict (also carries a ``"fakeviz"`` entry with the model's
        peaks per device; PyTorch's readers ignore it).

    Raises:
        ValueError: if the trace has no cuda device.
    """
    cap = Capacity.parse(capacity).bytes if capacity is not None else None
    st = storages_table(trace)
    names = sorted({str(d) for d in st["device"].astype(object).dropna().unique()})
    devices = {name: _cuda_index(name) for name in names}
    devices = {name: idx for name, idx in devices.items() if idx is not None}
    if not devices:
        found = ", ".join(names) or "none"
        raise ValueError(f"the trace has no cuda device to export a CUDA memory snapshot for (devices: {found})")
    frames = _Frames(trace)
    n_dev = max(devices.values()) + 1
    device_traces: list[list[dict[str, Any]]] = [[] for _ in range(n_dev)]
    segments: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for name, idx in sorted(devices.items(), key=lambda kv: kv[1]):
        run = replay_trace(trace, name, capacity=cap)
        device_traces[idx].extend(_device_trace(run, frames))
        segments.extend(_segments(run, idx, frames))
        summary[name] = run.summary()
    snapshot = {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "roundup_power2_divisions": {},
        },
        "fakeviz": {
            "source": "fakeviz allocator model (fakeviz._analysis.allocator), not a real GPU",
            "num_ops": trace.num_ops,
            "capacity": cap,
            "devices": summary,
        },
    }
    if path is not None:
        with open(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=_PICKLE_PROTOCOL)
    return snapshot
