"""Does it fit? Per accelerator, the peak against a capacity, through the caching-allocator model."""

from __future__ import annotations

from typing import Any

from .._core.devices import is_host, uses_caching_allocator
from .._core.fmt import format_bytes
from .._core.gpus import Capacity
from .._core.record import Record
from .memory import allocator_run, peak_bytes

__all__ = ["verdict"]


def verdict(trace: Record, capacity: str | int | float | Capacity) -> dict[str, Any]:
    """Does every accelerator fit ``capacity`` (bytes, "80GB" or a GPU name)?

    On cuda devices the caching-allocator model (``fakeviz._analysis.allocator``) is run
    with that capacity: the device fits when the model never runs out of memory
    (it frees cached segments first, as PyTorch does); ``peak`` is the reserved
    peak (what the GPU must hold), ``allocated`` and ``raw`` the allocated and
    raw tensor-byte peaks. Other non-host devices are judged on raw bytes.

    A record stopped by an error (``record.error``) is incomplete: it never fits, and the text says
    where it stopped and what the recorded part peaked at.

    Returns ``{"fits": bool, "incomplete": bool, "capacity": bytes, "devices": {dev: {"peak",
    "allocated", "raw", "headroom", "fits", "oom_seq"}}, "text"}``.
    """
    cap = Capacity.parse(capacity).bytes
    devices = {}
    for dev, pk in peak_bytes(trace).items():
        if is_host(dev):
            continue
        raw = pk["bytes"]
        if uses_caching_allocator(dev):
            run = allocator_run(trace, dev, cap)
            peak, allocated, fits = int(run.peak_reserved), int(run.peak_allocated), run.oom_seq < 0
            oom = int(run.oom_seq)
            if not fits:  # how much would have been needed: the model without a limit
                peak = int(allocator_run(trace, dev).peak_reserved)
        else:
            peak, allocated, fits, oom = raw, raw, raw <= cap, -1
        devices[dev] = {
            "peak": peak, "allocated": allocated, "raw": raw, "headroom": cap - peak, "fits": fits, "oom_seq": oom,
        }  # fmt: skip
    fits = all(d["fits"] for d in devices.values())
    stopped = _stopped_at(trace)
    if not devices:
        text = "no accelerator memory was used"
    elif fits:
        worst = min(devices.items(), key=lambda kv: kv[1]["headroom"])
        text = f"fits: {worst[0]} peaks at {format_bytes(worst[1]['peak'])} of {format_bytes(cap)}"
    else:
        over = [
            f"{d} over by {format_bytes(-v['headroom'])}"
            if v["headroom"] < 0
            else f"{d} runs out at op {v['oom_seq']} (fragmentation: {format_bytes(v['peak'])} reserved at peak)"
            for d, v in devices.items()
            if not v["fits"]
        ]
        text = f"does not fit {format_bytes(cap)}: " + ", ".join(over)
    if stopped is not None:
        # Only the part before the error was recorded: what came after is unknown, so never "fits".
        if fits:
            recorded = text.removeprefix("fits: ") if devices else "no accelerator memory was used"
            text = f"incomplete: the run stopped at {stopped}; up to there {recorded}, the rest is unknown"
        else:
            text = f"{text} (and the run stopped at {stopped}: the rest is unknown)"
        fits = False
    return {"fits": fits, "incomplete": stopped is not None, "capacity": cap, "devices": devices, "text": text}


def _stopped_at(trace: Record) -> str | None:
    """Where an incomplete record stopped ("op 12 aten.nonzero.default (DataDependentError)"), None if complete."""
    err = trace.error
    if not err:
        return None
    what = f"op {err['seq']} {err['op']}" if err.get("op") and err.get("seq") is not None else "an error"
    return f"{what} ({err.get('type') or 'error'})"
