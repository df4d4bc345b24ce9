"""Memory analysis: categories, the per-device timeline and peak attribution.

Pure functions of a :class:`~fakeviz.Trace` (NumPy and pandas only). Storages,
never tensors, are the unit: a storage counts from the op that produced it until
the op after which it was freed (``Trace.live_bytes``).

Categories
----------
Each storage gets exactly one category, from what the recorder saw it used as
(``ROLES``) and the phase of the op that created it, in this order:

==================  ==========================================================
Parameter           a parameter of a module seen in the run
Buffer              a registered buffer
Gradient            the ``.grad`` of a leaf after a backward (or at an optimizer step)
Optimizer state     a tensor in ``optimizer.state`` after a step
Input               an argument of a top-level module call (not a parameter)
Activation          saved for backward, as autograd's saved-tensor hooks report it
Temporary           anything else created once the run started: in forward,
                    backward or optimizer ops, or at top level after the first
                    forward (the loss, its ``ones_like`` seed)
Other               anything else (created at init, before the first forward,
                    or before recording)
==================  ==========================================================

The category holds for the storage's whole life. This is where we differ from
PyTorch's MemTracker on purpose: MemTracker labels a tensor when it first sees
it, so a gradient produced by a backward op is counted as "Temp" until the
AccumulateGrad that makes it ``.grad``, and stays "Temp" in the snapshot at the
backward peak. The bytes are the same storage before and after; we call them
Gradient all along (``tests/test_memory.py`` shows it on GPT-2).

Activations are the storages autograd saved for backward (MemTracker's "Act"
is every tensor created in a module's forward). A view of a parameter saved for
backward stays a Parameter; checkpointed regions save nothing, so their
recomputed tensors are Temporary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._trace import (
    CATEGORIES,
    PHASES,
    ROLE_BUFFER,
    ROLE_GRAD,
    ROLE_INPUT,
    ROLE_OPT,
    ROLE_PARAM,
    ROLE_SAVED,
)

__all__ = ["Peak", "allocator_run", "decimate_minmax", "live_curve", "memory_timeline", "peaks", "storage_categories"]

C_PARAM, C_BUFFER, C_GRAD, C_OPT, C_ACT, C_TEMP, C_INPUT, C_OTHER = range(len(CATEGORIES))
_P_FORWARD, _P_BACKWARD, _P_OPTIMIZER, _P_OTHER = (
    PHASES.index(p) for p in ("forward", "backward", "optimizer", "other")
)
# (role bit, category) in priority order
_ROLE_ORDER = (
    (ROLE_PARAM, C_PARAM),
    (ROLE_BUFFER, C_BUFFER),
    (ROLE_GRAD, C_GRAD),
    (ROLE_OPT, C_OPT),
    (ROLE_INPUT, C_INPUT),
    (ROLE_SAVED, C_ACT),
)


def storage_categories(trace: Any) -> np.ndarray:
    """One category code (index into :data:`CATEGORIES`) per storage."""
    roles = trace.col("st_roles").astype(np.int64)
    alloc = trace.col("st_alloc")
    phase_col = trace.col("phase")
    n_ops = len(phase_col)
    made = (alloc >= 0) & (alloc < n_ops)
    phase = np.full(len(alloc), -1, np.int64)
    if n_ops:
        phase[made] = phase_col[alloc[made]]
    in_run = (phase == _P_FORWARD) | (phase == _P_BACKWARD) | (phase == _P_OPTIMIZER) | (phase == _P_OTHER)
    cat = np.where(in_run, C_TEMP, C_OTHER).astype(np.int8)
    for bit, code in reversed(_ROLE_ORDER):  # highest priority written last
        cat[(roles & bit) != 0] = code
    return cat


def live_curve(trace: Any, sel: np.ndarray) -> np.ndarray:
    """Live bytes of the selected storages after each op (symbolic and empty storages count 0)."""
    n = len(trace.col("op"))
    nb = trace.col("st_nbytes")[sel]
    ok = nb > 0
    nb = nb[ok]
    alloc = np.maximum(trace.col("st_alloc")[sel][ok], 0)
    free = trace.col("st_free")[sel][ok]
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, np.minimum(alloc, n), nb)
    freed = free >= 0
    np.add.at(delta, np.minimum(free[freed], n), -nb[freed])
    return np.cumsum(delta)[:n]


def category_curves(trace: Any) -> dict[str, np.ndarray]:
    """Per device: an (n_ops, n_categories) int64 array of live bytes after each op."""
    trace._freeze()
    n = trace.num_ops
    cats = storage_categories(trace)
    dev = trace.col("st_device")
    devices = trace.strings("devices")
    out = {}
    for d in np.unique(dev).tolist():
        arr = np.zeros((n, len(CATEGORIES)), dtype=np.int64)
        on_dev = dev == d
        for c in np.unique(cats[on_dev]).tolist():
            arr[:, c] = live_curve(trace, on_dev & (cats == c))
        out[devices[d]] = arr
    return out


def memory_timeline(trace: Any, *, device: str | None = None, allocator: bool = True) -> Any:
    """Live bytes per device and category after every op (a long pandas DataFrame).

    One row per (device, op): ``device, seq, phase, <one column per category>,
    total``; for cuda devices with ``allocator=True`` also ``allocated`` and
    ``reserved`` from the caching-allocator model (``fakeviz._allocator``).
    """
    import pandas as pd

    curves = category_curves(trace)
    phase = trace.col("phase")
    frames = []
    for dev, arr in curves.items():
        if device is not None and dev != device:
            continue
        n = len(arr)
        cols: dict[str, Any] = {
            "device": pd.Categorical([dev] * n, categories=list(curves)),
            "seq": np.arange(n, dtype=np.int64),
            "phase": pd.Categorical.from_codes(phase.astype(np.int32), categories=list(PHASES)),
        }
        for i, name in enumerate(CATEGORIES):
            cols[name] = arr[:, i]
        cols["total"] = arr.sum(axis=1)
        if allocator and dev.startswith("cuda"):
            run = _allocator_run(trace, dev)
            cols["allocated"] = run.allocated
            cols["reserved"] = run.reserved
        frames.append(pd.DataFrame(cols))
    if not frames:
        cols = {"device": pd.Categorical([]), "seq": np.zeros(0, np.int64), "phase": pd.Categorical([])}
        cols.update({name: np.zeros(0, np.int64) for name in CATEGORIES})
        cols["total"] = np.zeros(0, np.int64)
        return pd.DataFrame(cols)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def allocator_run(trace: Any, dev: str, capacity: int | None = None) -> Any:
    """The caching-allocator model of device ``dev`` with ``capacity`` bytes (None: no limit), cached."""
    key = ("allocator", dev, capacity)
    run = trace._cache.get(key)
    if run is None:
        from ._allocator import simulate_trace

        run = trace._cache[key] = simulate_trace(trace, dev, capacity=capacity)
    return run


def _allocator_run(trace: Any, dev: str) -> Any:
    """The allocator model with the trace's own capacity (``meta["capacity"]``), as the views show it."""
    capacity = trace.meta.get("capacity")
    cap = None
    if capacity:
        from ._gpus import parse_capacity

        cap = parse_capacity(capacity)
    return allocator_run(trace, dev, cap)


