"""Does it fit? Per accelerator, the peak against a capacity, through the caching-allocator model."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.devices import is_host, uses_caching_allocator
from .._core.fmt import format_bytes
from .._core.gpus import Capacity
from .._core.record import Record
from .._core.schema import PHASES
from .memory import allocator_run, live_bytes, peak_bytes

__all__ = ["verdict"]


def verdict(trace: Record, capacity: str | int | float | Capacity | dict[str, Any]) -> dict[str, Any]:
    """Does every accelerator fit ``capacity`` (bytes, "80GB" or a GPU name, or a dict of one per device:
    ``{"cuda:0": "80GB", "cuda:1": "40GiB"}``, the devices it leaves out taking the smallest)?

    On cuda devices the caching-allocator model (``fakeviz._analysis.allocator``) is run
    with that capacity: the device fits when the model never runs out of memory
    (it frees cached segments first, as PyTorch does). ``peak`` is "reserved at peak", the one
    figure every view shows (Note: [reserved at peak] in ``fakeviz._analysis.memory``: the model
    without a limit, whatever the capacity); ``allocated`` and ``raw`` are the allocated and raw
    tensor-byte peaks. Other non-host devices are judged on raw bytes (``peak == raw``).

    When a device does not fit, ``first_oom`` says where the run would fail: the first op the
    model cannot serve (``seq``, ``op``, ``module``, ``line``, ``phase``), the bytes of tensors
    live just before it (``live``), the rounded request that failed (``request``), the free
    device memory the model had left (``free``) and ``where``, the one sentence every view shows; None when it
    fits. ``seq`` is -1 when what existed before the first op (weights built before the recording) does not
    fit by itself (Note: [out of memory before the first op]).

    A record stopped by an error (``record.error``) is incomplete: it never fits, and the text says
    where it stopped and what the recorded part peaked at.

    Returns ``{"fits": bool, "incomplete": bool, "capacity": bytes (the smallest), "devices": {dev: {"peak",
    "allocated", "raw", "headroom", "fits", "oom_seq", "first_oom", "capacity"}}, "text"}``.
    """
    if isinstance(capacity, dict):
        per_device = {str(d): Capacity.parse(c).bytes for d, c in capacity.items()}
        if not per_device:
            raise ValueError("capacity: an empty dict names no device")
        cap = min(per_device.values())
    else:
        per_device, cap = {}, Capacity.parse(capacity).bytes
    devices = {}
    live = live_bytes(trace)
    for dev, pk in peak_bytes(trace).items():
        if is_host(dev):
            continue
        raw = pk["bytes"]
        first_oom = None
        dev_cap = per_device.get(dev, cap)
        if uses_caching_allocator(dev):
            whole = allocator_run(trace, dev)  # Note: [reserved at peak]
            peak, allocated = int(whole.peak_reserved), int(whole.peak_allocated)
            run = allocator_run(trace, dev, dev_cap)
            # Note: [out of memory before the first op]: storages that existed before the recording started
            # (weights built outside it, storages carried in from an earlier cell) are placed before op 0; the
            # model reports running out there as seq -1, so `fits` is decided on the count, not the seq
            fits, oom = run.num_ooms == 0, int(run.oom_seq)
            if not fits:
                ev = next(e for e in run.events if e[0] == "oom")  # (oom, seq, storage, free, request)
                first_oom = (
                    _at_op(trace, oom, live[dev], request=int(ev[4]), free=int(ev[3]))
                    if oom >= 0
                    else _before_first_op(trace, dev, request=int(ev[4]), free=int(ev[3]))
                )
        else:
            peak, allocated, fits, oom = raw, raw, raw <= dev_cap, -1
            if not fits:
                curve = live[dev]
                oom = int(np.argmax(curve > dev_cap))
                first_oom = _at_op(trace, oom, curve, request=int(curve[oom] - (curve[oom - 1] if oom else 0)),
                                   free=int(dev_cap - (curve[oom - 1] if oom else 0)))  # fmt: skip
        if first_oom is not None:
            first_oom["where"] = _where(first_oom)
        devices[dev] = {
            "peak": peak, "allocated": allocated, "raw": raw, "headroom": dev_cap - peak, "fits": fits, "oom_seq": oom,
            "first_oom": first_oom, "capacity": dev_cap,
        }  # fmt: skip
    fits = all(d["fits"] for d in devices.values())
    stopped = _stopped_at(trace)
    if not devices:
        text = "no accelerator memory was used"
    elif fits:
        worst = min(devices.items(), key=lambda kv: kv[1]["headroom"])
        text = f"fits: {worst[0]} peaks at {format_bytes(worst[1]['peak'])} of {format_bytes(worst[1]['capacity'])}"
        if worst[1]["headroom"] < 0:  # over the capacity without a limit: fits by emptying the cache
            text += " reserved, by freeing cached blocks as it goes"
    else:
        over = [_over_text(d, v) for d, v in devices.items() if not v["fits"]]
        sizes = sorted({v["capacity"] for v in devices.values()})
        of = " / ".join(format_bytes(c) for c in sizes)
        text = f"does not fit {of}: " + "; ".join(over)
    if stopped is not None:
        # Only the part before the error was recorded: what came after is unknown, so never "fits".
        if fits:
            recorded = text.removeprefix("fits: ") if devices else "no accelerator memory was used"
            text = f"incomplete: the run stopped at {stopped}; up to there {recorded}, the rest is unknown"
        else:
            text = f"{text} (and the run stopped at {stopped}: the rest is unknown)"
        fits = False
    return {"fits": fits, "incomplete": stopped is not None, "capacity": cap, "devices": devices, "text": text}


def _at_op(trace: Record, seq: int, curve: np.ndarray, *, request: int, free: int) -> dict[str, Any]:
    """Op ``seq``: its op, module, user line and phase, the bytes live just before it, the failed request."""
    strings = trace.strings
    m, ln = int(trace.col("module")[seq]), int(trace.col("line")[seq])
    return {
        "seq": seq,
        "op": strings("ops")[int(trace.col("op")[seq])],
        "module": strings("modules")[m] if m >= 0 else None,
        "line": strings("lines")[ln] if ln >= 0 else None,
        "phase": PHASES[int(trace.col("phase")[seq])],
        "live": int(curve[seq - 1]) if seq > 0 else 0,
        "request": request,
        "free": max(free, 0),
    }


def _before_first_op(trace: Record, dev: str, *, request: int, free: int) -> dict[str, Any]:
    """The first failure is before op 0: what existed before the recording (weights) does not fit by itself."""
    devs, alloc = trace.col("st_device"), trace.col("st_alloc")
    names = trace.strings("devices")
    before = [i for i in range(len(alloc)) if int(alloc[i]) < 0 and names[int(devs[i])] == dev]
    return {
        "seq": -1, "op": None, "module": None, "line": None, "phase": None,
        "live": int(sum(int(trace.col("st_nbytes")[i]) for i in before)), "request": request, "free": max(free, 0),
    }  # fmt: skip


def _over_text(dev: str, v: dict[str, Any]) -> str:
    """``cuda:0 needs 90 GiB reserved at peak (over by 10 GiB); first fails at op 12 aten.mm ...``."""
    if v["headroom"] < 0:
        head = f"{dev} needs {format_bytes(v['peak'])} reserved at peak (over by {format_bytes(-v['headroom'])})"
    else:  # the peak fits, the segments do not: the cache cannot hold a large enough free block
        head = f"{dev} runs out by fragmentation ({format_bytes(v['peak'])} reserved at peak)"
    o = v.get("first_oom")
    if not o:
        return head
    return f"{head}; {o['where']}"


def _where(o: dict[str, Any]) -> str:
    """The one text of where a device first runs out (``first_oom["where"]``), shown by every view."""
    if o["seq"] < 0:
        return (f"fails before the first op: what existed before the recording ({format_bytes(o['live'])}, "
                "the weights) does not fit by itself")  # fmt: skip
    where = f"op {o['seq']:,} {o['op']} in {o['module'] or '<top level>'}"
    if o["line"]:
        where += f" at {o['line']}"
    return f"first fails at {where}, with {format_bytes(o['live'])} live"


def _stopped_at(trace: Record) -> str | None:
    """Where an incomplete record stopped ("op 12 aten.nonzero.default (DataDependentError)"), None if complete."""
    err = trace.error
    if not err:
        return None
    what = f"op {err['seq']} {err['op']}" if err.get("op") and err.get("seq") is not None else "an error"
    return f"{what} ({err.get('type') or 'error'})"
