"""Record overhead on a Llama-3-70B-shaped fwd+bwd (bf16, batch 1, seq 2048, fake cuda:0).

Reports, all measured in the same process and interleaved run by run (bare, record, record, bare, ...
so a slow drift of the machine's speed hits both alike):
  * ratio = median time under fv.record / median time under a bare FakeTensorMode (fv.fake_mode), both
    running the same attention kernels (record()'s default attention="auto", fakeviz._engine.attention)
    (target <= 1.10); also the median of the per-pair ratios and the ratio of the fastest runs,
  * recorded ops per second,
  * ratio of the same work under torch.distributed._tools.mem_tracker.MemTracker to fv.record,
  * the record ratio for the Python recorder too (FAKEVIZ_PURE_PYTHON=1, as without a C compiler),
and, each in a fresh subprocess, peak RSS of one recorded run for the 70B and 405B shapes
(target < 1 GiB).

    python benchmarks/record_overhead.py [--runs 11] [--layers N] [--skip-rss] [--skip-python-core] [--no-pin]
        [--out record_overhead.json]

On another torch, from its environment (scripts/test_torch.sh makes .venv-torch-newest):
    .venv-torch-newest/bin/python benchmarks/record_overhead.py --out record_overhead_newest_torch.json

By default the process is pinned to one CPU (os.sched_setaffinity; threads it starts, such as
autograd's device threads, inherit it): on the 2-core CI machine the spread of the ratio between
runs shrank from about +-15 % to +-3 % (8 layers, 25 pairs), because the main thread and
autograd's worker no longer migrate between cores.

Results are printed and written to benchmarks/results/record_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _work(cfg, seq: int):
    import torch

    from fakeviz import models

    model = models.build(cfg, dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    model(ids, labels=ids).loss.backward()
    return model


def run_bare(cfg, seq: int) -> float:
    import fakeviz as fv
    from fakeviz._engine.attention import attention_patch

    t = time.perf_counter()
    # the same attention kernels as record()'s default (attention="auto"), so both runs do the same ops
    with fv.fake_mode(device="cuda:0"), attention_patch("auto"):
        _work(cfg, seq)
    return time.perf_counter() - t


def run_record(cfg, seq: int, *, python_core: bool = False) -> tuple[float, int]:
    """One recorded run; ``python_core`` records with the Python implementation instead of the
    C core (Note: [recorder core in C]), as on a machine without a C compiler."""
    import fakeviz as fv

    old = os.environ.pop("FAKEVIZ_PURE_PYTHON", None)
    if python_core:
        os.environ["FAKEVIZ_PURE_PYTHON"] = "1"
    try:
        t = time.perf_counter()
        with fv.record(device="cuda:0") as trace:
            _work(cfg, seq)
        dt = time.perf_counter() - t
    finally:
        os.environ.pop("FAKEVIZ_PURE_PYTHON", None)
        if old is not None:
            os.environ["FAKEVIZ_PURE_PYTHON"] = old
    global _LAST_TRACE_NBYTES, _LAST_CORE
    _LAST_TRACE_NBYTES = trace.nbytes()
    _LAST_CORE[python_core] = trace.meta.get("recorder_core", "?")
    return dt, trace.num_ops


_LAST_TRACE_NBYTES = 0
_LAST_CORE: dict[bool, str] = {}


def run_memtracker(cfg, seq: int) -> tuple[float, dict]:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    import fakeviz as fv
    from fakeviz import models
    from fakeviz._engine.attention import attention_patch

    t = time.perf_counter()
    with fv.fake_mode(device="cuda:0"), attention_patch("auto"):
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        mt = MemTracker()
        mt.track_external(model)
        with mt:
            model(ids, labels=ids).loss.backward()
        peak = {
            str(k): int(v.get("Total", 0) if isinstance(v, dict) else v)
            for k, v in mt.get_tracker_snapshot("peak").items()
        }
    return time.perf_counter() - t, peak


RSS_CHILD = """
import json, resource, sys, time, torch
import fakeviz as fv
from fakeviz import models
name, seq = sys.argv[1], int(sys.argv[2])
cfg = models.config(name)
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
with fv.record(device="cuda:0") as trace:
    model = models.build(cfg, dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    model(ids, labels=ids).loss.backward()
dt = time.perf_counter() - t
print(json.dumps({"model": name, "ops": trace.num_ops, "seconds": dt,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_rss_before_record_bytes": rss_before, "trace_bytes": trace.nbytes(),
                  "device_peak_bytes": trace.peak_bytes()["cuda:0"]["bytes"]}))
"""


def rss(name: str, seq: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, name, str(seq)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"model": name, "error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--skip-python-core", action="store_true", help="do not also time the Python recorder")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    ap.add_argument("--layers", type=int, default=0, help="override layers (0 = the full 80)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--skip-memtracker", action="store_true")
    ap.add_argument("--memtracker-runs", type=int, default=1, help="MemTracker is ~30x slower: fewer runs")
    ap.add_argument(
        "--out",
        default="record_overhead.json",
        help="file name under benchmarks/results (record_overhead_newest_torch.json for another torch)",
    )
    args = ap.parse_args()
    pinned = None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        pinned = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {pinned})
    sys.path.insert(0, str(REPO))
    from fakeviz import models

    cfg = models.config("llama3-70b", **({"num_hidden_layers": args.layers} if args.layers else {}))
    # warm-up (shim build, imports, caches)
    run_bare(cfg, args.seq)
    run_record(cfg, args.seq)
    if not args.skip_python_core:
        run_record(cfg, args.seq, python_core=True)
    bare: list[float] = []
    rec: list[float] = []
    rec_py: list[float] = []
    mt: list[float] = []
    ops: list[int] = []
    mt_peak: dict = {}

    def recorded(into: list[float], python_core: bool) -> None:
        t, n = run_record(cfg, args.seq, python_core=python_core)
        into.append(t)
        ops.append(n)

    steps = [lambda: bare.append(run_bare(cfg, args.seq)), lambda: recorded(rec, False)]
    if not args.skip_python_core:
        steps.append(lambda: recorded(rec_py, True))
    for i in range(args.runs):
        for step in steps if i % 2 == 0 else steps[::-1]:  # ABBA order
            step()
        if not args.skip_memtracker and len(mt) < args.memtracker_runs:
            try:
                t_mt, mt_peak = run_memtracker(cfg, args.seq)
                mt.append(t_mt)
            except Exception as exc:  # noqa: BLE001 - report, do not hide
                mt_peak = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    import torch

    import fakeviz as fv

    shim = fv.fake_cuda_status()
    res = {
        "torch": torch.__version__,
        "fake_cuda": f"{shim.mode} ({shim.build} build, {shim.real_gpus} GPUs)",
        "model": f"llama3-70b shape, {cfg.num_hidden_layers} layers, bf16, batch 1, seq {args.seq}, fwd+bwd, fake cuda:0",
        "runs": args.runs,
        "bare_fake_s": bare,
        "record_s": rec,
        "pinned_cpu": pinned,
        "ratio_record_over_bare": statistics.median(rec) / statistics.median(bare),
        "ratio_paired_median": statistics.median(r / b for r, b in zip(rec, bare)),
        "ratio_fastest": min(rec) / min(bare),
        "recorder_core": _LAST_CORE.get(False),
        "ops": ops[-1],
        "ops_per_s_recorded": ops[-1] / statistics.median(rec),
        "trace_bytes": _LAST_TRACE_NBYTES,
        "trace_bytes_per_op": _LAST_TRACE_NBYTES / max(ops[-1], 1),
    }
    assert len(set(ops)) == 1, f"runs recorded different op counts: {sorted(set(ops))}"
    if rec_py:
        res["python_core_record_s"] = rec_py
        res["python_core_ratio_record_over_bare"] = statistics.median(rec_py) / statistics.median(bare)
        res["python_core_ratio_paired_median"] = statistics.median(r / b for r, b in zip(rec_py, bare))
    if mt:
        res["memtracker_s"] = mt
        res["ratio_memtracker_over_record"] = statistics.median(mt) / statistics.median(rec)
        res["memtracker_peak"] = mt_peak
    elif mt_peak:
        res["memtracker_error"] = mt_peak
    if not args.skip_rss:
        res["rss"] = [rss("llama3-70b", args.seq), rss("llama3-405b", args.seq)]
    print(json.dumps(res, indent=2))
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