def decimate_minmax(values: np.ndarray, max_points: int, keep: Iterable[int] = ()) -> np.ndarray:
    """Row indices (sorted, unique, at most ``max_points``) that keep the shape of ``values``.

    The first and last rows, the first row of the global maximum (the peak) and
    every index in ``keep`` are kept; the rest of the budget is split into equal
    buckets, each contributing the row of its minimum and of its maximum, so no
    spike and no dip is hidden. Raises ValueError when ``max_points`` leaves no
    room for one bucket beside the kept rows (and the curve must be cut).
    """
    values = np.asarray(values)
    n = len(values)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    kept = {0, n - 1, int(np.argmax(values)), *(int(k) for k in keep if 0 <= int(k) < n)}
    if max_points < len(kept) + 2:
        raise ValueError(f"max_points={max_points} leaves no room for buckets beside {len(kept)} kept rows")
    buckets = (max_points - len(kept)) // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    out = set(kept)
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if b > a:
            seg = values[a:b]
            out.add(a + int(np.argmin(seg)))
            out.add(a + int(np.argmax(seg)))
    return np.array(sorted(out), dtype=np.int64)


@dataclass
class Peak:
    """The peak of live memory on one device and what set it.

    ``bytes`` is raw tensor bytes (the sum of live storages' sizes) at op ``seq``,
    the first op where the maximum is reached; ``by_category`` splits it;
    ``top`` lists the largest live storages at that op with their category and
    the op, module and line that created them. On cuda devices ``allocated`` and
    ``reserved`` are the caching-allocator model's own peaks (which may be at
    other ops: ``allocated_seq``, ``reserved_seq``).
    """

    device: str
    bytes: int
    seq: int
    phase: str
    op: str
    module: str | None
    user_line: str | None
    by_category: dict[str, int]
    top: Any = field(repr=False)
    allocated: int | None = None
    allocated_seq: int | None = None
    reserved: int | None = None
    reserved_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "top"}
        d["top"] = self.top.to_dict("records")
        return d

    def _repr_html_(self) -> str:
        import html

        from ._trace import _fmt_bytes

        cats = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in self.by_category.items() if v)
        return (
            f"<div class='fv-peak'><b>{html.escape(self.device)}</b> peaks at {_fmt_bytes(self.bytes)} "
            f"in {html.escape(self.phase)} at op {self.seq} {html.escape(self.op)} "
            f"({html.escape(self.module or '<top level>')}, {html.escape(self.user_line or '<unknown line>')})"
            f"<br>{html.escape(cats)}{self.top.to_html(index=False)}</div>"
        )


