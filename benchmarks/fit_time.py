"""Fit the time model's achieved fractions to real GPU kernels, and say how close the model comes.

Reads what ``benchmarks/gpu_time.py`` measured on a GPU (``tests/fixtures/h100_time.json.gz``: every op of 13
real training steps with the CUDA kernels it launched) and, per kernel class of ``fakeviz._analysis.timing``,
finds the compute fraction, memory fraction and launch cost that make the model's per-op times closest to
the kernels' (least absolute error in seconds, so the ops that dominate a step dominate the fit), then the
host's per-op issuing cost from the launch-bound steps. Prints the fitted table (to paste into
``timing.ACHIEVED`` with its date and GPU) and the model's error per step and per class, with the fitted
table and with the one in the code, on the fitting steps and on the held-out ones
(``tests/fixtures/h100_time_holdout.json.gz``, never used to fit).

The model here runs on the features the fixture stores for each op (FLOPs, bytes read and written, dtype);
``tests/analysis/test_timing.py`` checks that a fake record of the same step gives the same features.

    python benchmarks/fit_time.py [--fixture F] [--holdout F] [--out benchmarks/results/time_fit.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from fakeviz._analysis import timing  # noqa: E402
from fakeviz._core.schema import FLAG_VIEW  # noqa: E402
from fakeviz._engine.flops import resolve_op  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "h100_time.json.gz"
HOLDOUT = REPO / "tests" / "fixtures" / "h100_time_holdout.json.gz"
EXTRA = REPO / "tests" / "fixtures" / "h100_time_extra.json.gz"
GPU = "H100"


def derive_kernel_tables(extra: dict[str, Any]) -> tuple[dict[int, float], dict[str, tuple[float, float]], float]:
    """MISALIGNED, ATTENTION and ATTENTION_CAUSAL_TIME from the second microbenchmark set (``--micro extra``)."""
    peak = timing.gpu_spec(GPU).peak_flops("torch.bfloat16")
    rows = [r for r in extra["micro"] if "error" not in r]
    gemms = [r for r in rows if r["kind"] == "gemm" and r["dtype"] == "torch.bfloat16" and r["flops"] >= 1e10]

    def align(r: dict[str, Any]) -> int:
        m, n, k = r["m"], r["n"], r["k"]
        return timing.gemm_alignment("mm", [([m, k], [k, 1]), ([k, n], [n, 1])], 2)

    ref = statistics.median(r["flops"] / r["s"] for r in gemms if align(r) == 16)
    misaligned: dict[int, float] = {}
    for a in (8, 4, 2):
        got = [r["flops"] / r["s"] / ref for r in gemms if align(r) == a]
        if got:
            misaligned[a] = round(statistics.median(got), 3)
    misaligned[1] = misaligned.get(2, 1.0)
    att: dict[str, tuple[float, float]] = {}
    causal_ratio = []
    # (the rows' sequence length was overwritten by their seconds, "s"; the FLOPs of the forward tell the shape)
    key = lambda r, fl: (r["backend"], r["b"], r["h"], r["d"], fl)  # noqa: E731
    fwd = {(key(r, r["flops"]), r["causal"]): r for r in rows if r["kind"] == "sdpa_fwd"}
    both = {(key(r, r["flops"] * 2 // 7), r["causal"]): r for r in rows if r["kind"] == "sdpa_fwd_bwd"}
    for backend in ("cudnn", "flash", "efficient"):
        f_frac, b_frac = [], []
        for (k, causal), r in fwd.items():
            if k[0] != backend:
                continue
            if not causal:
                f_frac.append(r["flops"] / r["s"] / peak)
                if (k, False) in both:
                    bwd_s = both[(k, False)]["s"] - r["s"]
                    b_frac.append(2.5 * r["flops"] / bwd_s / peak)
            elif (k, False) in fwd:
                causal_ratio.append(r["s"] / fwd[(k, False)]["s"])
                if (k, True) in both and (k, False) in both:
                    causal_ratio.append(both[(k, True)]["s"] / both[(k, False)]["s"])
        if f_frac:
            att[backend] = (round(statistics.median(f_frac), 3), round(statistics.median(b_frac), 3))
    return misaligned, att, round(statistics.median(causal_ratio), 3)


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def _view_flag(name: str) -> int:
    """FLAG_VIEW as the recorder sets it: the op's schema says its output aliases an input without writing it."""
    op = resolve_op(name)
    if op is None:
        return 0
    rets = op._schema.returns
    return FLAG_VIEW if rets and rets[0].alias_info is not None and not rets[0].alias_info.is_write else 0


