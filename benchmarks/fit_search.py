"""fv.fit's budget search against recording every configuration it covers (issue 33: pp, cp and ep layouts).

One call of ``fv.fit`` (every layout of ``--gpus``: device map, dp_shard x tp, HSDP, pp, cp, ep for a MoE model;
every checkpointing kind and offload; every micro-batch), then, in the same process, every configuration of the
same grid recorded one after another with :func:`fakeviz.plan` (cp layouts included whether or not fit pruned them;
a pipeline's micro-batches up to ``batch / dp / P`` under 1F1B). Reported: both wall times and their ratio, the
points and rank recordings of each, and whether the search's rows are the grid's: for every (layout, knob) row of
fit, the grid's largest fitting micro-batch (a pipeline's: the fastest fitting one) and the same peak; and that
every (layout, knob) with a fitting configuration in the grid has a row, or is dominated as the Notes say (a cp
layout whose twin fits its largest micro-batch with the cheapest knob; a knob after one that fits the largest
micro-batch).

    python benchmarks/fit_search.py [--gpus 4xH100] [--seq 4096] [--batch 8] [--layers 4] [--tiny] [--out PATH] [--append]

Results: ``benchmarks/results/fit_search.json``.

``--readme`` runs the README's call exactly, ``fv.fit("meta-llama/Llama-3.1-8B", gpus="8xH100", seq=4096, batch=64)``
(the default executor; issue 41: the goal is an answer in under 2 minutes on 2 cores), and reports its wall time, the
configurations it recorded and the rank recordings they took against the configurations of its grid (too many to
record them all here: the tiny models above check the rows against the grid), what it pruned and its first row; then
the time of one recording of one 8B rank (``dp_shard 8``, micro-batch 8, the search's first point) so the wall time
on idle cores can be predicted from the count. Results: ``benchmarks/results/fit_search_readme.json`` (appended).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import fakeviz as fv
from fakeviz._core.gpus import parse_gpus
from fakeviz._frontends import fit as fit_mod
from fakeviz._frontends import fit_layouts

OUT = Path(__file__).resolve().parent / "results" / "fit_search.json"
README_OUT = Path(__file__).resolve().parent / "results" / "fit_search_readme.json"


def _commit() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "fakeviz"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent).stdout.strip()  # fmt: skip
        return out.stdout.strip() + (" (fakeviz/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def readme(path: Path) -> None:
    """The README's call, as a user runs it; then one 8B rank's recording time."""
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    df = fv.fit("meta-llama/Llama-3.1-8B", gpus="8xH100", seq=4096, batch=64)
    wall = time.perf_counter() - t0
    tried = df.attrs["tried"]
    t0 = time.perf_counter()
    fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, seq=4096, batch=8, train=True,
            checkpointing=False, executor=False)  # fmt: skip
    one = time.perf_counter() - t0
    first = df.iloc[0] if len(df) else None
    out = {
        "call": 'fv.fit("meta-llama/Llama-3.1-8B", gpus="8xH100", seq=4096, batch=64)', "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
        "load_average_before": load0, "load_average_after": os.getloadavg(), "wall_s": round(wall, 1),
        "configurations_recorded": df.attrs["points"], "rank_recordings": df.attrs["recordings"],
        "configurations_in_grid": df.attrs["configurations"],
        "points_known_not_to_fit": int((tried.recordings == 0).sum()) if len(tried) else 0,
        "rows": len(df), "executor": df.attrs["executor"],
        "first_row": None if first is None else {k: (v.item() if hasattr(v, "item") else v) for k, v in
                                                  first[["layout", "checkpointing", "offload", "micro_batch",
                                                         "accumulation", "max peak", "global_step_s"]].items()},
        "table": df.drop(columns=["rank"]).to_dict("records"), "pruned": df.attrs["pruned"],
        "tried": tried.to_dict("records"), "one_8b_rank_recording_s": round(one, 2),
    }  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k not in ("table", "tried")}, indent=1, default=str))
    answer = "nothing fits" if first is None else (
        f"{first['layout']}, micro-batch {first['micro_batch']} x accumulation {first['accumulation']}, checkpointing="
        f"{first['checkpointing']}, {first['global_step_s']:.3g} s per global step")  # fmt: skip
    print(f"README call: {wall:.1f} s (load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"{os.cpu_count()} cores); {out['configurations_recorded']} of {out['configurations_in_grid']} configurations "
          f"recorded ({out['rank_recordings']} rank recordings); answer: {answer}")  # fmt: skip
    runs = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*runs, out], indent=1, default=str) + "\n")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def grid(model: Any, gpus: str, seq: int, batch: int, knobs: list[Any], offloads: list[str]) -> list[dict[str, Any]]:
    """Every configuration fit covers: (layout, schedule, checkpointing, offload, micro-batch)."""
    n = len(parse_gpus(gpus))
    lays = fit_layouts.layouts(model, n, None, fit_layouts.AXES)
    lays += fit_layouts.cp_layouts(model, n, seq, None, True, fit_layouts.AXES, lambda twin: False)[0]
    out = []
    for lay in lays:
        dp = fit_layouts.dp(lay)
        if batch % dp:
            continue
        per = batch // dp
        pp = (lay or {}).get("pp", 1)
        sharded = lay is not None and lay.get("dp_shard", 1) > 1
        ks = [(c, None) for c in knobs] + ([] if pp > 1 else [(True, o) for o in offloads if o != "cpu" or sharded])
        cands = [m for m in _divisors(per) if pp == 1 or per // m >= pp]
        for c, o in ks:
            for m in cands:
                out.append({"layout": lay, "checkpointing": c, "offload": o, "micro_batch": m, "per": per, "pp": pp})
    return out


def record(model: Any, gpus: str, seq: int, g: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"gpus": gpus, "seq": seq, "train": True, "checkpointing": g["checkpointing"]}
    if g["offload"]:
        kw["offload"] = g["offload"]
    if g["layout"] is not None:
        kw.update(parallel=g["layout"], executor=False)
    kw["batch"] = g["micro_batch"]
    if g["pp"] > 1:
        kw.update(batch=g["per"], microbatches=g["per"] // g["micro_batch"], schedule="1F1B")
    try:
        p = fv.plan(model, **kw)
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is a row, as in fit
        return {**g, "fits": False, "peak": 0, "recordings": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}
    from fakeviz._frontends.offload import gpu_rows

    peak = int(gpu_rows(p.peaks).peak.max())
    m = g["per"] // g["micro_batch"]
    sp = p.step_s
    t = None if sp is None else (sp / (1 - fit_layouts.bubble(g["pp"], m)) if g["pp"] > 1 else sp * m)
    recs = len(p.traces) if hasattr(p, "traces") else p.recordings
    return {**g, "fits": bool(p.fits), "peak": peak, "global_step_s": t, "recordings": recs, "error": ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="4xH100")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--model", default="meta-llama/Llama-3.2-1B")
    ap.add_argument("--tiny", action="store_true", help="4 heads, 2 key/value heads, vocabulary 256")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--append", action="store_true", help="add this run to the file's list")
    ap.add_argument("--readme", action="store_true", help="the README's 8B call instead (results: fit_search_readme.json)")
    a = ap.parse_args()
    if a.readme:
        readme(Path(a.out) if a.out != str(OUT) else README_OUT)
        return
    dims = {"num_hidden_layers": a.layers, "hidden_size": a.hidden, "intermediate_size": 2 * a.hidden}
    if a.tiny:  # the tests' tiny Llama: 4 query and 2 key/value heads, a vocabulary of 256
        dims.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = fv.models.config(a.model, **dims)
    t0 = time.perf_counter()
    df = fv.fit(model, gpus=a.gpus, seq=a.seq, batch=a.batch, executor=False, progress=False)
    fit_s = time.perf_counter() - t0
    # fit's defaults: every checkpointing kind, then each offload after full checkpointing
    configs = grid(model, a.gpus, a.seq, a.batch, fit_mod._checkpointing_kinds(), ["activations", "cpu"])
    t0 = time.perf_counter()
    rows = [record(model, a.gpus, a.seq, g) for g in configs]
    grid_s = time.perf_counter() - t0
    # the grid's answer per (layout, knob): the largest fitting micro-batch (a pipeline's: the fastest fitting one)
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    n = len(parse_gpus(a.gpus))
    for r in rows:
        if not r["fits"]:
            continue
        key = (fit_layouts.name(r["layout"], n), str(r["checkpointing"]), str(r["offload"]))
        b = best.get(key)
        better = (r["global_step_s"] < b["global_step_s"]) if r["pp"] > 1 and b and r["global_step_s"] else None
        if b is None or (better if better is not None else r["micro_batch"] > b["micro_batch"]):
            best[key] = r
    largest: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if r["fits"]:
            key = (fit_layouts.name(r["layout"], n), str(r["checkpointing"]), str(r["offload"]))
            largest[key] = max(largest.get(key, 0), r["micro_batch"])
    agree, differ = 0, []
    for r in df.to_dict("records"):
        key = (r["layout"], str(r["checkpointing"]), str(r["offload"]))
        g = best.get(key)
        if g is not None and g["micro_batch"] == r["micro_batch"] and g["peak"] == r["max peak"]:
            agree += 1
        else:
            differ.append({"row": key, "fit": [r["micro_batch"], r["max peak"]],
                           "grid": None if g is None else [g["micro_batch"], g["peak"]]})  # fmt: skip
    # the converse: a (layout, knob) that fits in the grid but has no row must be dominated by an earlier knob of its
    # layout fitting the same or a larger micro-batch (Note: [the budget search]), or be a pruned cp layout
    order = [str(c) for c in fit_mod._checkpointing_kinds()]
    have = {(r["layout"], str(r["checkpointing"]), str(r["offload"])) for r in df.to_dict("records")}
    tried = df.attrs["tried"]
    fastest_fit = tried[tried.fits & (tried.recordings > 0)].global_step_s.min() if len(tried) else float("nan")
    missing = []
    for key, g in best.items():
        if key in have:
            continue
        rank = order.index(key[1]) + (len(order) if key[2] != "None" else 0) + (key[2] == "cpu")
        earlier = [b for k, b in largest.items() if k[0] == key[0] and
                   order.index(k[1]) + (len(order) if k[2] != "None" else 0) + (k[2] == "cpu") < rank]  # fmt: skip
        dominated = any(b >= largest[key] for b in earlier)
        pruned_cp = any(line.startswith(key[0] + ":") and "dp twin" in line for line in df.attrs["pruned"])
        # Note: [bounds in fit]: slower than a configuration fit recorded that fits
        slower = g["global_step_s"] is not None and g["global_step_s"] > fastest_fit
        missing.append({"row": key, "micro_batch": g["micro_batch"], "global_step_s": g["global_step_s"],
                        "dominated_or_pruned": dominated or pruned_cp or slower})  # fmt: skip
    fastest_grid = min((r for r in best.values() if r["global_step_s"]), key=lambda r: r["global_step_s"], default=None)
    out = {
        "model": f"{a.model} with {a.layers} layers, hidden {a.hidden}" + (", tiny heads and vocabulary" if a.tiny else ""), "gpus": a.gpus, "seq": a.seq, "batch": a.batch,
        "fit_s": round(fit_s, 2), "grid_s": round(grid_s, 2), "ratio": round(fit_s / grid_s, 3),
        "fit_points": df.attrs["points"], "fit_recordings": df.attrs["recordings"],
        "fit_configurations": df.attrs["configurations"], "grid_points": len(rows),
        "grid_recordings": sum(r["recordings"] for r in rows), "rows": len(df), "rows_agreeing_with_grid": agree,
        "rows_differing": differ, "grid_rows_without_fit_row": missing,
        "all_missing_dominated": all(m["dominated_or_pruned"] for m in missing), "pruned": df.attrs["pruned"],
        "fit_first": df.iloc[0][["layout", "checkpointing", "micro_batch", "global_step_s"]].to_dict() if len(df) else None,
        "grid_fastest": None if fastest_grid is None else [fit_layouts.name(fastest_grid["layout"], n),
                                                           fastest_grid["checkpointing"], fastest_grid["micro_batch"],
                                                           fastest_grid["global_step_s"]],
        "layouts_in_fit": sorted(set(df.layout)), "load_average": os.getloadavg(),
    }  # fmt: skip
    print(json.dumps(out, indent=1, default=str))
    path = Path(a.out)
    runs = json.loads(path.read_text()) if a.append and path.exists() else []
    path.write_text(json.dumps([*runs, out], indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
