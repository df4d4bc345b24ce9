"""Does it fit? Per accelerator, the peak against a capacity, through the caching-allocator model.

Note: [the verdict]
One rule decides "fits" for every surface (``Trace.verdict``, ``Plan.fits``, ``Simulation.fits``, the command
line, the text summaries, the explorer, the HTML report). On a cuda device the caching-allocator model
(:mod:`fakeviz._analysis.allocator`) replays the run with the device's capacity as its limit. When a new
segment would pass the limit, it does what PyTorch's ``CUDACachingAllocator`` does before raising
``OutOfMemoryError``: it frees its cached blocks (the free whole segments it keeps for reuse) and tries again.
The device fits when every request is served. The bytes judged (``judged``) are that replay's reserved bytes
at peak: "reserved at peak" itself (Note: [reserved at peak]) when that is within the capacity, and less
when the run needs the cache freed to stay within it. Every surface prints them with :func:`judged_text`:
"cuda:0 peaks at 79.3 GiB reserved of 79.6 GiB after freeing cached blocks (81.8 GiB without a limit)". On
other accelerators (no caching allocator modelled) the bytes judged are the tensors' at peak ("of tensors").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.devices import is_host, uses_caching_allocator
from .._core.fmt import format_bytes
from .._core.gpus import Capacity
from .._core.record import Record
from .._core.schema import PHASES
from .memory import allocator_run, live_bytes, peak_bytes

__all__ = ["judged_text", "verdict"]


def verdict(trace: Record, capacity: str | int | float | Capacity | dict[str, Any]) -> dict[str, Any]:
    """Does every accelerator fit ``capacity`` (bytes, "80GB" or a GPU name, or a dict of one per device:
    ``{"cuda:0": "80GB", "cuda:1": "40GiB"}``, the devices it leaves out taking the smallest)?

    The rule is Note: [the verdict]. ``judged`` is the bytes it judged: on cuda the reserved peak of the
    caching-allocator model run with the capacity as its limit (``freed``: it had to free cached blocks to
    stay within it), and ``headroom`` is ``capacity - judged``. ``peak`` is "reserved at peak", the figure
    every chart shows (Note: [reserved at peak] in ``fakeviz._analysis.memory``: the model without a limit,
    whatever the capacity; ``judged == peak`` unless ``freed``); ``allocated`` and ``raw`` are the allocated
    and raw tensor-byte peaks. Other non-host devices are judged on raw bytes (``judged == peak == raw``).
    ``text`` per device is :func:`judged_text` with the capacity: what every view says of that device.

    When a device does not fit, ``first_oom`` says where the run would fail: the first op the
    model cannot serve (``seq``, ``op``, ``module``, ``line``, ``phase``), the bytes of tensors
    live just before it (``live``), the rounded request that failed (``request``), the free
    device memory the model had left (``free``) and ``where``, the one sentence every view shows; None when it
    fits. ``seq`` is -1 when what existed before the first op (weights built before the recording) does not
    fit by itself (Note: [out of memory before the first op]).

    A record stopped by an error (``record.error``) is incomplete: it never fits, and the text says
    where it stopped and what the recorded part peaked at.

    Returns ``{"fits": bool, "incomplete": bool, "capacity": bytes (the smallest), "devices": {dev: {"judged",
    "freed", "peak", "allocated", "raw", "headroom", "fits", "oom_seq", "first_oom", "capacity", "text"}},
    "text"}``.
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
            judged = int(run.peak_reserved)
            # release_cached_blocks ran: the limit made the model free cached segments (Note: [the verdict])
            freed = run.segments_freed > 0
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
            judged, freed = raw, False
            if not fits:
                curve = live[dev]
                oom = int(np.argmax(curve > dev_cap))
                first_oom = _at_op(trace, oom, curve, request=int(curve[oom] - (curve[oom - 1] if oom else 0)),
                                   free=int(dev_cap - (curve[oom - 1] if oom else 0)))  # fmt: skip
        if first_oom is not None:
            first_oom["where"] = _where(first_oom)
        devices[dev] = {
            "judged": judged, "freed": freed and judged < peak, "peak": peak, "allocated": allocated, "raw": raw,
            "headroom": dev_cap - judged, "fits": fits, "oom_seq": oom, "first_oom": first_oom, "capacity": dev_cap,
            "cuda": uses_caching_allocator(dev),
        }  # fmt: skip
        devices[dev]["text"] = judged_text(dev, devices[dev])
    fits = all(d["fits"] for d in devices.values())
    stopped = _stopped_at(trace)
    if not devices:
        text = "no accelerator memory was used"
    elif fits:
        worst = min(devices.values(), key=lambda v: v["headroom"])
        text = f"fits: {worst['text']}"
    else:
        over = [_over_text(v) for v in devices.values() if not v["fits"]]
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


def judged_text(dev: str, v: dict[str, Any]) -> str:
    """What a device's verdict judged, in the words every view uses (Note: [the verdict]): ``v`` is one of
    :func:`verdict`'s ``devices``. ``"cuda:0 peaks at 60.2 GiB reserved of 79.6 GiB"``, ``"cuda:0 peaks at
    79.3 GiB reserved of 79.6 GiB after freeing cached blocks (81.8 GiB without a limit)"``, ``"cuda:0 peaks at
    90.1 GiB reserved of 79.6 GiB after freeing cached blocks (95.0 GiB without a limit), over by 10.5 GiB"``;
    elsewhere ``"xpu:0 peaks at 30.0 GiB of tensors of 32.0 GiB"``."""
    what = "reserved" if v.get("cuda", True) else "of tensors"
    judged, cap, peak = _distinct(v["judged"], v["capacity"], v["peak"])
    text = f"{dev} peaks at {judged} {what} of {cap}"
    if v["freed"]:
        text += f" after freeing cached blocks ({peak} without a limit)"
    if not v["fits"]:
        over = v["judged"] - v["capacity"]
        text += f", over by {format_bytes(over)}" if over > 0 else ""
        if v.get("cuda", True) and v["allocated"] <= v["capacity"]:  # the tensors' blocks would fit: the
            # segments do not, as the cache cannot hold a large enough free block
            text += f" (by fragmentation: its tensors' blocks peak at {format_bytes(v['allocated'])})"
    return text


def _distinct(*sizes: int) -> list[str]:
    """``sizes`` as :func:`format_bytes` writes them, with more decimals where two different sizes would read
    the same ("1.0 GiB of 1.0 GiB" reads as a tie; "0.99 GiB of 1.02 GiB" does not)."""
    for digits in (1, 2, 3):
        texts = [_bytes(n, digits) for n in sizes]
        if all(texts[i] != texts[j] for i in range(len(sizes)) for j in range(i) if sizes[i] != sizes[j]):
            return texts
    return texts


def _bytes(n: int, digits: int) -> str:
    if digits == 1 or abs(n) < 1024:
        return format_bytes(n)
    text = format_bytes(n)  # its unit, with more decimals
    unit = text.split()[-1]
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB", "PiB").index(unit)
    return f"{n / scale:.{digits}f} {unit}"


def _over_text(v: dict[str, Any]) -> str:
    """``cuda:0 peaks at 90 GiB reserved of 80 GiB, over by 10 GiB; first fails at op 12 aten.mm ...``."""
    o = v.get("first_oom")
    return f"{v['text']}; {o['where']}" if o else v["text"]


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
