"""Twenty-two transformers architectures, tiny and full size: is a fake record a real one, and at what cost?

For every architecture of ``tests/arch_zoo.py`` (each in its own subprocess, so a crash or a memory-hungry
tracker in one never touches the others):

* tiny config, one training step recorded on real CPU tensors and on fake ones (eager attention, and SDPA
  where the model has it): op log equal (else the first differing op), peak equal, per-category live bytes
  equal;
* the published full-size config, fwd+bwd in bfloat16 on fake ``cuda:0``: wall time of ``fv.record``
  against the same work under a bare ``fv.fake_mode`` (same attention kernels, as
  ``benchmarks/record_overhead.py`` does), runs interleaved bare/record/record/bare and the median taken;
  parameters, ops, peak per device, FLOPs per phase, and fidelity notes (ops without a meta kernel,
  fallback kernels run, data-dependent ops, ops without a FLOP formula, attention kernels chosen, any
  stated assumption the fidelity report lists);
* torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``) on the same fwd+bwd under a bare
  fake mode: its time over ours and its peak over ours.

Ratios, not seconds, are the comparable figures (machines differ). A failure in one architecture is
caught and shown in its row with a short reason.

    python benchmarks/real_models.py [--archs llama,gpt2] [--skip-memtracker] [--skip-tiny]
                                     [--runs 2] [--timeout 900] [--no-pin] [--out PATH]

Results are printed as a markdown table and written to ``benchmarks/results/real_models.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE / "results" / "real_models.json"
_GiB = 2**30


def _short(exc: BaseException, limit: int = 200) -> str:
    """One line: the exception type and the first line of its message, library paths shortened."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".replace(str(REPO) + os.sep, "")
    text = re.sub(r"/\S*/site-packages/", "", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------- tiny
def _tiny_record(name: str, attn: str, fake: bool) -> dict[str, Any]:
    import arch_zoo

    import fakeviz as fv

    gc.collect()
    gc.disable()  # storage free times must not depend on when the cyclic collector runs
    try:
        with fv.record(fake=fake) as trace:
            arch_zoo.run(name, "tiny", attn=attn)
    finally:
        gc.enable()
    if trace.error is not None:
        raise RuntimeError(trace.error.get("message", "error"))
    return {
        "oplog": trace.oplog_lines(),
        "peak": {d: int(v["bytes"]) for d, v in trace.peak_bytes().items()},
        "memory": trace.memory(allocator=False),
    }


def tiny(name: str, attn: str) -> dict[str, Any]:
    """Real CPU vs fake CPU on the tiny config of ``name``."""
    import fakeviz as fv

    try:
        real = _tiny_record(name, attn, fake=False)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": "real run: " + _short(exc)}
    try:
        fake = _tiny_record(name, attn, fake=True)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"ops_real": len(real["oplog"]), "error": _short(exc)}
    a, b = real["oplog"], fake["oplog"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    mr, mf = real["memory"], fake["memory"]
    memory_equal = len(mr) == len(mf) and all(mr[c].tolist() == mf[c].tolist() for c in fv.CATEGORIES)
    out: dict[str, Any] = {
        "ops_real": len(a),
        "ops_fake": len(b),
        "oplog_equal": first is None,
        "peak_real": real["peak"],
        "peak_fake": fake["peak"],
        "peak_equal": real["peak"] == fake["peak"],
        "memory_by_category_equal": memory_equal,
    }
    if first is not None:
        out["first_diff"] = {
            "op": first,
            "real": a[first] if first < len(a) else None,
            "fake": b[first] if first < len(b) else None,
        }
    return out


# ---------------------------------------------------------------------------------------- full
@contextlib.contextmanager
def _bare_fake() -> Any:
    """A bare fake mode on cuda:0 (no recorder) with bfloat16 as the default dtype and the attention kernels
    record() picks: the baseline every full-size timing here is measured against."""
    import torch

    import fakeviz as fv
    from fakeviz._engine.attention import attention_patch

    saved = torch.get_default_dtype()
    try:
        with fv.fake_mode(device="cuda:0"), attention_patch("auto"):
            torch.set_default_dtype(torch.bfloat16)
            yield
    finally:
        torch.set_default_dtype(saved)


def _bare(name: str) -> float:
    """The full-size fwd+bwd under a bare fake mode (no recorder), the attention kernels record() picks."""
    import arch_zoo

    gc.collect()
    t = time.perf_counter()
    with _bare_fake():
        arch_zoo.run(name, "full")
    return time.perf_counter() - t


def _record(name: str) -> tuple[float, Any, Any, BaseException | None]:
    """The full-size fwd+bwd under ``fv.record`` on fake cuda:0: (seconds, trace, run()'s result, error)."""
    import arch_zoo
    import torch

    import fakeviz as fv

    gc.collect()
    out, error = None, None
    t = time.perf_counter()
    try:
        with fv.record(device="cuda:0", dtype=torch.bfloat16) as trace:
            out = arch_zoo.run(name, "full")
    except Exception as exc:  # noqa: BLE001 - the trace keeps what ran; the caller reports the error
        error = exc
        trace = getattr(exc, "fakeviz_trace", None) or getattr(exc, "trace", None)
        if trace is None:
            raise
    return time.perf_counter() - t, trace, out, error


def _memtracker(name: str) -> tuple[float, dict[str, int]]:
    """MemTracker on the full-size fwd+bwd under a bare fake mode, as benchmarks/record_overhead.py runs it."""
    import arch_zoo
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    gc.collect()
    t = time.perf_counter()
    with _bare_fake():
        torch.manual_seed(arch_zoo.SEED)
        model = arch_zoo.build(name, "full")
        kwargs = arch_zoo.inputs(name, "full", model.config)
        mt = MemTracker()
        mt.track_external(model)
        with mt:
            model(**kwargs).loss.backward()
        peak = {
            str(k): int(v.get("Total", 0) if isinstance(v, dict) else v)
            for k, v in mt.get_tracker_snapshot("peak").items()
        }
    return time.perf_counter() - t, peak


def _fidelity_notes(trace: Any) -> dict[str, Any]:
    """What limits the full-size record's fidelity, in a few short fields."""
    notes: dict[str, Any] = {}
    try:
        rep = trace.fidelity()
    except Exception as exc:  # noqa: BLE001 - the notes say so
        return {"fidelity_error": _short(exc)}
    wm = rep.get("without_meta")
    if wm is not None and len(wm):
        notes["without_meta"] = [f"{r.op} ({r.rule})" for r in wm.itertuples()]
    fb = rep.get("fallbacks")
    if fb is not None and len(fb):
        notes["fallback_runs"] = int(len(fb))
    dd = rep.get("data_dependent")
    if dd is not None and len(dd):
        notes["data_dependent"] = sorted({str(o) for o in dd["op"]})
    att = rep.get("attention")
    if att is not None and len(att):
        notes["attention"] = {str(k): int(v) for k, v in att["backend"].value_counts().items()}
    known = {"fake", "ops", "without_meta", "fallbacks", "data_dependent", "attention", "error"}
    for key, val in rep.items():  # e.g. deepcopies, routing assumptions: whatever the report lists
        if key in known or val is None:
            continue
        n = len(val) if hasattr(val, "__len__") and not isinstance(val, str) else (1 if val else 0)
        if n:
            notes[key] = val.to_dict("records") if hasattr(val, "to_dict") else val
    try:
        cov = trace.flop_coverage()
        unknown = cov[cov["kind"] == "unknown"]
        if len(unknown):
            notes["no_flop_formula"] = sorted(str(o) for o in unknown["op"])
    except Exception as exc:  # noqa: BLE001
        notes["flop_coverage_error"] = _short(exc)
    return notes


def full(name: str, runs: int, memtracker: bool) -> dict[str, Any]:
    """The published config of ``name`` on fake cuda:0: times, peak, FLOPs, fidelity, MemTracker."""
    import arch_zoo

    out: dict[str, Any] = {"checkpoint": arch_zoo.ARCHS[name].checkpoint}
    try:
        _bare(name)  # warm-up: imports, the fake-CUDA shim, FakeTensorMode's caches
    except Exception as exc:  # noqa: BLE001 - the recorded run below says where it stopped
        out["bare_error"] = _short(exc)
    try:
        dt, trace, result, error = _record(name)
    except Exception as exc:  # noqa: BLE001
        out["error"] = _short(exc)
        return out
    if error is not None or trace.error is not None:
        out["error"] = _short(error) if error is not None else str(trace.error.get("message", ""))[:160]
        out["ops_before_error"] = trace.num_ops
        return out
    model = result["model"]
    out["params"] = int(sum(p.numel() for p in model.parameters()))
    out["ops"] = int(trace.num_ops)
    out["peak_bytes"] = {d: int(v["bytes"]) for d, v in trace.peak_bytes().items() if v["bytes"]}
    flops = trace.flops()
    out["flops"] = {k: int(v) for k, v in flops.items() if v}
    out["flops_total"] = int(sum(flops.values()))
    out["fidelity"] = _fidelity_notes(trace)
    del trace, result, model
    rec = [dt]
    bare: list[float] = []
    if "bare_error" not in out:
        for i in range(runs):  # ABBA: a drift in the machine's speed hits both alike
            steps = [lambda: bare.append(_bare(name)), lambda: rec.append(_record(name)[0])]
            for step in steps if i % 2 == 0 else steps[::-1]:
                step()
        out["bare_s"] = bare
        out["ratio_record_over_bare"] = statistics.median(rec[1:]) / statistics.median(bare)
    out["record_s"] = rec
    if memtracker:
        try:
            t_mt, peak = _memtracker(name)
            out["memtracker_s"] = t_mt
            out["memtracker_peak"] = peak
            out["ratio_memtracker_over_record"] = t_mt / statistics.median(rec[1:] or rec)
            ours = out["peak_bytes"].get("cuda:0")
            if ours and peak.get("cuda:0"):
                out["memtracker_peak_over_ours"] = peak["cuda:0"] / ours
        except Exception as exc:  # noqa: BLE001 - shown in the table
            out["memtracker_error"] = _short(exc)
    return out


# ---------------------------------------------------------------------------------------- child
def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Everything about one architecture; runs in its own process."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    import arch_zoo

    res: dict[str, Any] = {"arch": name}
    if not args.skip_tiny:
        res["tiny"] = {"eager": tiny(name, "eager")}
        if arch_zoo.supports_sdpa(name):
            res["tiny"]["sdpa"] = tiny(name, "sdpa")
    if not args.skip_full:
        res["full"] = full(name, args.runs, not args.skip_memtracker)
    return res


def _run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--runs", str(args.runs)]
    cmd += [f for f, on in (("--skip-memtracker", args.skip_memtracker), ("--skip-tiny", args.skip_tiny),
                            ("--skip-full", args.skip_full), ("--no-pin", args.no_pin)) if on]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"arch": name, "error": f"timed out after {args.timeout} s"}
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        return {"arch": name, "error": f"child exited {proc.returncode}: " + " | ".join(tail)[-400:]}
    res = json.loads(lines[-1])
    res["child_wall_s"] = wall
    return res