def peaks(trace: Any, *, top: int = 10) -> dict[str, Peak]:
    """Per device: the peak live bytes, the op/module/line that set it, and what was alive."""
    curves = category_curves(trace)
    n = trace.num_ops
    if n == 0:
        return {}
    st = trace.storages
    strings = trace.strings
    ops, mods, lines = strings("ops"), strings("modules"), strings("lines")
    op_col, mod_col, line_col, phase_col = (trace.col(k) for k in ("op", "module", "line", "phase"))
    out = {}
    for dev, arr in curves.items():
        total = arr.sum(axis=1)
        if not total.any():
            continue  # only empty storages on this device (e.g. a 0-element cpu tensor)
        seq = int(np.argmax(total))
        alive = (
            (st.device == dev).to_numpy()
            & (np.maximum(st.alloc_seq.to_numpy(), 0) <= seq)
            & ((st.free_seq.to_numpy() < 0) | (st.free_seq.to_numpy() > seq))
            & (st.nbytes.to_numpy() > 0)
        )
        live = st[alive].sort_values("nbytes", ascending=False, kind="stable").head(top)
        live = live[["storage", "nbytes", "category", "name", "op", "module", "user_line", "alloc_seq"]]
        m, ln = int(mod_col[seq]), int(line_col[seq])
        pk = Peak(
            device=dev,
            bytes=int(total[seq]),
            seq=seq,
            phase=PHASES[int(phase_col[seq])],
            op=ops[int(op_col[seq])],
            module=mods[m] if m >= 0 else None,
            user_line=lines[ln] if ln >= 0 else None,
            by_category={name: int(arr[seq, i]) for i, name in enumerate(CATEGORIES)},
            top=live.reset_index(drop=True),
        )
        if dev.startswith("cuda"):
            run = _allocator_run(trace, dev)
            pk.allocated, pk.allocated_seq = int(run.peak_allocated), int(run.peak_allocated_seq)
            pk.reserved, pk.reserved_seq = int(run.peak_reserved), int(run.peak_reserved_seq)
        out[dev] = pk
    return out
