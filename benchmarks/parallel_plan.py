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
    python benchmarks/parallel_plan.py --ep [--layers N]         # DeepSeek-V3, dp_shard 256 x ep 8
"""

from __future__ import annotations

import argparse
import json
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
    ap.add_argument("--ep", action="store_true", help="only the DeepSeek-V3 dp_shard 256 x ep 8 row")
    a = ap.parse_args()
    if a.ep:
        ep_deepseek_v3(layers=a.layers)
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
