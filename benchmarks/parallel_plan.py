"""fv.plan(..., parallel=...) at scale: Llama-3.1-70B on 64 fake H100s as dp_shard 8 x tp 8, seq 8192, batch 1,
one steady-state AdamW training step, with and without activation checkpointing.

What is measured, all in one process (figures are ratios against baselines measured in the same run):

* ``auto``: ``fv.plan(..., ranks="auto")``: rank 0 recorded, the other 63 found identical by their shard
  layout (Note: [parallel plans]) and not recorded: wall time and the number of ranks recorded;
* ``per_rank``: ``ranks=[0, 1, 2, 3]`` recorded in full (the first of them fills torch's DTensor propagation
  caches, so this is run after ``auto``): seconds per recorded rank; ``all_estimate`` = 64 x that, what
  ``ranks="all"`` would take;
* ``baseline``: the same training step of the same model, unsharded on one fake GPU under ``fv.record``.

A one-layer warm-up of each runs first, untimed. Peak RSS is the process's high-water mark over the run.

    python benchmarks/parallel_plan.py [--layers N] [--seq 8192] [--out PATH]
    python benchmarks/parallel_plan.py --pipeline [--layers N]   # Llama-3.1-405B, pp 8 x dp_shard 8 x tp 8
    python benchmarks/parallel_plan.py --ep [--layers N]         # DeepSeek-V3, dp_shard 256 x ep 8

``--pipeline``: Llama-3.1-405B in torchtitan's published 3D layout (512 GPUs: pp 8 x dp_shard 8 x tp 8, local batch
32 in 32 microbatches, seq 8192, full activation checkpointing) under 1F1B and Interleaved1F1B, one rank per class
recorded against all 512 (extrapolated), next to torchtitan's published memory (:func:`pipeline_405b`).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "parallel_plan.json"
MODEL = "meta-llama/Llama-3.1-70B"
PARALLEL = {"dp_shard": 8, "tp": 8}


def _baseline(layers: int | None, seq: int, ac: bool) -> float:
    import fakeviz as fv
    import fakeviz.models  # noqa: F401
    from fakeviz._frontends.steps import checkpointing, init_state, make_optimizer

    over = {"num_hidden_layers": layers} if layers else {}
    t = time.perf_counter()
    with fv.record(device="cuda:0", gpu="H100") as trace:
        model = fv.models.build(MODEL, **over)
        opt = make_optimizer("adamw", model)
        init_state(opt)
        with checkpointing(model, ac):
            kw = fv.models.inputs(model, batch=1, seq=seq, labels=True)
            model(**kw).loss.backward()
            opt.step()
    assert trace.error is None, trace.error
    del model, opt
    return time.perf_counter() - t


def _plan(layers: int | None, seq: int, ac: bool, ranks: object) -> tuple[float, object]:
    import fakeviz as fv
    import fakeviz.models  # noqa: F401

    cfg = fv.models.config(MODEL, **({"num_hidden_layers": layers} if layers else {}))
    t = time.perf_counter()
    sim = fv.plan(cfg, gpus="64xH100", parallel=PARALLEL, batch=1, seq=seq, train=True, checkpointing=ac, ranks=ranks)
    return time.perf_counter() - t, sim


# ------------------------------------------------------------------------------ Llama-3.1-405B with pipelines
PP_MODEL = "meta-llama/Llama-3.1-405B"
PP_OUT = HERE / "results" / "parallel_plan_405b.json"
# torchtitan's published 3D layout (docs/performance.md, Table 5): 512 GPUs, FSDP 8 x TP 8 x PP 8, local batch 32
# (microbatches of 1), seq 8192, full activation checkpointing; memory 82.5 GiB (1F1B) and 72.7 GiB (Interleaved
# 1F1B), measured with torch.compile + Float8 + AsyncTP (which fakeviz does not model: bf16 here)
PP_PARALLEL = {"pp": 8, "dp_shard": 8, "tp": 8}
PP_PUBLISHED_GIB = {"1F1B": 82.5, "Interleaved1F1B": 72.7}


def _rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def pipeline_405b(out: Path = PP_OUT, layers: int | None = None, schedules: tuple[str, ...] = ("1F1B",)) -> dict:
    """The Llama-3.1-405B row: ``fv.plan`` in torchtitan's published pp 8 x dp_shard 8 x tp 8 layout, one rank per
    class recorded (``ranks="auto"``: one per pipeline rank here) against recording all 512 (extrapolated: 512 x the
    mean seconds and RSS growth per recorded rank; recording all 512 would take hours)."""
    import fakeviz as fv
    import fakeviz.models  # noqa: F401

    over = {"num_hidden_layers": layers} if layers else {}
    cfg = fv.models.config(PP_MODEL, **over)
    world = math.prod(PP_PARALLEL.values())
    fv.plan(fv.models.config(PP_MODEL, num_hidden_layers=6), gpus="H100", parallel={"pp": 2}, batch=2, seq=256,
            train=True, ranks="all")  # warm-up, untimed  # fmt: skip
    results: dict = {"setup": {"model": PP_MODEL, "gpus": f"{world}xH100", "parallel": PP_PARALLEL, "seq": 8192,
                               "batch": 32, "microbatches": 32, "checkpointing": "full", "layers": layers or "all",
                               "published": "torchtitan docs/performance.md Table 5 (compile + Float8 + AsyncTP)"}}  # fmt: skip
    if out.exists():  # one schedule per run: the others' rows are kept
        results = {**json.loads(out.read_text()), **results}
    for schedule in schedules:
        rss0 = _rss_gib()
        t = time.perf_counter()
        sim = fv.plan(cfg, gpus="H100", parallel=PP_PARALLEL, batch=32, seq=8192, train=True, checkpointing=True,
                      microbatches=32, schedule=schedule, stages_per_rank=2 if schedule == "Interleaved1F1B" else None)  # fmt: skip
        dt = time.perf_counter() - t
        rss1 = _rss_gib()
        n = len(sim.ranks)
        pk = sim.peaks
        worst = pk.loc[pk.peak.idxmax()]
        results[schedule] = {
            "auto_s": round(dt, 1),
            "ranks_recorded": n,
            "ranks_stood_in": len(sim.stand_ins),
            "classes": len(sim.classes),
            "per_rank_s": round(dt / n, 1),
            "all_estimate_s": round(dt / n * world, 0),
            "auto_vs_all_estimate": round(n / world, 4),
            "rss_gib": round(rss1, 2),
            "rss_growth_per_rank_gib": round((rss1 - rss0) / n, 3),
            "all_rss_estimate_gib": round(rss0 + (rss1 - rss0) / n * world, 1),
            "peak_gib_by_pipeline_rank": [
                round(int(pk.peak[pk["rank"] == r].iloc[0]) / 2**30, 1)
                for r in range(0, world, world // PP_PARALLEL["pp"])
            ],  # fmt: skip
            "highest_peak_gib": round(int(worst["peak"]) / 2**30, 1),
            "highest_peak_rank": int(worst["rank"]),
            "published_gib": PP_PUBLISHED_GIB[schedule],
            "fits": bool(sim.fits),
            "text": sim.text,
        }
        print(json.dumps(results[schedule], indent=1), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", out)
    return results


# ------------------------------------------------------------------------------ DeepSeek-V3 with expert parallel
EP_MODEL = "deepseek-ai/DeepSeek-V3"
EP_OUT = HERE / "results" / "parallel_plan_deepseek_v3.json"
# torchtitan's deepseek_v3_671b config gives ep 2 with dp_shard filling the world, 4 x 4096 tokens per microbatch and
# Interleaved1F1B (the pp degree left to the launch); no published memory. fakeviz's layout here, stated: 256 GPUs
# (32 nodes of 8), dp_shard 256 with ep 8 borrowed from it (32 experts per rank, each FSDP-sharded over its 32 efsdp
# ranks), seq 4096, batch 1, full activation checkpointing, AdamW, bf16; no pp (an ep plan does not combine with pp)
EP_PARALLEL = {"dp_shard": 256, "ep": 8}


def ep_deepseek_v3(out: Path = EP_OUT, layers: int | None = None) -> dict:
    """The DeepSeek-V3 row: ``fv.plan`` with ``parallel=EP_PARALLEL`` (Note: [expert parallel plans]), one rank per
    class recorded (``ranks="auto"``) against recording all 256 (extrapolated: 256 x the seconds and the RSS growth
    per recorded rank)."""
    import fakeviz as fv
    import fakeviz.models  # noqa: F401

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    world = EP_PARALLEL["dp_shard"]
    fv.plan(fv.models.config(EP_MODEL, num_hidden_layers=4), gpus="H100", parallel={"ep": 8}, batch=1, seq=256,
            train=True)  # warm-up, untimed  # fmt: skip
    cfg = fv.models.config(EP_MODEL, **({"num_hidden_layers": layers} if layers else {}))
    rss0 = rss()
    t = time.perf_counter()
    sim = fv.plan(cfg, gpus="H100", parallel=EP_PARALLEL, batch=1, seq=4096, train=True, checkpointing=True)
    dt = time.perf_counter() - t
    rss1 = rss()
    n = len(sim.ranks)
    pk = sim.peaks
    worst = pk.loc[pk.peak.idxmax()]
    row = pk.iloc[0]
    coll = sim.collectives(0)
    a2a = coll[coll.kind == "all_to_all"]
    results = {
        "setup": {"model": EP_MODEL, "gpus": f"{world}xH100", "parallel": EP_PARALLEL, "seq": 4096, "batch": 1,
                  "checkpointing": "full", "layers": layers or "all",
                  "layout": "fakeviz's (torchtitan's deepseek_v3_671b: ep 2, dp_shard -1, pp from the launch)"},
        "auto_s": round(dt, 1),
        "ranks_recorded": n,
        "ranks_stood_in": len(sim.stand_ins),
        "classes": len(sim.classes),
        "per_rank_s": round(dt / n, 1),
        "all_estimate_s": round(dt / n * world, 0),
        "auto_vs_all_estimate": round(n / world, 4),
        "rss_gib": round(rss1, 2),
        "rss_growth_per_rank_gib": round((rss1 - rss0) / n, 3),
        "all_rss_estimate_gib": round(rss0 + (rss1 - rss0) / n * world, 1),
        "peak_gib": round(int(row["peak"]) / 2**30, 1),
        "by_kind_gib": {k: round(int(row[k]) / 2**30, 2)
                        for k in ("weights", "gradients", "optimizer", "activations", "temporaries")},
        "highest_peak_gib": round(int(worst["peak"]) / 2**30, 1),
        "all_to_all_per_step_gib": round(float(a2a.bytes_in.sum()) / 2**30, 2),
        "all_to_all_calls": len(a2a),
        "fits": bool(sim.fits),
        "text": sim.text,
    }  # fmt: skip
    print(json.dumps(results, indent=1), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", out)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--pipeline", action="store_true", help="only the Llama-3.1-405B pp 8 x dp_shard 8 x tp 8 row")
    ap.add_argument("--schedules", default="1F1B", help="with --pipeline: 1F1B, Interleaved1F1B (comma-separated)")
    ap.add_argument("--ep", action="store_true", help="only the DeepSeek-V3 dp_shard 256 x ep 8 row")
    a = ap.parse_args()
    if a.ep:
        ep_deepseek_v3(layers=a.layers)
        return
    if a.pipeline:
        pipeline_405b(layers=a.layers, schedules=tuple(a.schedules.split(",")), out=a.out if a.out != OUT else PP_OUT)
        return
    _baseline(1, 256, False)  # warm-up, untimed
    _plan(1, 256, False, "auto")
    results = {}
    for ac in (False, True):
        base = _baseline(a.layers, a.seq, ac)
        auto_s, sim = _plan(a.layers, a.seq, ac, "auto")
        per_s, sub = _plan(a.layers, a.seq, ac, [0, 1, 2, 3])
        row = sim.peaks.iloc[0]
        results["ac_on" if ac else "ac_off"] = {
            "auto_s": round(auto_s, 2),
            "ranks_recorded": len(sim.ranks),
            "ranks_stood_in": len(sim.stand_ins),
            "classes": len(sim.classes),
            "per_rank_s": round(per_s / 4, 2),
            "all_estimate_s": round(per_s / 4 * 64, 1),
            "baseline_s": round(base, 2),
            "auto_vs_baseline": round(auto_s / base, 2),
            "auto_vs_all_estimate": round(auto_s / (per_s / 4 * 64), 3),
            "same_classes_as_4_recorded": [sub.class_of(r) for r in range(4)] == [sim.class_of(r) for r in range(4)],
            "peak_gib": round(int(row["peak"]) / 2**30, 1),
            "fits": bool(sim.fits),
            "by_kind_gib": {
                k: round(int(row[k]) / 2**30, 2)
                for k in ("weights", "gradients", "optimizer", "activations", "temporaries")
            },  # fmt: skip
            "text": sim.text,
        }
        print(json.dumps(results["ac_on" if ac else "ac_off"], indent=1), flush=True)
    results["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    results["setup"] = {"model": MODEL, "gpus": "64xH100", "parallel": PARALLEL, "seq": a.seq, "batch": 1,
                        "layers": a.layers or "all"}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
