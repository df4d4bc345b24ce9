"""Planning speed (issue 17): a sweep against independent recordings, and how many recordings max_batch takes.

* ``sweep``: a 16-point sweep of Llama-3.1-8B training (batch x seq x checkpointing) with ``fv.sweep`` on one
  H200, against the same 16 points each recorded by an independent ``fv.record`` (model built inside the
  block, then the same training step). Reported: the ratio of the two wall times (goal <= 0.6) and that the
  peaks agree.
* ``max_batch``: ``fv.max_batch`` of Llama-3.1-70B over 8 x H100 at ``--seq``: the batch found, the number of
  recordings, and where batch + 1 fails.

    python benchmarks/planning.py [--part sweep|max_batch|all] [--layers N] [--seq 8192] [--out PATH]

``--layers`` shortens the models (same widths) for a quick run; the figures quoted in notes use the default
(the published depth). Results: ``benchmarks/results/planning.json``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch

import fakeviz as fv
import fakeviz.models
from fakeviz._frontends import steps

OUT = Path(__file__).resolve().parent / "results" / "planning.json"
AXES = {"batch": [1, 2, 4, 8], "seq": [1024, 2048], "checkpointing": [False, True]}


def _independent(name: str, overrides: dict[str, Any], point: dict[str, Any]) -> tuple[int, float]:
    """One point recorded from scratch as a user would without ``sweep``: build inside the recording, make the
    AdamW and its state (``steps.init_state``: what a plan's steady-state step starts with), then the training
    step; its peak and the seconds it took. The garbage collection before it (the last point's model is a
    cycle) is not timed: it took 0.25-0.6 s with both models' objects around, a third of a point."""
    gc.collect()
    t0 = time.perf_counter()
    with fv.record(device="cuda:0", gpu="H200") as trace:
        model = fv.models.build(name, **overrides)
        if point["checkpointing"]:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        opt = steps.make_optimizer("adamw", model)
        steps.init_state(opt)
        steps.run(model, batch=point["batch"], seq=point["seq"], train=True, new_tokens=0, optimizer=opt)
        del model, opt
    seconds = time.perf_counter() - t0
    assert trace.error is None, trace.error
    return int(trace.peak_bytes()["cuda:0"]["bytes"]), seconds


def bench_sweep(layers: int | None) -> dict[str, Any]:
    name = "meta-llama/Llama-3.1-8B"
    overrides = {"num_hidden_layers": layers} if layers else {}
    points = [dict(zip(AXES, v)) for v in itertools.product(*AXES.values())]
    # warm-up, untimed: the first recording of a process pays one-off costs (imports, torch's dispatch and fake
    # caches, transformers' lazy modules); whichever side ran first would carry them
    _independent(name, {"num_hidden_layers": 1}, points[0])
    warm = fv.models.config(name, num_hidden_layers=1)
    fv.sweep(warm, gpus="H200", train=True, progress=False, **{k: v[:1] for k, v in AXES.items()})
    gc.collect()
    t0 = time.perf_counter()
    df = fv.sweep(fv.models.config(name, **overrides), gpus="H200", train=True, progress=False, **AXES)
    t_sweep = time.perf_counter() - t0
    runs = [_independent(name, overrides, p) for p in points]
    peaks = [peak for peak, _ in runs]
    t_indep = sum(seconds for _, seconds in runs)
    raw = [int(p.trace.peak_bytes()["cuda:0"]["bytes"]) for p in df.attrs["plans"]]
    return {
        "points": len(points),
        "sweep_seconds_over_independent": t_sweep / t_indep,
        "goal": 0.6,
        "peaks_equal": raw == peaks,
        "peak_ratio_max": max(a / b for a, b in zip(raw, peaks)),
        "peak_ratio_min": min(a / b for a, b in zip(raw, peaks)),
        "unequal": [(p, a, b) for p, a, b in zip(points, raw, peaks) if a != b],
        "layers": layers or "published",
    }


def bench_max_batch(layers: int | None, seq: int) -> dict[str, Any]:
    name = "meta-llama/Llama-3.1-70B"
    overrides = {"num_hidden_layers": layers} if layers else {}
    model = fv.models.build(name, device="cuda:0", **overrides)
    t0 = time.perf_counter()
    r = fv.max_batch(model, gpus="8xH100", seq=seq, limit=4096)
    above = r.failing.first_oom if r.failing is not None else None
    return {
        "batch": r.value,
        "recordings": r.recordings,
        "tried": r.tried,
        "seconds_per_recording": (time.perf_counter() - t0) / max(r.recordings, 1),
        "above_fails_on": above["device"] if above else None,
        "above_fails_at": above["where"] if above else None,
        "seq": seq,
        "layers": layers or "published",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["sweep", "max_batch", "all"], default="all")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.manual_seed(0)
    out: dict[str, Any] = {"torch": torch.__version__}
    if args.part in ("sweep", "all"):
        out["sweep"] = bench_sweep(args.layers)
        print(json.dumps(out["sweep"]))
    if args.part in ("max_batch", "all"):
        out["max_batch"] = bench_max_batch(args.layers, args.seq)
        print(json.dumps(out["max_batch"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
