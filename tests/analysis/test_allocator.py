"""The CUDA caching allocator model and the memory-snapshot exporter.

* Hand-computed sequences pin every rule of ``fakeviz._analysis.allocator`` (rounding,
  pools, segment sizes, best fit, splitting, merging, capacity release and OOM).
* A slow, literal port of ``DeviceCachingAllocator`` (Block objects with
  prev/next links, a pool searched in ``BlockComparatorSize`` order) replays
  random sequences next to the fast model; both must agree on every address.
* On recorded fake-cuda traces, ``requested`` equals ``Trace.live_bytes()``.
* The exported snapshot replays consistently (what PyTorch's viewer assumes
  when it walks the trace backwards from the final segments) and PyTorch's own
  readers in ``torch.cuda._memory_viz`` accept it, in process and via
  ``python -m torch.cuda._memory_viz``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zoo

import fakeviz as fv
from fakeviz._analysis import allocator as A
from fakeviz._analysis.snapshot import export_memory_snapshot

KiB, MiB = 1 << 10, 1 << 20
B0 = A.BASE_ADDRESS


def _next_base(addr: int, size: int) -> int:
    """Where the model puts the segment after one at ``addr`` of ``size`` bytes."""
    return -(-(addr + size + A._SEG_GAP) // A._SEG_ALIGN) * A._SEG_ALIGN


def _blocks(run: A.AllocatorRun) -> list[list[tuple[int, int, int]]]:
    """Final segments as block lists with addresses relative to their segment."""
    return [[(a - s.address, size, sid) for a, size, sid in s.blocks] for s in run.segments]


# ------------------------------------------------------------------ helpers
def test_round_size_and_allocation_size() -> None:
    assert [A.round_size(n) for n in (1, 511, 512, 513, 1000, 1 << 20)] == [512, 512, 512, 1024, 1024, 1 << 20]
    assert A.allocation_size(512) == 2 * MiB
    assert A.allocation_size(1 * MiB) == 2 * MiB  # <= kSmallSize: small pool, 2 MiB segments
    assert A.allocation_size(1 * MiB + 512) == 20 * MiB  # large, below kMinLargeAlloc: 20 MiB
    assert A.allocation_size(10 * MiB - 512) == 20 * MiB
    assert A.allocation_size(10 * MiB) == 10 * MiB  # from kMinLargeAlloc on: rounded to 2 MiB
    assert A.allocation_size(12 * MiB + 512) == 14 * MiB


# ------------------------------------------------------ hand-computed sequences
def test_three_small_allocations_share_one_segment() -> None:
    run = A.replay([1000, 2000, 100], [0, 1, 2], [-1, -1, -1], 3)
    assert run.block_size.tolist() == [1024, 2048, 512]
    assert (run.block_addr - B0).tolist() == [0, 1024, 3072]  # lower addresses first, one after the other
    assert run.allocated.tolist() == [1024, 3072, 3584]
    assert run.reserved.tolist() == [2 * MiB] * 3
    assert run.requested.tolist() == [1000, 3000, 3100]
    assert _blocks(run) == [[(0, 1024, 0), (1024, 2048, 1), (3072, 512, 2), (3584, 2 * MiB - 3584, -1)]]
    assert run.segments[0].is_small
    assert [e[0] for e in run.events] == ["segment_alloc", "alloc", "alloc", "alloc"]
    assert (run.peak_allocated, run.peak_allocated_seq, run.peak_reserved, run.peak_reserved_seq) == (
        3584,
        2,
        2 * MiB,
        0,
    )


def test_best_fit_reuses_the_600k_hole_not_the_lowest_address() -> None:
    # op 0..3: C 800 KiB, a 512 B separator, A 600 KiB, another separator; op 4 frees C and A;
    # op 4 then asks for 590 KiB: free blocks are 800 KiB @0, 600 KiB @800K+512, and the tail.
    sizes = [800 * KiB, 512, 600 * KiB, 512, 590 * KiB]
    run = A.replay(sizes, [0, 1, 2, 3, 4], [4, -1, 4, -1, -1], 5)
    off = (run.block_addr - B0).tolist()
    assert off[:4] == [0, 800 * KiB, 800 * KiB + 512, 1400 * KiB + 512]
    assert off[4] == 800 * KiB + 512  # the 600 KiB hole: the smallest block that fits
    assert run.block_size[4] == 590 * KiB  # split: 10 KiB >= kMinBlockSize goes back to the pool
    tail = 2 * MiB - 1400 * KiB - 1024
    assert _blocks(run) == [
        [(0, 800 * KiB, -1), (800 * KiB, 512, 1), (800 * KiB + 512, 590 * KiB, 4), (1390 * KiB + 512, 10 * KiB, -1),
         (1400 * KiB + 512, 512, 3), (1400 * KiB + 1024, tail, -1)]
    ]  # fmt: skip
    assert run.reserved[-1] == 2 * MiB


def test_best_fit_ties_break_by_address() -> None:
    # two equal 4 KiB holes: the lower address wins (BlockComparatorSize compares ptr last)
    sizes = [4096, 512, 4096, 512, 4096]
    run = A.replay(sizes, [0, 1, 2, 3, 4], [4, -1, 4, -1, -1], 5)
    assert run.block_addr[4] == run.block_addr[0] == B0


def test_large_request_gets_its_own_rounded_segment() -> None:
    run = A.replay([12 * MiB], [0], [-1], 1)
    assert run.reserved.tolist() == [12 * MiB] and run.allocated.tolist() == [12 * MiB]
    assert not run.segments[0].is_small
    # 12 MiB + 1 B rounds to 12 MiB + 512, the segment to 14 MiB; the 2 MiB - 512 remainder
    # is > kSmallSize, so the block is split and only 12 MiB + 512 counts as allocated
    run = A.replay([12 * MiB + 1], [0], [-1], 1)
    assert run.reserved.tolist() == [14 * MiB]
    assert run.allocated.tolist() == [12 * MiB + 512]
    assert _blocks(run) == [[(0, 12 * MiB + 512, 0), (12 * MiB + 512, 2 * MiB - 512, -1)]]


def test_mid_size_request_splits_a_20mib_segment() -> None:
    # 5 MiB -> 20 MiB segment, split; a second 5 MiB reuses the remainder; 12 MiB does not fit the 10 MiB left
    run = A.replay([5 * MiB, 5 * MiB, 12 * MiB], [0, 1, 2], [-1, -1, -1], 3)
    assert (run.block_addr[:2] - B0).tolist() == [0, 5 * MiB]
    assert run.reserved.tolist() == [20 * MiB, 20 * MiB, 32 * MiB]
    assert run.allocated.tolist() == [5 * MiB, 10 * MiB, 22 * MiB]
    second = _next_base(B0, 20 * MiB)
    assert run.block_addr[2] == second
    assert _blocks(run) == [[(0, 5 * MiB, 0), (5 * MiB, 5 * MiB, 1), (10 * MiB, 10 * MiB, -1)], [(0, 12 * MiB, 2)]]


def test_unsplit_large_remainder_is_charged_as_allocated() -> None:
    # 1.5 MiB -> 20 MiB segment, leaving 18.5 MiB; an 18 MiB request takes that block whole:
    # the 0.5 MiB remainder is not > kSmallSize, so no split, and allocated grows by 18.5 MiB
    run = A.replay([3 * MiB // 2, 18 * MiB], [0, 1], [-1, -1], 2)
    assert run.block_size.tolist() == [3 * MiB // 2, 37 * MiB // 2]
    assert run.allocated.tolist() == [3 * MiB // 2, 20 * MiB]
    assert run.requested.tolist() == [3 * MiB // 2, 39 * MiB // 2]
    assert run.reserved.tolist() == [20 * MiB, 20 * MiB]
    # same for a fresh segment: 19.5 MiB -> a 20 MiB segment, remainder 0.5 MiB stays in the block
    run = A.replay([39 * MiB // 2], [0], [-1], 1)
    assert run.block_size.tolist() == [20 * MiB] and run.allocated.tolist() == [20 * MiB]


def test_free_merges_with_free_neighbours() -> None:
    # three 2 MiB blocks in one 20 MiB segment; free the outer ones, then the middle one
    sizes = [2 * MiB, 2 * MiB, 2 * MiB, 19 * MiB]
    run = A.replay(sizes, [0, 1, 2, 4], [3, 4, 3, -1], 5)
    # after op 3: [A free][B][C free + tail free merged]; after op 4's free of B: one 20 MiB block,
    # which the 19 MiB request then reuses whole (remainder 1 MiB is not > kSmallSize): no new segment
    assert run.reserved.tolist() == [20 * MiB] * 5
    assert run.block_addr[3] == B0
    assert run.block_size[3] == 20 * MiB
    assert run.allocated.tolist() == [2 * MiB, 4 * MiB, 6 * MiB, 2 * MiB, 20 * MiB]
    assert _blocks(run) == [[(0, 20 * MiB, 3)]]


def test_merge_only_within_a_segment() -> None:
    # two 2 MiB small segments; freeing everything gives two free segments, never one 4 MiB block
    run = A.replay([1 * MiB, 1 * MiB, 1 * MiB, 1 * MiB], [0, 0, 0, 0], [1, 1, 1, 1], 2)
    assert [(s.size, s.blocks) for s in run.segments] == [
        (2 * MiB, [(run.segments[0].address, 2 * MiB, -1)]),
        (2 * MiB, [(run.segments[1].address, 2 * MiB, -1)]),
    ]


def test_frees_of_an_op_come_before_its_allocations() -> None:
    # storage 0 is freed before op 1, which allocates storage 1 of the same size: same address
    run = A.replay([1 * MiB, 1 * MiB], [0, 1], [1, -1], 2)
    assert run.block_addr[0] == run.block_addr[1]
    assert run.reserved.tolist() == [2 * MiB, 2 * MiB]
    assert [e[0] for e in run.events] == ["segment_alloc", "alloc", "free", "alloc"]


def test_preexisting_storages_first_zero_and_symbolic_sizes_allocate_nothing() -> None:
    run = A.replay([4096, 0, -1, 8192], [0, 0, 0, -1], [-1, -1, -1, -1], 1, storage_ids=[10, 11, 12, 13])
    assert run.block_addr[3] == B0  # existed before recording: allocated first
    assert run.block_addr[0] == B0 + 8192
    assert run.block_addr[1] == run.block_addr[2] == -1
    assert run.block_size.tolist() == [4096, 0, 0, 8192]
    assert [(e[0], e[1], e[2]) for e in run.events] == [("segment_alloc", -1, 13), ("alloc", -1, 13), ("alloc", 0, 10)]
    assert run.storage.tolist() == [10, 11, 12, 13]


def test_freed_after_the_last_op() -> None:
    run = A.replay([4096], [0], [1], 1)  # free_seq == n_ops: freed after the last op
    assert run.requested.tolist() == [4096]
    assert run.events[-1][:2] == ("free", 1)
    assert _blocks(run) == [[(0, 2 * MiB, -1)]]


def test_capacity_releases_cached_segments_then_reports_oom() -> None:
    # op 0: 12 MiB (segment 12 MiB); freed before op 1; op 1: 14 MiB does not fit the cached
    # 12 MiB block and 12 + 14 > 24 MiB: the fully free 12 MiB segment is released first.
    # op 2: another 14 MiB: nothing cached to release, 28 > 24 MiB: OOM, recorded, and the run goes on.
    run = A.replay([12 * MiB, 14 * MiB, 14 * MiB], [0, 1, 2], [1, -1, -1], 3, capacity=24 * MiB)
    assert run.reserved.tolist() == [12 * MiB, 14 * MiB, 28 * MiB]
    assert run.oom_seq == 2 and run.num_ooms == 1
    acts = [(e[0], e[1]) for e in run.events]
    assert acts == [
        ("segment_alloc", 0), ("alloc", 0), ("free", 1), ("segment_free", 1), ("segment_alloc", 1), ("alloc", 1),
        ("oom", 2), ("segment_alloc", 2), ("alloc", 2),
    ]  # fmt: skip
    oom = run.events[6]
    assert oom[3] == 24 * MiB - 14 * MiB and oom[4] == 14 * MiB  # modelled free memory, rounded request
    assert run.peak_reserved == 28 * MiB and run.peak_reserved_seq == 2
    # without capacity nothing is ever released
    free_run = A.replay([12 * MiB, 14 * MiB, 14 * MiB], [0, 1, 2], [1, -1, -1], 3)
    assert free_run.reserved.tolist() == [12 * MiB, 26 * MiB, 40 * MiB] and free_run.oom_seq == -1


def test_capacity_is_inclusive() -> None:
    # alloc_block fails only when reserved + segment > the limit: filling it exactly is fine
    run = A.replay([5 * MiB, 4096], [0, 1], [-1, -1], 2, capacity=22 * MiB)
    assert run.reserved.tolist() == [20 * MiB, 22 * MiB] and run.oom_seq == -1
    run = A.replay([5 * MiB, 4096], [0, 1], [-1, -1], 2, capacity=22 * MiB - 1)
    assert run.oom_seq == 1 and run.events[2] == ("oom", 1, 1, 2 * MiB - 1, 4096)


def test_capacity_never_releases_a_partly_used_segment() -> None:
    # a 20 MiB segment split by a live 2 MiB block stays; the fully free 2 MiB small segment goes
    sizes = [2 * MiB, 4 * KiB, 30 * MiB]
    run = A.replay(sizes, [0, 0, 2], [-1, 1, -1], 3, capacity=45 * MiB)
    assert [e[0] for e in run.events if e[0].startswith("segment")] == [
        "segment_alloc", "segment_alloc", "segment_free", "segment_alloc",
    ]  # fmt: skip
    assert run.reserved.tolist() == [22 * MiB, 22 * MiB, 50 * MiB]
    assert run.num_ooms == 1  # 20 + 30 > 45 even after the release


def test_peak_counts_a_storage_freed_in_the_op_that_made_it() -> None:
    # not produced by the recorder (free_seq <= alloc_seq), but replayed as a transient allocation
    # right after its allocation, before the op's next allocation
    run = A.replay([4 * MiB, 1024], [0, 0], [0, -1], 1)
    assert run.requested.tolist() == [1024] and run.allocated.tolist() == [1024]
    assert [e[0] for e in run.events] == ["segment_alloc", "alloc", "free", "segment_alloc", "alloc"]
    assert run.peak_allocated == run.peak_requested == 4 * MiB
    assert run.peak_allocated_seq == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        A.replay([1, 2], [0], [-1, -1], 1)
    with pytest.raises(ValueError, match="capacity"):
        A.replay([1], [0], [-1], 1, capacity=-1)


# ----------------------------------------------- literal port, random sequences
class _Block:
    __slots__ = ("addr", "allocated", "next", "pool", "prev", "size")

    def __init__(self, addr: int, size: int, pool: list[_Block]) -> None:
        self.addr, self.size, self.pool = addr, size, pool
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Reference:
    """``DeviceCachingAllocator`` transcribed literally (one stream, default config), for cross-checks."""

    def __init__(self, capacity: int | None) -> None:
        self.small: list[_Block] = []
        self.large: list[_Block] = []
        self.capacity = capacity
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.next_base = A.BASE_ADDRESS
        self.segments: dict[int, int] = {}
        self.log: list[tuple[str, int, int]] = []
        self.ooms = 0

    def malloc(self, orig: int) -> _Block:
        size = A.round_size(orig)
        pool = self.small if size <= A.K_SMALL_SIZE else self.large
        fits = [b for b in pool if b.size >= size]
        if fits:  # get_free_block: lower_bound in (size, ptr) order
            block = min(fits, key=lambda b: (b.size, b.addr))
            pool.remove(block)
        else:
            alloc = A.allocation_size(size)
            if self.capacity is not None and self.reserved + alloc > self.capacity:
                self.release_cached_blocks()
                if self.reserved + alloc > self.capacity:
                    self.ooms += 1
            block = _Block(self.next_base, alloc, pool)
            self.next_base = _next_base(self.next_base, alloc)
            self.segments[block.addr] = alloc
            self.reserved += alloc
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            self.log.append(("segment_alloc", block.addr, alloc))
        remaining = block.size - size
        split = remaining >= A.K_MIN_BLOCK_SIZE if pool is self.small else remaining > A.K_SMALL_SIZE
        if split:  # alloc_found_block: the new block takes the lower address
            rest = block
            block = _Block(rest.addr, size, pool)
            block.prev, block.next = rest.prev, rest
            if block.prev:
                block.prev.next = block
            rest.prev = block
            rest.addr += size
            rest.size -= size
            pool.append(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: _Block) -> None:
        block.allocated = False
        self.allocated -= block.size
        for other in (block.prev, block.next):  # free_block -> try_merge_blocks
            if other is None or other.allocated:
                continue
            if block.prev is other:
                block.addr = other.addr
                block.prev = other.prev
                if block.prev:
                    block.prev.next = block
            else:
                block.next = other.next
                if block.next:
                    block.next.prev = block
            block.size += other.size
            block.pool.remove(other)
        block.pool.append(block)

    def release_cached_blocks(self) -> None:
        for pool in (self.large, self.small):
            for b in sorted(pool, key=lambda b: (b.size, b.addr)):
                if b.prev is None and b.next is None:
                    pool.remove(b)
                    del self.segments[b.addr]
                    self.reserved -= b.size
                    self.log.append(("segment_free", b.addr, b.size))


def _random_case(rng: np.random.Generator, n: int, n_ops: int) -> tuple[np.ndarray, ...]:
    kinds = rng.integers(0, 5, n)
    sizes = np.select(
        [kinds == 0, kinds == 1, kinds == 2, kinds == 3],
        [rng.integers(1, 4 * KiB, n), rng.integers(1, 1 * MiB + 1, n), rng.integers(1 * MiB, 12 * MiB, n),
         rng.integers(10 * MiB, 40 * MiB, n)],
        default=rng.choice([0, 512, 4096, 1 * MiB, 5 * MiB, 20 * MiB], n),  # repeats: ties and exact fits
    )  # fmt: skip
    alloc = np.sort(rng.integers(-1, n_ops, n))
    free = alloc + rng.integers(1, max(2, n_ops // 3), n)
    free[rng.random(n) < 0.2] = -1
    free[free > n_ops] = -1
    return sizes.astype(np.int64), alloc, free


@pytest.mark.parametrize("capacity", [None, 96 * MiB], ids=["unlimited", "96MiB"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_a_literal_port_of_the_allocator(seed: int, capacity: int | None) -> None:
    rng = np.random.default_rng(seed)
    n_ops = 120
    nbytes, alloc, free = _random_case(rng, 300, n_ops)
    run = A.replay(nbytes, alloc, free, n_ops, capacity=capacity)

    ref = _Reference(capacity)
    blocks: dict[int, _Block] = {}
    events = [(max(a, -1) * 2 + 1 if a >= 0 else -1, 0, i) for i, a in enumerate(alloc.tolist()) if nbytes[i] > 0]
    events += [(2 * f, 1, i) for i, f in enumerate(free.tolist()) if f >= 0 and nbytes[i] > 0]
    allocated_after: dict[int, int] = {}
    for t, is_free, i in sorted(events):
        if is_free:
            ref.free(blocks.pop(i))
        else:
            blocks[i] = ref.malloc(int(nbytes[i]))
            assert run.block_addr[i] == blocks[i].addr, f"storage {i}"
            assert run.block_size[i] == blocks[i].size, f"storage {i}"
        allocated_after[t] = ref.allocated
    assert run.peak_allocated == ref.peak_allocated
    assert run.peak_reserved == ref.peak_reserved
    assert run.num_ooms == ref.ooms
    assert [(e[0], e[3], e[4]) for e in run.events if e[0].startswith("segment")] == ref.log
    assert sorted(s.address for s in run.segments) == sorted(ref.segments)
    for k in range(n_ops):  # curve = state after op k's frees and allocations
        last = max((t for t in allocated_after if t <= 2 * k + 1), default=None)
        assert run.allocated[k] == (allocated_after[last] if last is not None else 0)


def test_invariants_on_random_sequences() -> None:
    rng = np.random.default_rng(42)
    nbytes, alloc, free = _random_case(rng, 2000, 800)
    run = A.replay(nbytes, alloc, free, 800)
    assert (run.reserved >= run.allocated).all() and (run.allocated >= run.requested).all()
    assert (run.block_size % A.K_MIN_BLOCK_SIZE == 0).all()
    assert (run.block_size[nbytes > 0] >= nbytes[nbytes > 0]).all()
    assert run.peak_allocated >= run.allocated.max() and run.peak_reserved == run.reserved.max()
    for seg in run.segments:  # blocks tile each segment exactly
        assert seg.blocks[0][0] == seg.address
        assert sum(b[1] for b in seg.blocks) == seg.size
        assert all(a + s == b[0] for (a, s, _), b in zip(seg.blocks, seg.blocks[1:]))
        assert all(not (x[2] < 0 and y[2] < 0) for x, y in zip(seg.blocks, seg.blocks[1:]))  # merged


def test_simulates_100k_storages_quickly() -> None:
    rng = np.random.default_rng(0)
    n, n_ops = 100_000, 75_000
    alloc = np.sort(rng.integers(0, n_ops, n))
    free = alloc + rng.geometric(0.01, n)
    free[free >= n_ops] = -1
    nbytes = np.where(rng.random(n) < 0.7, rng.integers(1, 1 * MiB, n), rng.integers(1 * MiB, 64 * MiB, n))
    t = time.perf_counter()
    run = A.replay(nbytes, alloc, free, n_ops)
    elapsed = time.perf_counter() - t
    assert len(run.allocated) == n_ops
    assert elapsed < 3.0, f"{elapsed:.2f} s"  # ~0.3 s on a laptop core; generous for loaded CI machines


# ------------------------------------------------------------- recorded traces
def _record_mlp() -> fv.Trace:
    with fv.record(device="cuda:0") as tr:
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
        m(torch.randn(4, 64)).sum().backward()
    return tr


@pytest.mark.parametrize("name", ["mlp", "gpt2_tied", "views_inplace", "checkpointed"])
def test_requested_equals_live_bytes_on_recorded_traces(name: str) -> None:
    with fv.record(device="cuda:0") as tr:
        zoo.run(name)
    lb = tr.live_bytes()["cuda:0"]
    run = A.replay_trace(tr, "cuda:0")
    np.testing.assert_array_equal(run.requested, lb)
    assert run.peak_requested == lb.max()
    assert (run.allocated >= run.requested).all() and (run.reserved >= run.allocated).all()
    st = tr.storages
    on_dev = st[(st["device"].astype(object) == "cuda:0") & (st["nbytes"] > 0)]
    assert run.storage.tolist() == st[st["device"].astype(object) == "cuda:0"]["storage"].tolist()
    assert int((run.block_addr >= 0).sum()) == len(on_dev)


def test_replay_trace_selects_one_device() -> None:
    with fv.record(device="cuda:0") as tr:
        a = torch.randn(256, 256)
        b = a.to("cuda:1") * 2
        torch.zeros(0)
        del b
    lb = tr.live_bytes()
    for dev in ("cuda:0", "cuda:1"):
        np.testing.assert_array_equal(A.replay_trace(tr, dev).requested, lb[dev])
    empty = A.replay_trace(tr, "cuda:7")
    assert len(empty.storage) == 0 and empty.reserved.tolist() == [0] * tr.num_ops
    assert A.replay_trace(tr, "cuda:0", capacity="1MB").oom_seq == 0  # a 2 MiB small segment at op 0


def test_recorded_wide_model_uses_the_large_pool() -> None:
    # fake tensors: 64 MiB weights, 16 MiB activations, AdamW state; nothing is really allocated
    with fv.record(device="cuda:0") as tr:
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096))
        model(torch.randn(1024, 4096)).square().mean().backward()
        opt = torch.optim.AdamW(model.parameters())
        opt.step()
    run = A.replay_trace(tr, "cuda:0")
    np.testing.assert_array_equal(run.requested, tr.live_bytes()["cuda:0"])
    large = [s for s in run.segments if not s.is_small]
    assert len(large) >= 8 and all(s.size % A.K_ROUND_LARGE == 0 for s in large)
    assert run.peak_reserved >= run.peak_allocated >= run.peak_requested > 6 * 64 * MiB
    snap = export_memory_snapshot(tr)
    _replay(snap, 0)
    from torch.cuda import _memory_viz

    assert f"segments: {len(run.segments)}" in _memory_viz.segsum(snap)


# ---------------------------------------------------------------- snapshot
def _replay(snapshot: dict[str, Any], device: int) -> None:
    """Replay a device trace forward from an empty allocator and check it ends in ``segments``.

    PyTorch's viewer (MemoryViz.js) walks the trace backwards from the final
    segments, so every alloc must lie in a live segment, every free must match
    a live allocation, segments are only freed when empty, and the end state must
    be exactly the blocks listed as ``active_allocated``.
    """
    segs: dict[int, int] = {}
    live: dict[int, int] = {}
    pending: set[int] = set()
    for e in snapshot["device_traces"][device]:
        act = e["action"]
        assert {"action", "size", "stream", "time_us", "frames"} <= set(e)
        if act == "segment_alloc":
            assert e["addr"] not in segs
            segs[e["addr"]] = e["size"]
        elif act == "segment_free":
            assert segs.pop(e["addr"]) == e["size"]
            assert not any(e["addr"] <= a < e["addr"] + e["size"] for a in live)
        elif act == "alloc":
            assert e["addr"] not in live
            assert any(s <= e["addr"] and e["addr"] + e["size"] <= s + n for s, n in segs.items())
            live[e["addr"]] = e["size"]
        elif act == "free_requested":
            assert live[e["addr"]] == e["size"]
            pending.add(e["addr"])
        elif act == "free_completed":
            pending.remove(e["addr"])
            assert live.pop(e["addr"]) == e["size"]
        else:
            assert act == "oom" and "device_free" in e
    assert not pending
    final = [s for s in snapshot["segments"] if s["device"] == device]
    assert {s["address"]: s["total_size"] for s in final} == segs
    active = {b["address"]: b["requested_size"] for s in final for b in s["blocks"] if b["state"] == "active_allocated"}
    assert active == live
    for s in final:
        addr = s["address"]
        for b in s["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
        assert addr == s["address"] + s["total_size"]
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")


def _viz_html_pickle(html: str) -> bytes:
    """The pickle embedded in the HTML ``_memory_viz`` writes (base64, zero-padded)."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    return base64.b64decode(files[0]["base64"]).rstrip(b"\x00")


