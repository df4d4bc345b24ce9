"""A 16-point sweep through the default process pool against the same sweep one point after another (issue 33).

The sweep: Llama-3.1-70B training on 8 x H100 with the balanced map (batch x seq x checkpointing, 16 points; each
point is two recordings, the map's first run and the step: several seconds, as for a real user). Timed in one
process, in turn: ``fv.sweep(..., executor=False)`` (one point after another, today's behaviour) and
``fv.sweep(...)`` (the default: Note: [the default executor] in :mod:`fakeviz._frontends.executors`: the first
point here, then a spawn pool of ``os.cpu_count() - 1`` workers and this process share the rest). Reported: both
wall times, their ratio (goal <= 0.6 on this machine's 2 cores), that every figure agrees, the load average (the
machine may be shared: other processes take cores from both runs), and the CPU seconds of each run (this process;
the pool's workers): on two idle cores the pool's wall time would be about the busier one's, which
``idle_two_core_ratio_estimate`` divides by the sequential run's CPU time (an estimate, labelled as such).

The pool run's breakdown (``breakdown``, from the runner's timeline: ``executors.TIMELINES``), in wall seconds
from the call's start: the first point here alone (``first_point_s``) and when the pool started while it ran
(``pool_started_at_s``); the worker's start-up (``worker_imported_after_s``: spawn and the imports of torch,
transformers and fakeviz; ``worker_first_point_at_s``), its model build (``worker_build_s``), the mean point here
and in the worker, how many points each ran, the idle tail (``tail_idle_s``: the time one side had finished its last
point while the other still ran) and the pool's shutdown.

    python benchmarks/sweep_executor.py [--repeat 2] [--layers N] [--out PATH] [--append]

Results: ``benchmarks/results/sweep_executor.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch

import fakeviz as fv
from fakeviz._frontends import executors

OUT = Path(__file__).resolve().parent / "results" / "sweep_executor.json"
MODEL = "meta-llama/Llama-3.1-70B"
AXES = {"batch": [1, 2, 4, 8], "seq": [1024, 2048], "checkpointing": [False, True]}


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process and of its finished children (the pool's workers, once shut down)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _run(model: Any, executor: Any) -> tuple[float, Any, float, float]:
    """Wall seconds, the sweep, and the CPU seconds of this process and of the workers during it."""
    c0, t0 = _cpu(), time.perf_counter()
    df = fv.sweep(model, gpus="8xH100", train=True, dtype="bf16", progress=False, rank_by=None, executor=executor,
                  **AXES)  # fmt: skip
    wall, c1 = time.perf_counter() - t0, _cpu()
    return wall, df, c1[0] - c0[0], c1[1] - c0[1]


def breakdown(tl: dict[str, Any]) -> dict[str, Any]:
    """Where the pool run's wall time went (seconds from the call's start; see the module's docstring)."""
    t0 = tl["t0"]
    here = [p for p in tl["points"] if p["where"] == "here"]
    there = sorted((p for p in tl["points"] if p["where"] == "worker" and "start" in p), key=lambda p: p["start"])
    out: dict[str, Any] = {"points_here": len(here), "points_in_workers": len(there)}
    if here:
        out["first_point_s"] = round(here[0]["end"] - here[0]["start"], 2)
        out["mean_point_here_s"] = round(sum(p["end"] - p["start"] for p in here[1:]) / max(1, len(here) - 1), 2)
    if "pool_started" in tl:
        out["pool_started_at_s"] = round(tl["pool_started"] - t0, 2)
    if there:
        out["worker_imported_after_s"] = round(there[0]["imported"] - tl.get("pool_started", t0), 2)
        out["worker_first_point_at_s"] = round(there[0]["start"] - t0, 2)
        out["worker_build_s"] = round(sum(p["build_s"] for p in there), 2)
        out["mean_point_in_worker_s"] = round(sum(p["end"] - p["start"] for p in there) / len(there), 2)
    ends = [max(p["end"] for p in side) for side in (here, there) if side]
    if len(ends) == 2:
        out["tail_idle_s"] = round(abs(ends[0] - ends[1]), 2)
    out["shutdown_s"] = round(tl.get("shutdown_s", 0.0), 2)
    return out


def _commit() -> str:
    """The commit the run measured (runs of different code are appended to one file)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None, help="shorten the model (same widths) for a quick run")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--append", action="store_true", help="add this run's repeats to those already in --out")
    args = ap.parse_args()
    model: Any = MODEL
    if args.layers:
        model = fv.models.config(MODEL, num_hidden_layers=args.layers)
    runs = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    for k in range(args.repeat):
        load = os.getloadavg()
        seq_s, seq_df, seq_cpu, _ = _run(model, False)
        executors.TIMELINES = []
        pool_s, pool_df, here_cpu, workers_cpu = _run(model, None)
        parts = breakdown(executors.TIMELINES[-1])
        executors.TIMELINES = None
        cols = [c for c in seq_df.columns if c.endswith(("peak", "weights", "gradients", "optimizer", "activations"))]
        equal = bool((seq_df[cols].to_numpy() == pool_df[cols].to_numpy()).all())
        runs.append({"commit": _commit(), "sequential_s": round(seq_s, 2), "pool_s": round(pool_s, 2), "ratio": round(pool_s / seq_s, 3),
                     "figures_equal": equal, "pool": pool_df.attrs["executor"],
                     "cpu_s": {"sequential": round(seq_cpu, 1), "pool_this_process": round(here_cpu, 1),
                               "pool_workers": round(workers_cpu, 1)},
                     # on two idle cores the pool's wall time is about its busier process's CPU time
                     "idle_two_core_ratio_estimate": round(max(here_cpu, workers_cpu) / seq_cpu, 3),
                     "breakdown": parts,
                     "load_average_before": [round(x, 2) for x in load],
                     "load_average_after": [round(x, 2) for x in os.getloadavg()]})  # fmt: skip
        print(f"run {k + 1}: sequential {seq_s:.1f} s, pool {pool_s:.1f} s, ratio {pool_s / seq_s:.3f}, "
              f"figures equal: {equal} ({pool_df.attrs['executor']})\n  breakdown: {parts}", flush=True)  # fmt: skip
    result = {"torch": torch.__version__, "model": MODEL, "layers": args.layers or "published", "gpus": "8xH100",
              "axes": AXES, "points": 16, "cpu_count": os.cpu_count(), "goal": 0.6, "runs": runs,
              "note": "the machine was shared with other processes (see the load averages): both runs lose cores "
                      "to them alike, the pool more so when it needs two cores"}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