def step_features(row: dict[str, Any]) -> tuple[timing.OpFeatures, np.ndarray]:
    """The model's features of a measured step's ops, and each op's measured kernel seconds."""
    ops = row["op_rows"]
    names = [o["op"] for o in ops]
    cls = np.array([timing.CLASSES.index(timing.op_class(n, _view_flag(n))) for n in names], np.int8)
    dtype = [
        ("torch." + (o["in"][0][1] if cls[i] in _MATRIX and o["in"] else (o["out"][0][1] if o["out"] else "float32")))
        for i, o in enumerate(ops)
    ]
    f = timing.OpFeatures(
        names=names, cls=cls, flops=np.array([o["flops"] for o in ops], np.int64),
        bytes_in=np.array([o["bytes_in"] for o in ops], np.int64),
        bytes_out=np.array([o["bytes_out"] for o in ops], np.int64), dtype=dtype,
    )  # fmt: skip
    f.align = np.array([
        timing.gemm_alignment(n, [(x[0], x[2]) for x in o["in"]], timing._ITEMSIZE.get(d, 2))
        if cls[i] == timing.CLASSES.index("gemm") else 16
        for i, (n, o, d) in enumerate(zip(names, ops, dtype))
    ])  # fmt: skip
    f.causal = np.isin(cls, [timing.CLASSES.index("attention"), timing.CLASSES.index("attention_backward")])
    # (every attention op of these steps is causal: transformers' SDPA path passes is_causal=True without a mask)
    f.waits_on = np.full(len(ops), -1, np.int64)
    f.coll_wire, f.coll_ranks, f.coll_kind = np.zeros(len(ops)), np.ones(len(ops)), [""] * len(ops)
    return f, np.array([o["device_us"] for o in ops]) * 1e-6


_MATRIX = {timing.CLASSES.index(c) for c in ("gemm", "grouped_gemm", "attention", "attention_backward", "conv")}


def predict(f: timing.OpFeatures, table: dict[str, timing.Achieved]) -> np.ndarray:
    """Each op's modelled kernel time (without the idle gap between kernels, which the measured kernels lack)."""
    return timing.estimate(f, GPU, table=table, gap_s=0.0)[0]


def step_pred(f: timing.OpFeatures, table: dict[str, timing.Achieved]) -> float:
    est = timing.estimate(f, GPU, table=table)[0]
    return timing.critical_path(f, est, timing.host_times(f, table=table), np.zeros(len(f)))[0]


COMPUTE_GRID = np.round(np.arange(0.05, 1.001, 0.025), 3)
MEMORY_GRID = np.round(np.arange(0.05, 1.001, 0.025), 3)
LAUNCH_GRID = np.round(np.arange(0.0, 12.01, 0.25), 2) * 1e-6


def fit_class(cls: str, feats: list[timing.OpFeatures], meas: list[np.ndarray]) -> timing.Achieved | None:
    """Grid search of (compute, memory, launch) for one class, least absolute error over its ops."""
    code = timing.CLASSES.index(cls)
    spec = timing.gpu_spec(GPU)
    fl, by, pk, m = [], [], [], []
    for f, t in zip(feats, meas):
        sel = f.cls == code
        if not sel.any():
            continue
        fl.append(np.maximum(f.flops[sel], 0).astype(float))
        by.append((f.bytes_in + f.bytes_out)[sel].astype(float))
        pk.append(timing._peaks(spec, [d for d, s in zip(f.dtype, sel) if s], False))
        m.append(t[sel])
    if not m:
        return None
    fl_a, by_a, pk_a, m_a = (np.concatenate(x) for x in (fl, by, pk, m))
    old = timing.ACHIEVED[cls]
    t_c = fl_a[None, :] / (pk_a[None, :] * COMPUTE_GRID[:, None])  # [C, ops]
    t_m = by_a[None, :] / (spec.hbm_bytes_per_s * MEMORY_GRID[:, None])  # [M, ops]
    best = (np.inf, None)
    for ci, comp in enumerate(COMPUTE_GRID):
        body = np.maximum(t_c[ci][None, :], t_m)  # [M, ops]
        for launch in LAUNCH_GRID:
            err = np.abs(body + launch - m_a[None, :]).sum(axis=1)
            mi = int(np.argmin(err))
            if err[mi] < best[0]:
                best = (float(err[mi]), (float(comp), float(MEMORY_GRID[mi]), float(launch)))
    comp, mem, launch = best[1]
    if not (fl_a > 0).any():
        comp = 1.0  # no FLOPs in this class: the compute fraction is never used
    return replace(old, compute=comp, memory=mem, launch_s=launch)


def fit_host(feats: list[timing.OpFeatures], steps: list[float], table: dict[str, timing.Achieved]) -> dict:
    """One issuing cost for ops that launch kernels and one for those that don't, from the launch-bound steps."""
    best = (np.inf, None)
    for h_kernel in np.arange(4e-6, 40.01e-6, 1e-6):
        for h_none in np.arange(0.0, 12.01e-6, 1e-6):
            t = {c: replace(a, host_s=(h_none if c == "none" else h_kernel)) for c, a in table.items()}
            err = sum(abs(np.log(step_pred(f, t) / s)) for f, s in zip(feats, steps))
            if err < best[0]:
                best = (err, t)
    return best[1]