# ---------------------------------------------------------------------------------------- table
def _gib(n: Any) -> str:
    return f"{n / _GiB:.2f}" if isinstance(n, (int, float)) else "–"


def _yn(v: Any) -> str:
    return {True: "yes", False: "**no**"}.get(v, "–")


def _tiny_cell(t: dict[str, Any] | None) -> tuple[str, str, str]:
    if not t:
        return "–", "–", "–"
    if "error" in t:
        return f"fails: {t['error']}", "–", "–"
    oplog = _yn(t["oplog_equal"])
    if not t["oplog_equal"]:
        d = t["first_diff"]
        oplog += f" (op {d['op']}: real `{(d['real'] or '—').split(' = ')[-1][:40]}`)"
    return oplog, _yn(t["peak_equal"]), _yn(t["memory_by_category_equal"])


def _notes(f: dict[str, Any]) -> str:
    parts = []
    fid = f.get("fidelity", {})
    if fid.get("without_meta"):
        parts.append("no meta: " + ", ".join(fid["without_meta"])[:80])
    if fid.get("fallback_runs"):
        parts.append(f"{fid['fallback_runs']} fallback runs")
    if fid.get("data_dependent"):
        parts.append("data-dependent: " + ", ".join(fid["data_dependent"]))
    if fid.get("attention"):
        parts.append("attn " + ", ".join(f"{k}×{v}" for k, v in fid["attention"].items()))
    if fid.get("no_flop_formula"):
        parts.append("no FLOP formula: " + ", ".join(fid["no_flop_formula"])[:80])
    for key, val in fid.items():
        if key not in ("without_meta", "fallback_runs", "data_dependent", "attention", "no_flop_formula"):
            parts.append(f"{key}: {len(val) if isinstance(val, (list, dict)) else val}")
    if "memtracker_error" in f:
        parts.append("MemTracker: " + f["memtracker_error"][:80])
    return "; ".join(parts) or "–"


