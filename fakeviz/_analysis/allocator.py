"""A model of PyTorch's CUDA caching allocator, replayed over a recorded trace.

:func:`replay` replays the storage allocations and frees of one device, in
the order the recorder saw them, through a re-implementation of the default
``CUDACachingAllocator`` (``DeviceCachingAllocator`` in
``c10/cuda/CUDACachingAllocator.cpp``; constants in ``c10/core/AllocatorConfig.h``
since PyTorch 2.8, in ``CUDACachingAllocator.cpp`` before), and reports what
``torch.cuda.memory_stats()`` would report: ``allocated_bytes`` (blocks handed
out, after rounding and unsplit remainders), ``reserved_bytes`` (segments
obtained with ``cudaMalloc``) and ``requested_bytes`` (the raw sizes asked for).

Sources checked: the installed ``c10/core/AllocatorConfig.h`` of torch 2.13
for the constants, and ``c10/cuda/CUDACachingAllocator.cpp`` of the
pytorch/pytorch repository for the logic (a 2024-25 revision; the default
path has not changed in the functions named below for several releases).

Rules modelled, with their source (functions of ``DeviceCachingAllocator`` in
``c10/cuda/CUDACachingAllocator.cpp`` unless named otherwise)
-----------------------------------------------------------------------------

* Constants (``c10/core/AllocatorConfig.h``): ``kMinBlockSize = 512``,
  ``kSmallSize = 1 MiB``, ``kSmallBuffer = 2 MiB``, ``kMinLargeAlloc = 10 MiB``,
  ``kRoundLarge = 2 MiB``; ``kLargeBuffer = 20 MiB`` (``CUDACachingAllocator.cpp``).
* Zero-byte requests allocate nothing and return a null pointer
  (``NativeCachingAllocator::allocate``: ``if (size != 0) malloc(...)``).
* ``round_size``: below 512 bytes round to 512, else round up to a multiple of
  512 (``roundup_power2_divisions`` unset).
* ``get_pool``: rounded sizes ``<= kSmallSize`` use the small pool, the rest
  the large pool. Each pool caches its own free blocks; one stream.
* ``get_free_block``: best fit, the first free block of the pool in
  ``BlockComparatorSize`` order (stream, size, address) whose size is ``>=``
  the rounded request, i.e. the smallest fitting block and, among equal sizes,
  the lowest address. (The ``max_split_size`` checks are inert at their default.)
* ``get_allocation_size``: a new segment for a small request is
  ``kSmallBuffer``; for a large request below ``kMinLargeAlloc`` it is
  ``kLargeBuffer``; otherwise the request rounded up to ``kRoundLarge``.
* ``alloc_block``: the new segment (``cudaMalloc``) is one free block, which
  then goes through the same split rule as a cached one.
* ``should_split``: small pool: split when the remainder is ``>= kMinBlockSize``;
  large pool: split when the remainder is ``> kSmallSize``.
* ``alloc_found_block``: on a split the allocated block keeps the lower
  address and the remainder (higher address) goes back to the pool. Without a
  split the whole block is handed out, and ``allocated_bytes`` grows by the
  block's full size (``increase_stat(stats.allocated_bytes, block->size)``).
* ``free`` / ``free_block`` / ``try_merge_blocks``: a freed block merges with
  its free neighbours (``prev``/``next``, same segment only) and returns to its
  pool; ``allocated_bytes`` drops by the block's size.
* Segments are never returned to CUDA by the allocator on its own (no
  ``empty_cache`` calls in a recorded run), except on memory pressure:
  ``malloc`` -> ``alloc_block`` fails -> ``release_available_cached_blocks``
  (a no-op while ``max_split_size`` is unset) -> ``release_cached_blocks``,
  which frees every cached block that is a whole segment (``release_blocks``:
  ``!block->prev && !block->next``; large pool first, then small), then one
  more ``alloc_block``; if that fails too, ``malloc`` records an ``oom`` trace
  entry and raises ``OutOfMemoryError``.
  Memory pressure is modelled with ``capacity``: a new segment fails when
  ``reserved + segment size > capacity``, which is exactly the
  ``set_per_process_memory_fraction`` test in ``alloc_block``
  (``total_allocated_memory + size > allowed_memory_maximum``). After an OOM the
  model records it and allocates the segment anyway, so the curves stay complete.
* Statistics (``increase_stat``/``decrease_stat``): ``peak`` is the running
  maximum over every change, so a peak reached inside an op counts.

Not modelled
------------
* Memory allocated by libraries through the caching allocator but invisible
  to the recorder: cuBLAS/cuBLASLt workspaces (allocated on the first matmul
  of a handle/stream and kept), cuDNN and other per-op workspaces, NCCL buffers.
* Memory outside the caching allocator: the CUDA context, kernels/modules,
  cuBLAS/cuDNN handles, other processes. ``capacity`` is the memory *available
  to the allocator*, not the card's total.
* Other streams, ``record_stream`` and the events that delay reuse, CUDA graph
  private pools, ``torch.cuda.empty_cache`` calls inside the run.
* ``PYTORCH_CUDA_ALLOC_CONF`` options: ``roundup_power2_divisions``,
  ``max_split_size_mb`` (oversize blocks), ``max_non_split_rounding_mb``,
  ``garbage_collection_threshold``, ``expandable_segments``,
  ``release_lock_on_cudamalloc``; free-memory callbacks
  (``trigger_free_memory_callbacks``).
* Real device addresses: segments get increasing virtual addresses (2 MiB
  aligned, with a gap so segments never touch), so best-fit ties between equal
  sizes may break differently on a real GPU, whose ``cudaMalloc`` addresses
  are not ordered by creation.
* Allocations inside an op that the recorder does not see (temporaries an op
  frees before returning), and the exact interleaving of an op's frees and
  allocations: per op, the storages freed before it come first, then the ones
  it produced, in storage-id order.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .._core.gpus import Capacity
from .._core.record import Record
from .tables import storages_table

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorRun",
    "Segment",
    "allocation_size",
    "round_size",
    "replay",
    "replay_trace",
]

K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # "small" allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 << 20  # "large" allocations below kMinLargeAlloc get 20 MiB segments
K_MIN_LARGE_ALLOC = 10 << 20  # allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 << 20  # larger segments are rounded up to 2 MiB

#: First virtual segment address (looks like a device pointer; below 2**53 so
#: JavaScript viewers keep it exact).
BASE_ADDRESS = 0x7F00_0000_0000
_SEG_ALIGN = 2 << 20  # segment addresses are 2 MiB aligned ...
_SEG_GAP = 2 << 20  # ... and separated by a gap, so neighbour lookups never cross segments
_SHIFT = 64  # free-pool key: size << 64 | address, ordered like BlockComparatorSize

# event actions, in the vocabulary of torch.cuda.memory._snapshot()["device_traces"]
ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM = "alloc", "free", "segment_alloc", "segment_free", "oom"


def round_size(n: int) -> int:
    """Bytes a request of ``n`` bytes is rounded to (``round_size``: multiples of 512, at least 512).

    Args:
        n: requested bytes (> 0).

    Returns:
        The rounded size the allocator searches for.
    """
    if n < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((n + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(n: int) -> int:
    """Size of the segment ``cudaMalloc``-ed for a rounded request of ``n`` bytes (``get_allocation_size``).

    Args:
        n: rounded request size (see :func:`round_size`).

    Returns:
        2 MiB for small requests (<= 1 MiB), 20 MiB for requests below 10 MiB,
        else ``n`` rounded up to a multiple of 2 MiB.
    """
    if n <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if n < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((n + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass
class Segment:
    """One ``cudaMalloc``-ed segment at the end of the run.

    Attributes:
        address: virtual base address.
        size: segment bytes.
        is_small: whether it belongs to the small pool.
        seq: op index whose allocation created it (-1: before the first op).
        storage: storage id whose allocation created it.
        blocks: ``(address, size, storage)`` from the lowest address up;
            ``storage`` is -1 for a free (cached) block.
    """

    address: int
    size: int
    is_small: bool
    seq: int
    storage: int
    blocks: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class AllocatorRun:
    """What the modelled allocator did over one device's storages.

    Curves are indexed by op index ``i`` and hold the state after op ``i``'s
    frees and allocations (the same sampling as :meth:`fakeviz.Trace.live_bytes`).

    Attributes:
        allocated: bytes in allocated blocks (``allocated_bytes.all.current``).
        reserved: bytes in segments (``reserved_bytes.all.current``).
        requested: raw requested bytes of the live storages
            (``requested_bytes.all.current``; equals ``Trace.live_bytes()[device]``).
        storage: storage id of every row passed in.
        nbytes: requested bytes of every row passed in.
        alloc_seq: op index that allocated every row (-1: before the first op).
        block_addr: per row, address of its block (-1: nothing allocated:
            zero or symbolic size).
        block_size: per row, bytes of its block as charged to ``allocated``
            (0 when nothing was allocated).
        peak_allocated: ``allocated_bytes.all.peak`` (a running maximum over every change).
        peak_allocated_seq: op index where it was first reached (-1: before the first op).
        peak_reserved: ``reserved_bytes.all.peak``.
        peak_reserved_seq: op index where it was first reached.
        peak_requested: ``requested_bytes.all.peak``.
        oom_seq: op index of the first modelled out-of-memory (-1 none; only with ``capacity``).
        num_ooms: number of modelled out-of-memory errors.
        capacity: the capacity simulated (None: unlimited).
        segments: the segments held at the end, by address.
    """

    allocated: np.ndarray
    reserved: np.ndarray
    requested: np.ndarray
    storage: np.ndarray
    nbytes: np.ndarray
    alloc_seq: np.ndarray
    block_addr: np.ndarray
    block_size: np.ndarray
    peak_allocated: int
    peak_allocated_seq: int
    peak_reserved: int
    peak_reserved_seq: int
    peak_requested: int
    oom_seq: int
    num_ooms: int
    capacity: int | None
    segments: list[Segment]
    # the event log in compact form (see _event_order and replay), expanded by `events`
    _code: np.ndarray = field(repr=False)
    _seq: np.ndarray = field(repr=False)
    _extra: list[tuple[int, str, int, int, int, int]] = field(repr=False)  # (row that caused it, event...)

    @cached_property
    def events(self) -> list[tuple[str, int, int, int, int]]:
        """Everything the allocator did, in order: ``(action, seq, storage, addr, size)``.

        ``action`` is ``alloc`` / ``free`` (``size`` = requested bytes),
        ``segment_alloc`` / ``segment_free`` (``size`` = segment bytes;
        ``storage`` = the request that caused it) or ``oom`` (``addr`` = the
        modelled free device memory, ``size`` = the rounded request). ``seq`` is
        the op index (-1: before the first op; ``n_ops``: freed after the last op).
        """
        ids = self.storage.tolist()
        addrs = self.block_addr.tolist()
        nbytes = self.nbytes.tolist()
        out: list[tuple[str, int, int, int, int]] = []
        append = out.append
        extra = self._extra
        k = 0
        for code, seq in zip(self._code.tolist(), self._seq.tolist()):
            row = code >> 1
            while k < len(extra) and extra[k][0] == row and not code & 1:
                append(extra[k][1:])
                k += 1
            append((FREE if code & 1 else ALLOC, seq, ids[row], addrs[row], nbytes[row]))
        out.extend(e[1:] for e in extra[k:])
        return out

    @cached_property
    def segments_freed(self) -> int:
        """Segments returned to CUDA under memory pressure (``release_cached_blocks`` before a retry; only with
        ``capacity``): 0 when the run never had to free its cached blocks."""
        return sum(1 for e in self._extra if e[1] == SEGMENT_FREE)

    def summary(self) -> dict[str, Any]:
        """Peaks and segment count as a small JSON-able dict."""
        return {
            "peak_allocated": self.peak_allocated,
            "peak_allocated_seq": self.peak_allocated_seq,
            "peak_reserved": self.peak_reserved,
            "peak_reserved_seq": self.peak_reserved_seq,
            "peak_requested": self.peak_requested,
            "segments": len(self.segments),
            "oom_seq": self.oom_seq,
            "num_ooms": self.num_ooms,
            "capacity": self.capacity,
        }


def _event_order(
    nbytes: np.ndarray, alloc_seq: np.ndarray, free_seq: np.ndarray, n_ops: int
) -> tuple[np.ndarray, np.ndarray]:
    """All events in replay order, as ``(code, seq)``: ``code = 2 * row + is_free``, ``seq`` = op index.

    An allocation by op ``k`` happens at time ``2k + 1`` (pre-existing: -1), a
    free before op ``k`` at time ``2k``; ties break by kind (a storage freed in
    the op that made it is freed after its allocation), then by row. The
    resulting ``seq`` column is non-decreasing.
    """
    rows = np.flatnonzero(nbytes > 0)
    a_seq = np.maximum(alloc_seq[rows], -1)
    f = free_seq[rows]
    a_t = np.where(a_seq < 0, -1, 2 * a_seq + 1)
    freed = f >= 0
    fr = rows[freed]
    f_a = a_seq[freed]
    f_s = np.minimum(f[freed], n_ops)
    # a free that does not come after its allocation (the recorder does not
    # produce one) is placed right after that allocation
    transient = f_s <= f_a
    f_seq = np.where(transient, f_a, f_s)
    f_t = np.where(transient, a_t[freed], 2 * f_s)
    code = np.concatenate([2 * rows, 2 * fr + 1]).astype(np.int64)
    t = np.concatenate([a_t, f_t])
    seq = np.concatenate([a_seq, f_seq]).astype(np.int64)
    order = np.lexsort((code, t))
    return code[order], seq[order]


def replay(
    nbytes: np.ndarray | list[int],
    alloc_seq: np.ndarray | list[int],
    free_seq: np.ndarray | list[int],
    n_ops: int,
    *,
    capacity: int | None = None,
    storage_ids: np.ndarray | list[int] | None = None,
) -> AllocatorRun:
    """Replay allocations and frees through the modelled caching allocator.

    Events, in order: the storages that existed before the first op
    (``alloc_seq == -1``), then for each op ``k``: the frees with
    ``free_seq == k``, then the allocations with ``alloc_seq == k``; each group
    in row order. Frees with ``free_seq == n_ops`` come last.

    Args:
        nbytes: bytes per storage row (<= 0: nothing is allocated: zero-size
            storages get a null pointer, -1 marks a symbolic size).
        alloc_seq: op index that produced each storage (-1: before the first op).
        free_seq: op index before which it was freed (-1: alive at the end;
            ``n_ops``: freed after the last op).
        n_ops: number of ops (length of the curves).
        capacity: bytes available to the allocator; a new segment beyond it
            first releases every fully free cached segment, then counts as an
            out-of-memory error (recorded, and the run goes on).
        storage_ids: ids reported in :attr:`AllocatorRun.storage` and in the
            events (default: the row numbers).

    Returns:
        The :class:`AllocatorRun`.

    Raises:
        ValueError: on columns of different lengths or a negative capacity.
    """
    nb = np.asarray(nbytes, dtype=np.int64)
    al = np.asarray(alloc_seq, dtype=np.int64)
    fr = np.asarray(free_seq, dtype=np.int64)
    if not len(nb) == len(al) == len(fr):
        raise ValueError(f"nbytes, alloc_seq and free_seq differ in length: {len(nb)}, {len(al)}, {len(fr)}")
    ids = np.arange(len(nb), dtype=np.int64) if storage_ids is None else np.asarray(storage_ids, dtype=np.int64)
    if len(ids) != len(nb):
        raise ValueError(f"storage_ids has {len(ids)} entries for {len(nb)} storages")
    if capacity is not None:
        capacity = int(capacity)
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
    code, seq = _event_order(nb, al, fr, n_ops)

    nb_l = nb.tolist()
    ids_l = ids.tolist()
    block_addr = [-1] * len(nb)
    block_size = [0] * len(nb)
    small_row = [False] * len(nb)

    small: list[int] = []  # free blocks of the small pool as sorted keys size << 64 | addr
    large: list[int] = []  # ... and of the large pool (BlockComparatorSize order, one stream)
    free_start: dict[int, int] = {}  # free block addr -> size
    free_end: dict[int, int] = {}  # free block end -> addr
    live: dict[int, int] = {}  # allocated block addr -> row
    segs: dict[int, tuple[int, bool, int, int]] = {}  # base -> (size, is_small, seq, storage id)
    next_base = BASE_ADDRESS
    reserved = 0
    # segment and oom events: (row whose allocation caused them, action, seq, storage, addr, size)
    extra: list[tuple[int, str, int, int, int, int]] = []
    mask = (1 << _SHIFT) - 1

    def release_cached(row: int, s: int, sid: int) -> int:
        """release_cached_blocks: cudaFree every cached block that is a whole segment (large pool, then small)."""
        freed = 0
        for pool in (large, small):
            keep = []
            for key in pool:
                addr, size = key & mask, key >> _SHIFT
                seg = segs.get(addr)
                if seg is not None and seg[0] == size:
                    del segs[addr], free_start[addr], free_end[addr + size]
                    extra.append((row, SEGMENT_FREE, s, sid, addr, size))
                    freed += size
                else:
                    keep.append(key)
            pool[:] = keep
        return freed

    for c, s in zip(code.tolist(), seq.tolist()):
        row = c >> 1
        if not c & 1:  # malloc
            n = nb_l[row]
            size = K_MIN_BLOCK_SIZE if n < K_MIN_BLOCK_SIZE else -(-n // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
            small_req = size <= K_SMALL_SIZE
            pool = small if small_req else large
            i = bisect_left(pool, size << _SHIFT)
            if i < len(pool):  # get_free_block: best fit (smallest size, then lowest address)
                key = pool.pop(i)
                addr, bsize = key & mask, key >> _SHIFT
                del free_start[addr], free_end[addr + bsize]
            else:  # alloc_block: a new segment
                bsize = allocation_size(size)
                if capacity is not None and reserved + bsize > capacity:
                    reserved -= release_cached(row, s, ids_l[row])
                    if reserved + bsize > capacity:
                        extra.append((row, OOM, s, ids_l[row], max(capacity - reserved, 0), size))
                addr = next_base
                next_base = -(-(addr + bsize + _SEG_GAP) // _SEG_ALIGN) * _SEG_ALIGN
                segs[addr] = (bsize, small_req, s, ids_l[row])
                reserved += bsize
                extra.append((row, SEGMENT_ALLOC, s, ids_l[row], addr, bsize))
            remaining = bsize - size
            if (remaining >= K_MIN_BLOCK_SIZE) if small_req else (remaining > K_SMALL_SIZE):  # should_split
                rest = addr + size
                insort(pool, (remaining << _SHIFT) | rest)
                free_start[rest] = remaining
                free_end[rest + remaining] = rest
                bsize = size
            live[addr] = row
            block_addr[row] = addr
            block_size[row] = bsize
            small_row[row] = small_req
        else:  # free -> free_block, merging with free neighbours (try_merge_blocks)
            addr = block_addr[row]
            bsize = block_size[row]
            pool = small if small_row[row] else large
            del live[addr]
            end = addr + bsize
            nsize = free_start.pop(end, None)
            if nsize is not None:
                del free_end[end + nsize]
                del pool[bisect_left(pool, (nsize << _SHIFT) | end)]
                bsize += nsize
                end += nsize
            prev = free_end.pop(addr, None)
            if prev is not None:
                psize = addr - prev
                del free_start[prev]
                del pool[bisect_left(pool, (psize << _SHIFT) | prev)]
                addr = prev
                bsize += psize
            insort(pool, (bsize << _SHIFT) | addr)
            free_start[addr] = bsize
            free_end[end] = addr

    bs = np.array(block_size, dtype=np.int64)
    curves, peaks = _curves(code, seq, bs, nb, extra, n_ops)
    ooms = [e for e in extra if e[1] == OOM]
    return AllocatorRun(
        allocated=curves[0],
        reserved=curves[1],
        requested=curves[2],
        storage=ids,
        nbytes=nb,
        alloc_seq=np.maximum(al, -1),
        block_addr=np.array(block_addr, dtype=np.int64),
        block_size=bs,
        peak_allocated=peaks[0][0],
        peak_allocated_seq=peaks[0][1],
        peak_reserved=peaks[1][0],
        peak_reserved_seq=peaks[1][1],
        peak_requested=peaks[2][0],
        oom_seq=ooms[0][2] if ooms else -1,
        num_ooms=len(ooms),
        capacity=capacity,
        segments=_final_segments(segs, free_start, live, block_size, ids_l),
        _code=code,
        _seq=seq,
        _extra=extra,
    )


def _curves(
    code: np.ndarray,
    seq: np.ndarray,
    block_size: np.ndarray,
    nbytes: np.ndarray,
    extra: list[tuple[int, str, int, int, int, int]],
    n_ops: int,
) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """Allocated, reserved and requested bytes per op index, and each one's ``(peak, seq of the peak)``.

    Every event changes some counters; the counters after each event are
    cumulative sums, the curve at op ``i`` is the value after the last event
    with ``seq <= i``, and the peak is the maximum over all events (the running
    maximum ``increase_stat`` keeps) with the op index of its first occurrence.
    """
    rows = code >> 1
    sign = 1 - 2 * (code & 1)
    seg = [e for e in extra if e[1] in (SEGMENT_ALLOC, SEGMENT_FREE)]
    seg_seq = np.array([e[2] for e in seg], dtype=np.int64)
    d_res = np.array([e[5] if e[1] == SEGMENT_ALLOC else -e[5] for e in seg], dtype=np.int64)
    curves, peaks = [], []
    steps = np.arange(n_ops)
    for s, d in ((seq, sign * block_size[rows]), (seg_seq, d_res), (seq, sign * nbytes[rows])):
        if len(d) == 0:
            peaks.append((0, -1))
            curves.append(np.zeros(n_ops, dtype=np.int64))
            continue
        cum = np.cumsum(d)
        j = int(np.argmax(cum))
        peaks.append((int(cum[j]), int(s[j])) if cum[j] > 0 else (0, -1))
        last = np.searchsorted(s, steps, side="right")
        curves.append(np.concatenate([[0], cum])[last].astype(np.int64))
    return curves, peaks


def _final_segments(
    segs: dict[int, tuple[int, bool, int, int]],
    free_start: dict[int, int],
    live: dict[int, int],
    block_size: list[int],
    ids: list[int],
) -> list[Segment]:
    """Walk every segment from its base: free blocks from the free map, allocated ones from the live map."""
    out = []
    for base in sorted(segs):
        size, small, seq, sid = segs[base]
        seg = Segment(address=base, size=size, is_small=small, seq=seq, storage=sid)
        addr, end = base, base + size
        while addr < end:
            fsize = free_start.get(addr)
            if fsize is not None:
                seg.blocks.append((addr, fsize, -1))
                addr += fsize
            else:
                row = live[addr]
                seg.blocks.append((addr, block_size[row], ids[row]))
                addr += block_size[row]
        out.append(seg)
    return out


def replay_trace(trace: Record, device: str, *, capacity: int | str | None = None) -> AllocatorRun:
    """Run :func:`replay` over the storages of one device of a record.

    Args:
        trace: the recorded trace.
        device: device string as in ``trace.storages["device"]`` (e.g. ``"cuda:0"``).
        capacity: bytes, a size like ``"80GB"`` or a GPU name (see
            :meth:`fakeviz._core.gpus.Capacity.parse`); see :func:`replay`.

    Returns:
        The :class:`AllocatorRun`; ``storage`` holds the trace's storage ids.
    """
    if capacity is not None:
        capacity = Capacity.parse(capacity).bytes
    st = storages_table(trace)
    sel = (st["device"].astype(object) == device).to_numpy(dtype=bool)
    return replay(
        st["nbytes"].to_numpy()[sel],
        st["alloc_seq"].to_numpy()[sel],
        st["free_seq"].to_numpy()[sel],
        trace.num_ops,
        capacity=capacity,
        storage_ids=st["storage"].to_numpy()[sel],
    )