def report(label: str, rows: list[dict[str, Any]], table: dict[str, timing.Achieved]) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": {}, "classes": {}}
    per_class_meas: dict[str, float] = {}
    per_class_pred: dict[str, float] = {}
    print(f"\n{label}")
    print(f"{'case':<28}{'measured ms':>12}{'model ms':>10}{'error':>8}   kernels: measured / model ms")
    for row in rows:
        f, meas = step_features(row)
        pred = predict(f, table)
        step = step_pred(f, table)
        err = step / row["median_s"] - 1
        out["steps"][row["case"]] = {"measured_s": row["median_s"], "model_s": step, "rel_error": err,
                                     "kernels_measured_s": float(meas.sum()), "kernels_model_s": float(pred.sum())}  # fmt: skip
        print(f"{row['case']:<28}{row['median_s'] * 1e3:>12.2f}{step * 1e3:>10.2f}{err:>+8.1%}   "
              f"{meas.sum() * 1e3:8.2f} / {pred.sum() * 1e3:8.2f}")  # fmt: skip
        for i, c in enumerate(timing.CLASSES):
            sel = f.cls == i
            per_class_meas[c] = per_class_meas.get(c, 0.0) + float(meas[sel].sum())
            per_class_pred[c] = per_class_pred.get(c, 0.0) + float(pred[sel].sum())
    big = [abs(v["rel_error"]) for k, v in out["steps"].items() if v["measured_s"] > 0.02]
    out["median_abs_error_large_steps"] = statistics.median(big) if big else None
    out["max_abs_error_large_steps"] = max(big) if big else None
    print("class totals over these steps (measured / model ms):",
          ", ".join(f"{c} {per_class_meas[c] * 1e3:.1f}/{per_class_pred[c] * 1e3:.1f}"
                    for c in timing.CLASSES if per_class_meas.get(c) or per_class_pred.get(c)))  # fmt: skip
    for c in timing.CLASSES:
        if per_class_meas.get(c):
            out["classes"][c] = {"measured_s": per_class_meas[c], "model_s": per_class_pred[c],
                                 "rel_error": per_class_pred[c] / per_class_meas[c] - 1}  # fmt: skip
    if big:
        print(f"steps over 20 ms: median |error| {statistics.median(big):.1%}, worst {max(big):.1%}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--holdout", type=Path, default=HOLDOUT)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "time_fit.json")
    args = parser.parse_args(argv)
    data = load(args.fixture)
    rows = [r for r in data["steps"] if "error" not in r and not r.get("holdout")]
    held = [r for r in load(args.holdout)["steps"] if "error" not in r] if args.holdout.exists() else []
    if EXTRA.exists():
        mis, att, causal = derive_kernel_tables(load(EXTRA))
        print(f"MISALIGNED = {mis}  (in the code: {timing.MISALIGNED})")
        print(f"ATTENTION = {att}  (in the code: {timing.ATTENTION})")
        print(f"ATTENTION_CAUSAL_TIME = {causal}  (in the code: {timing.ATTENTION_CAUSAL_TIME})")
    feats, meas = zip(*(step_features(r) for r in rows))
    # kernels from the GPU-bound steps (the tiny zoo steps are the host's: their kernels are a few microseconds)
    gpu_bound = [i for i, r in enumerate(rows) if r["busy_us"] * 1e-6 >= 0.5 * r["median_s"]]
    gaps = [(rows[i]["median_s"] - rows[i]["busy_us"] * 1e-6) / sum(1 for o in rows[i]["op_rows"] if o["kernels"])
            for i in gpu_bound]  # fmt: skip
    print(f"KERNEL_GAP_S = {statistics.median(gaps):.2e}  (in the code: {timing.KERNEL_GAP_S:.2e})")
    fitted = dict(timing.ACHIEVED)
    for cls in timing.CLASSES:
        if cls in ("none", "collective", "sync", "attention", "attention_backward"):
            continue
        got = fit_class(cls, [feats[i] for i in gpu_bound], [meas[i] for i in gpu_bound])
        if got is not None:
            fitted[cls] = got
    small = [(f, r["median_s"]) for f, r in zip(feats, rows) if r["busy_us"] * 1e-6 < 0.2 * r["median_s"]]
    if small:
        fitted = fit_host([f for f, _ in small], [s for _, s in small], fitted)
    print(f"fitted on {data['device']} (torch {data['torch']}, {data['date']}), {len(rows)} steps:")
    for c, a in fitted.items():
        print(f'    "{c}": Achieved(compute={a.compute:.3f}, memory={a.memory:.3f}, '
              f"launch_s={a.launch_s:.2e}, host_s={a.host_s:.2e}),")  # fmt: skip
    result = {
        "device": data["device"], "torch": data["torch"], "date": data["date"],
        "fitted": {c: vars(a) for c, a in fitted.items()},
        "in_code": {c: vars(a) for c, a in timing.ACHIEVED.items()},
        "fit_steps_fitted": report("fitting steps, fitted table", rows, fitted),
        "fit_steps_in_code": report("fitting steps, table in the code", rows, timing.ACHIEVED),
    }  # fmt: skip
    if held:
        result["holdout_in_code"] = report("held-out steps, table in the code", held, timing.ACHIEVED)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