def _decode_viz_html(html: str) -> dict[str, Any]:
    """The snapshot embedded in the HTML ``_memory_viz`` writes."""
    return pickle.load(io.BytesIO(_viz_html_pickle(html)))


# Opcodes the unpickler of PyTorch's web viewer (torch/utils/viz/MemoryViz.js) implements;
# it rejects protocols other than 2..4 and throws on any other opcode.
_VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}  # fmt: skip


def _assert_viewer_can_unpickle(raw: bytes) -> None:
    ops = list(pickletools.genops(raw))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= _VIEWER_OPCODES


def test_snapshot_structure_and_consistency(tmp_path: Path) -> None:
    tr = _record_mlp()
    path = tmp_path / "snap.pickle"
    snap = export_memory_snapshot(tr, path)
    raw = path.read_bytes()
    assert pickle.loads(raw) == snap
    _assert_viewer_can_unpickle(raw)
    assert len(snap["device_traces"]) == 1
    _replay(snap, 0)
    run = A.replay_trace(tr, "cuda:0")
    assert sum(s["total_size"] for s in snap["segments"]) == run.reserved[-1]
    # the segments are the state at the end, after the frees that follow the last op
    st = tr.storages.set_index("storage")
    alive = st.loc[run.storage, "free_seq"].to_numpy() < 0
    assert sum(s["allocated_size"] for s in snap["segments"]) == run.block_size[alive].sum()
    assert sum(s["requested_size"] for s in snap["segments"]) == tr.storages["nbytes"][alive].sum()
    assert snap["fakeviz"]["devices"]["cuda:0"]["peak_allocated"] == run.peak_allocated
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert len(allocs) == int((run.block_addr >= 0).sum())
    # frames: innermost the aten op, then the module and phase, then this file's line
    ops = tr.ops
    for e in allocs:
        f = e["frames"]
        assert f[0]["filename"] == "aten" and f[0]["name"] == str(ops["op"][f[0]["line"]])
        assert f[-1]["filename"].endswith("test_allocator.py") and f[-1]["name"] == "_record_mlp"
        assert isinstance(f[-1]["line"], int) and f[-1]["line"] > 0
    assert any(
        fr["filename"] == "module" and fr["name"] == "Sequential.0 (forward)" for e in allocs for fr in e["frames"]
    )
    assert all(type(v) is int for e in snap["device_traces"][0] for k, v in e.items() if k in ("addr", "size"))