def table(results: list[dict[str, Any]]) -> str:
    head = [
        "arch", "checkpoint", "tiny ops", "op log =", "peak =", "per-cat =", "sdpa op log =", "sdpa peak =",
        "params", "full ops", "rec/bare", "record s", "peak cuda:0 GiB", "TFLOP", "MemTracker/ours time",
        "MemTracker/ours peak", "notes",
    ]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['arch']} | " + " | ".join(["–"] * (len(head) - 2)) + f" | {r['error']} |")
            continue
        te = r.get("tiny", {}).get("eager")
        ts = r.get("tiny", {}).get("sdpa")
        op, pk, mem = _tiny_cell(te)
        sop, spk, _ = _tiny_cell(ts) if ts else ("n/a", "n/a", "")
        f = r.get("full", {})
        rec = f.get("record_s") or []
        if "error" in f:
            full_cells = ["–"] * 8 + [f"full size fails: {f['error']}"]
        else:
            ratio = f.get("ratio_record_over_bare")
            full_cells = [
                f"{f['params'] / 1e9:.3f} B",
                str(f["ops"]),
                f"{ratio:.2f}" if ratio else "–",
                f"{statistics.median(rec[1:] or rec):.2f}" if rec else "–",
                _gib(f["peak_bytes"].get("cuda:0")),
                f"{f['flops_total'] / 1e12:.1f}",
                f"{f['ratio_memtracker_over_record']:.1f}" if "ratio_memtracker_over_record" in f else "–",
                f"{f['memtracker_peak_over_ours']:.3f}" if "memtracker_peak_over_ours" in f else "–",
                _notes(f),
            ]
        tiny_ops = str(te.get("ops_real", "–")) if te else "–"
        cells = [r["arch"], f.get("checkpoint", "–"), tiny_ops, op, pk, mem, sop, spk, *full_cells]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    tiny_eq = [r["arch"] for r in results if (r.get("tiny", {}).get("eager") or {}).get("oplog_equal")
               and r["tiny"]["eager"].get("peak_equal") and r["tiny"]["eager"].get("memory_by_category_equal")]  # fmt: skip
    full_ok = [r["arch"] for r in results if r.get("full") and "error" not in r["full"] and "error" not in r]
    ratios = [r["full"]["ratio_record_over_bare"] for r in results if "ratio_record_over_bare" in r.get("full", {})]
    mt = [r["full"]["ratio_memtracker_over_record"] for r in results
          if "ratio_memtracker_over_record" in r.get("full", {})]  # fmt: skip
    return {
        "archs": len(results),
        "tiny_real_equals_fake_eager": len(tiny_eq),
        "full_size_runs": len(full_ok),
        "median_ratio_record_over_bare": statistics.median(ratios) if ratios else None,
        "median_ratio_memtracker_over_record": statistics.median(mt) if mt else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--archs", default="", help="comma-separated names of tests/arch_zoo.py (default: all)")
    ap.add_argument("--skip-memtracker", action="store_true")
    ap.add_argument("--skip-tiny", action="store_true", help="do not compare tiny real and fake runs")
    ap.add_argument("--skip-full", action="store_true", help="do not run the full-size configs")
    ap.add_argument("--runs", type=int, default=2, help="bare/record pairs per architecture (ABBA order)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per architecture")
    ap.add_argument("--no-pin", action="store_true", help="do not pin each child to one CPU")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if not args.no_pin and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # see benchmarks/record_overhead.py
        try:
            res = child(args.child, args)
        except Exception as exc:  # noqa: BLE001 - the parent shows it in the table
            traceback.print_exc()
            res = {"arch": args.child, "error": _short(exc)}
        print(json.dumps(res, default=str))
        return 0
    sys.path.insert(0, str(REPO / "tests"))
    import arch_zoo
    import torch
    import transformers

    names = [n.strip() for n in args.archs.split(",") if n.strip()] or list(arch_zoo.ARCHS)
    unknown = [n for n in names if n not in arch_zoo.ARCHS]
    if unknown:
        ap.error(f"unknown arch {', '.join(unknown)}; known: {', '.join(arch_zoo.ARCHS)}")
    results = []
    t0 = time.perf_counter()
    for name in names:
        res = _run_child(name, args)
        results.append(res)
        f = res.get("full", {})
        status = (
            res.get("error")
            or f.get("error")
            or f"{f.get('ops', '?')} ops, rec/bare {f.get('ratio_record_over_bare', 0):.2f}"
        )
        print(f"[{time.perf_counter() - t0:7.1f} s] {name}: {status}", file=sys.stderr, flush=True)
    doc = {
        "what": "tests/arch_zoo.py: tiny real CPU vs fake CPU (eager, sdpa); published full-size config, bf16, "
        "fwd+bwd on fake cuda:0, fv.record vs bare fv.fake_mode (median of ABBA runs), MemTracker beside",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "summary": summary(results),
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(table(results))
    print("\n" + json.dumps(doc["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
