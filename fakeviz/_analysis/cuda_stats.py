"""``torch.cuda.memory_stats()`` of a (partial) record, from the caching-allocator model.

A fake cuda session (:mod:`fakeviz._engine.cuda_api`) answers ``torch.cuda.memory_allocated()``,
``memory_reserved()``, ``max_memory_allocated()``, ``memory_stats()`` ... with :func:`memory_stats`, called
on the record *while it is being recorded*: the storages allocated so far and the frees seen so far are
replayed through :func:`fakeviz._analysis.allocator.replay` (with the trace's own capacity, as the views
use it), so a script that prints its memory reads the figures the trace's analyses show afterwards.

"Now" is between two ops: ``n`` ops recorded, every storage the recorder has seen freed so far freed
(``st_free == n``: freed before op ``n``, which has not run yet). The flat keys and their meaning are
torch's (``torch.cuda.memory_stats`` docstring); which ones the model gives is listed in :func:`memory_stats`.
"""

from __future__ import annotations

import numpy as np

from .._core.gpus import capacity_of
from .._core.record import Record
from .._core.schema import ST_COLS, field
from .allocator import ALLOC, FREE, K_SMALL_BUFFER, K_SMALL_SIZE, OOM, SEGMENT_ALLOC, SEGMENT_FREE, replay

__all__ = ["STATS", "memory_stats"]

#: The statistics given per pool (``all``, ``small_pool``, ``large_pool``) and metric
#: (``current``, ``peak``, ``allocated``, ``freed``).
STATS = ("allocation", "allocated_bytes", "active", "active_bytes", "requested_bytes", "segment", "reserved_bytes")
_POOLS = ("all", "small_pool", "large_pool")
_CODES = {ALLOC: 0, FREE: 1, SEGMENT_ALLOC: 2, SEGMENT_FREE: 3, OOM: 4}


def _storages(rec: Record, device: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(nbytes, alloc_seq, free_seq, storage ids, n_ops)`` of one device's storages, live or finished.

    While recording, the builder's flat row array is copied with ``tobytes`` (which holds the GIL: an
    autograd worker thread appending a row cannot find the array exported), and the devices table as a list.
    """
    b = rec.builder
    if b is not None:
        width = len(ST_COLS)
        std = np.frombuffer(b.storage_rows.tobytes(), dtype=np.int64)
        std = std[: len(std) // width * width].reshape(-1, width)
        n_ops = b.num_ops()
        names = list(b.tables["devices"].strings)
        dev, nb = std[:, field(ST_COLS, "st_device")], std[:, field(ST_COLS, "st_nbytes")]
        al, fr = std[:, field(ST_COLS, "st_alloc")], std[:, field(ST_COLS, "st_free")]
    else:
        n_ops = rec.num_ops
        names = rec.strings("devices")
        dev, nb, al, fr = (rec.col(c) for c in ("st_device", "st_nbytes", "st_alloc", "st_free"))
    if device not in names:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty, n_ops
    sel = np.asarray(dev) == names.index(device)
    ids = np.flatnonzero(sel).astype(np.int64)
    return (np.asarray(nb, dtype=np.int64)[sel], np.asarray(al, dtype=np.int64)[sel],
            np.asarray(fr, dtype=np.int64)[sel], ids, n_ops)  # fmt: skip


def memory_stats(rec: Record, device: str, since: int = -1) -> dict[str, int]:
    """What ``torch.cuda.memory_stats(device)`` reports now, by the caching-allocator model.

    Args:
        rec: the record, usually still recording (also a finished one: then "now" is its end).
        device: ``"cuda:0"`` etc.
        since: the op index of the last ``reset_peak_memory_stats`` (-1: never reset). Peaks are the
            running maximum over the allocations made by op ``since`` or later (and before the first op
            when ``since`` is -1); the caller takes the larger of that and the figure at the reset.

    Returns:
        Flat keys as ``torch.cuda.memory_stats`` has them: ``"{stat}.{pool}.{metric}"`` for every stat in
        :data:`STATS` (``active`` equals ``allocation``: one stream, no events delay a free), pools ``all``,
        ``small_pool``, ``large_pool``, metrics ``current``, ``peak``, ``allocated``, ``freed``; the counters
        ``num_alloc_retries`` (mallocs that freed cached segments to retry), ``num_ooms``, ``num_device_alloc``,
        ``num_device_free``, ``num_sync_all_streams`` (0); ``max_split_size`` (-1: unset) and the
        ``oversize_allocations`` / ``oversize_segments`` metrics (0 without ``max_split_size``). Not given:
        ``inactive_split*`` (the model keeps no history of split free blocks) and the per-private-pool figures.
    """
    nb, al, fr, ids, n_ops = _storages(rec, device)
    cap = capacity_of(rec.meta)
    # n_ops + 1 keeps the frees seen since op n-1 (free_seq == n) in order instead of clamping them
    run = replay(nb, al, fr, n_ops + 1, capacity=cap.bytes if cap else None, storage_ids=ids)
    ev = run.events
    n = len(ev)
    act = np.fromiter((_CODES[e[0]] for e in ev), np.int8, n)
    seq = np.fromiter((e[1] for e in ev), np.int64, n)
    sid = np.fromiter((e[2] for e in ev), np.int64, n)
    size = np.fromiter((e[4] for e in ev), np.int64, n)
    block = act <= 1
    rows = np.searchsorted(run.storage, sid[block])
    bsize = np.zeros(n, dtype=np.int64)
    bsize[block] = run.block_size[rows]
    small = np.zeros(n, dtype=bool)
    small[block] = run.nbytes[rows] <= K_SMALL_SIZE  # round_size(n) <= kSmallSize: the small pool
    seg = (act == 2) | (act == 3)
    small[seg] = size[seg] == K_SMALL_BUFFER  # small-pool segments are kSmallBuffer; large ones are >= 10 MiB
    sign = np.select([act == 0, act == 1, act == 2, act == 3], [1, -1, 1, -1], 0).astype(np.int64)
    counted = seq >= since
    deltas = {
        "allocation": sign * block,
        "allocated_bytes": sign * bsize,
        "requested_bytes": np.where(block, sign * size, 0),
        "segment": sign * seg,
        "reserved_bytes": np.where(seg, sign * size, 0),
    }
    deltas["active"], deltas["active_bytes"] = deltas["allocation"], deltas["allocated_bytes"]
    out: dict[str, int] = {}
    for stat in STATS:
        d_all = deltas[stat]
        for pool, mask in zip(_POOLS, (None, small, ~small)):
            d = d_all if mask is None else np.where(mask, d_all, 0)
            cum = np.cumsum(d)
            rises = cum[(d > 0) & counted]
            out[f"{stat}.{pool}.current"] = int(cum[-1]) if n else 0
            out[f"{stat}.{pool}.peak"] = int(rises.max()) if len(rises) else 0
            out[f"{stat}.{pool}.allocated"] = int(d[d > 0].sum())
            out[f"{stat}.{pool}.freed"] = int(-d[d < 0].sum())
    for stat in ("oversize_allocations", "oversize_segments"):
        for metric in ("current", "peak", "allocated", "freed"):
            out[f"{stat}.{metric}"] = 0
    retried = sid[(act == 3) | (act == 4)]
    out.update(
        num_alloc_retries=len(np.unique(retried)),
        num_ooms=int((act == 4).sum()),
        num_device_alloc=int((act == 2).sum()),
        num_device_free=int((act == 3).sum()),
        num_sync_all_streams=0,
        max_split_size=-1,
    )
    return dict(sorted(out.items()))