def test_snapshot_multi_device_and_capacity() -> None:
    with fv.record(device="cuda:0") as tr:
        a = torch.randn(2048, 2048)  # 16 MiB: a segment of its own
        b = a.to("cuda:1")
        c = [torch.randn(2048, 2048, device="cuda:1") for _ in range(4)]
        del a, b, c
    snap = export_memory_snapshot(tr, capacity=64 * MiB)
    assert len(snap["device_traces"]) == 2
    _replay(snap, 0)
    _replay(snap, 1)
    assert {s["device"] for s in snap["segments"]} == {0, 1}
    devices = snap["fakeviz"]["devices"]
    assert devices["cuda:0"]["oom_seq"] == -1 and devices["cuda:0"]["peak_reserved"] == 16 * MiB
    # cuda:1 holds b and four more 16 MiB tensors: the fifth does not fit 64 MiB
    ooms = [e for e in snap["device_traces"][1] if e["action"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["size"] == 16 * MiB and ooms[0]["device_free"] == 0
    assert devices["cuda:1"]["num_ooms"] == 1 and devices["cuda:1"]["peak_reserved"] == 80 * MiB
    from torch.cuda import _memory_viz

    assert "raise OutOfMemoryError # 16.0MiB requested, 0.0B free in CUDA" in _memory_viz.trace(snap)
    assert export_memory_snapshot(tr, capacity="H100")["fakeviz"]["capacity"] > 80e9


def test_snapshot_without_cuda_raises() -> None:
    with fv.record(device="cpu") as tr:
        torch.randn(4) * 2
    with pytest.raises(ValueError, match="no cuda device"):
        export_memory_snapshot(tr)


def test_pytorch_readers_accept_the_snapshot(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    with fv.record(device="cuda:0") as tr:
        kept = zoo.run("gpt2_tied")  # model, loss and gradients stay alive at the end
    snap = export_memory_snapshot(tr)
    del kept
    _replay(snap, 0)
    run = A.replay_trace(tr, "cuda:0")

    stats = _memory_viz.segsum(snap)  # asserts its own accounting identities
    assert f"segments: {len(run.segments)}" in stats

    text = _memory_viz.trace(snap)
    assert text.startswith("Device 0 ----------------")
    assert text.count("cudaMalloc(") == sum(e[0] == "segment_alloc" for e in run.events)
    assert text.count("\ndel ") == sum(e[0] == "free" for e in run.events)

    ident = lambda lines: lines  # noqa: E731 - stand-in for flamegraph.pl, which would be downloaded
    flame = _memory_viz.segments(snap, format_flamegraph=ident)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in flame.splitlines()) == sum(s.size for s in run.segments)
    mem = _memory_viz.memory(snap, format_flamegraph=ident)  # live blocks by program location
    assert "aten:" in mem and "(backward)" in mem and "active_allocated" in mem
    assert _memory_viz.compare(snap["segments"], snap["segments"], format_flamegraph=ident) == ""

    for html in (_memory_viz.trace_plot(snap), _memory_viz.segment_plot(snap),
                 _memory_viz.trace_plot(snap, plot_segments=True)):  # fmt: skip
        assert "MemoryViz.js" in html and len(html) > 10_000
        assert _decode_viz_html(html) == snap
        _assert_viewer_can_unpickle(_viz_html_pickle(html))


@pytest.mark.parametrize("command", ["trace_plot", "segment_plot"])
def test_memory_viz_command_line(tmp_path: Path, command: str) -> None:
    tr = _record_mlp()
    path = tmp_path / "snap.pickle"
    snap = export_memory_snapshot(tr, path)
    out = tmp_path / "out.html"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", command, str(path), "-o", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert "add_local_files" in html and len(html) > 2_000
    assert _decode_viz_html(html) == snap
    stats = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert "total_reserved: 2.0MiB" in stats.stdout
