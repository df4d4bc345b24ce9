"""fv.simulate at scale: Llama-3.1-70B, FSDP2 over 64 fake H100s, seq 8192, batch 1, with and without activation
checkpointing: wall time, peak RSS, and whether each rank fits.

The step each rank runs (``step(rank, mesh)`` under :func:`fakeviz.simulate`, torch's fake process group):

* build the published config (bfloat16) on the meta device (``--init meta``, the FSDP2 recipe for a model
  larger than one GPU: torchtitan's), or directly on the rank's fake GPU (``--init device``: the whole
  unsharded model is alive on one GPU until ``fully_shard`` frees it, as it would be in a real run);
* activation checkpointing (``--ac on``): transformers' ``activation_checkpointing_enable`` (transformers 5;
  ``gradient_checkpointing_enable`` before it), non-reentrant;
* ``fully_shard`` each decoder layer (``model.model.layers``), then the root, over the 1-D mesh of 64 ranks;
  ``to_empty`` onto the rank's GPU when built on meta (values do not matter under fake tensors, so no init);
* ``torch.optim.AdamW(model.parameters())``, one training step: forward with labels, backward, ``opt.step()``.

The speed baseline, measured in the same run (figures are ratios, machines differ): the same training step
of the same model in one process without torch.distributed, unsharded on one fake GPU under ``fv.record``
(built directly on the GPU). ``seconds per rank / baseline`` is what a rank of the simulation costs over
recording the model once.

Every configuration (baseline or simulation, AC off or on) runs in its own subprocess: imports, an untimed
warm-up at one layer (the first recording of a process pays one-off costs: torch's dispatch and fake caches,
transformers' lazy modules), then the timed run. Peak RSS is the process's ``VmHWM`` reset just before the
timed run (``/proc/self/clear_refs``), so ``rss_growth`` is what the run itself added over the warm process;
``rss_retained`` is what is still resident after it (the traces of the recorded ranks). ``--runs N`` repeats
each baseline/simulation pair in ABBA order and the medians are taken (a set of more than 8 ranks runs once:
its seconds per rank is already a mean over many).

The first rank a process records pays more than the next ones (``first_rank_step_s`` against
``later_ranks_step_s``): the one-layer warm-up does not fill torch's DTensor sharding-propagation cache for the
optimizer's foreach ops over all the model's parameters (their schema holds every parameter); the first rank
at full depth fills it and the later ranks of the process hit it. ``seconds_per_rank`` is the wall time of the
whole ``fv.simulate`` call over the ranks recorded, so it falls towards ``later_ranks_step_s`` as more ranks
are recorded.

    python benchmarks/distributed.py [--ranks 0,63 [all ...]] [--layers N] [--ac off,on] [--init meta|device]
                                     [--seq 8192] [--batch 1] [--world 64] [--gpu H100] [--runs 2] [--out PATH]

``--ranks`` takes one or more sets, each comma-separated ranks or ``all`` (the 64); the default records ranks
0 and 63, the first and last of the mesh. ``--layers`` shortens the model (same widths) for a quick run.
Results: ``benchmarks/results/distributed.json``, per set of ranks and AC setting (``results``), every
subprocess's figures (``runs``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fakeviz._frontends.distributed import _ranks_text

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "results" / "distributed.json"
MODEL = "meta-llama/Llama-3.1-70B"
_MiB = 2**20
_GiB = 2**30
MANY = 8  # a set of more ranks than this runs once: its seconds per rank is already a mean over many


# ---------------------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``); None where there is no procfs."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def _rss() -> int | None:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return None


def _reset_hwm() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _hwm() -> int | None:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource  # process-lifetime peak: the warm-up is in it too

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------------------------------- the step
def _checkpointing(model: Any) -> None:
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def _train(model: Any, batch: int, seq: int) -> None:
    import torch

    import fakeviz as fv

    opt = torch.optim.AdamW(model.parameters())
    model(**fv.models.inputs(model, batch=batch, seq=seq, labels=True)).loss.backward()
    opt.step()


def _fsdp_step(overrides: dict[str, Any], ac: bool, init: str, batch: int, seq: int, seconds: dict[int, float]):  # noqa: ANN202
    import torch
    from torch.distributed.fsdp import fully_shard

    import fakeviz as fv
    import fakeviz.models  # noqa: F401

    def step(rank: int, mesh: Any) -> None:
        t = time.perf_counter()
        if init == "meta":
            with torch.device("meta"):
                model = fv.models.build(MODEL, **overrides)
        else:
            model = fv.models.build(MODEL, **overrides)
        if ac:
            _checkpointing(model)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if init == "meta":
            model.to_empty(device=torch.device("cuda", torch.cuda.current_device()))
        _train(model, batch, seq)
        seconds[rank] = time.perf_counter() - t

    return step


def _simulate(spec: dict[str, Any], overrides: dict[str, Any], ranks: Any) -> tuple[Any, dict[int, float]]:
    import fakeviz as fv

    seconds: dict[int, float] = {}
    step = _fsdp_step(overrides, spec["ac"], spec["init"], spec["batch"], spec["seq"], seconds)
    sim = fv.simulate(step, spec["world"], gpu=spec["gpu"], ranks=ranks)
    return sim, seconds


def _baseline(spec: dict[str, Any], overrides: dict[str, Any]) -> Any:
    import fakeviz as fv
    import fakeviz.models  # noqa: F401

    with fv.record(device="cuda:0", gpu=spec["gpu"]) as trace:
        model = fv.models.build(MODEL, **overrides)
        if spec["ac"]:
            _checkpointing(model)
        _train(model, spec["batch"], spec["seq"])
        del model
    if trace.error is not None:
        raise RuntimeError(str(trace.error.get("message", trace.error))[:300])
    return trace


# ---------------------------------------------------------------------------------------- child
def _row(r: Any) -> dict[str, Any]:
    kinds = ["weights", "gradients", "optimizer", "kv_cache", "activations", "temporaries", "other"]
    out: dict[str, Any] = {k: int(r[k]) for k in kinds}
    out["live_at_peak"] = sum(out.values())
    out.update(peak=int(r["peak"]), capacity=int(r["capacity"]), headroom=int(r["headroom"]), fits=bool(r["fits"]))
    out["peak_gib"] = round(out["peak"] / _GiB, 2)
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration (baseline or simulation, AC off or on) in this process: warm-up, then the timed run."""
    import torch

    import fakeviz  # noqa: F401
    from fakeviz._analysis.placement import peaks_table
    from fakeviz._core.gpus import parse_gpus

    torch.manual_seed(0)
    rss_imports = _rss()
    overrides = {"num_hidden_layers": spec["layers"]} if spec["layers"] else {}
    ranks = "all" if spec["ranks"] == "all" else spec["ranks"]
    first = 0 if ranks == "all" else ranks[0]
    # warm-up, untimed: one layer, one rank (or the baseline's one GPU)
    if spec["kind"] == "simulate":
        _simulate(spec, {"num_hidden_layers": 1}, [first])
    else:
        _baseline(spec, {"num_hidden_layers": 1})
    gc.collect()
    reset = _reset_hwm()
    rss_before = _rss()
    t0 = time.perf_counter()
    if spec["kind"] == "simulate":
        sim, seconds = _simulate(spec, overrides, ranks)
    else:
        trace = _baseline(spec, overrides)
    wall = time.perf_counter() - t0
    gc.collect()
    hwm, rss_after = _hwm(), _rss()
    out: dict[str, Any] = {"kind": spec["kind"], "ac": spec["ac"], "wall_s": wall}
    t1 = time.perf_counter()
    if spec["kind"] == "simulate":
        n = len(sim.ranks)
        out["ranks_recorded"] = n
        out["seconds_per_rank"] = wall / n
        out["step_seconds"] = {str(r): s for r, s in sorted(seconds.items())}
        peaks = sim.peaks
        out["per_rank"] = {str(int(r["rank"])): {**_row(r), "class": int(r["class"]),
                                                 "ops": int(sim.trace(int(r["rank"])).num_ops)}
                           for _, r in peaks.iterrows()}  # fmt: skip
        out["classes"] = int(len(sim.classes))
        out["class_table"] = sim.classes.to_dict("records")
        out["fits"] = bool(sim.fits)
        out["text"] = sim.text
        col = sim.collectives(sim.ranks[0])
        out["collectives_first_rank"] = {
            str(k): {"count": int(len(g)), "bytes_out": int(g.bytes_out.sum())} for k, g in col.groupby("kind")
        }
    else:
        cap = parse_gpus(spec["gpu"])[0]
        row = peaks_table(trace, {"cuda:0": cap.bytes}).iloc[0]
        out["ops"] = int(trace.num_ops)
        out["single_gpu"] = _row(row)
    out["analysis_s"] = time.perf_counter() - t1
    out["rss"] = {
        "after_imports": rss_imports,
        "before_run": rss_before,
        "peak_run": hwm,
        "peak_is_of_the_run": reset,  # False: VmHWM/ru_maxrss is the process's lifetime peak, warm-up included
        "growth": hwm - rss_before if hwm is not None and rss_before is not None else None,
        "retained": rss_after - rss_before if rss_after is not None and rss_before is not None else None,
    }
    return out


def _run_child(spec: dict[str, Any], timeout: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-4:]
        return {**spec, "error": f"child exited {proc.returncode}: " + " | ".join(tail)[-600:]}
    res = json.loads(lines[-1])
    res["child_wall_s"] = time.perf_counter() - t
    return res


# ---------------------------------------------------------------------------------------- summary
def _mib(n: int | None) -> float | None:
    return round(n / _MiB, 1) if n is not None else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of one AC setting: seconds per rank over the baseline, RSS, per-rank fits."""
    sims = [r for r in runs if r["kind"] == "simulate" and "error" not in r]
    bases = [r for r in runs if r["kind"] == "baseline" and "error" not in r]
    errors = [r["error"] for r in runs if "error" in r]
    out: dict[str, Any] = {}
    if errors:
        out["errors"] = errors
    if sims:
        last = sims[-1]
        per_rank = statistics.median(r["seconds_per_rank"] for r in sims)
        firsts = [next(iter(r["step_seconds"].values())) for r in sims]
        laters = [s for r in sims for s in list(r["step_seconds"].values())[1:]]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for rank, v in last["per_rank"].items():
            groups.setdefault((v["peak_gib"], v["fits"], v["class"]), []).append(int(rank))
        out.update(
            ranks_recorded=last["ranks_recorded"],
            wall_s=statistics.median(r["wall_s"] for r in sims),
            seconds_per_rank=per_rank,
            first_rank_step_s=statistics.median(firsts),
            later_ranks_step_s=statistics.median(laters) if laters else None,
            rss_growth_mib=_mib(max(r["rss"]["growth"] for r in sims if r["rss"]["growth"] is not None)),
            rss_retained_mib=_mib(max(r["rss"]["retained"] for r in sims if r["rss"]["retained"] is not None)),
            rss_peak_mib=_mib(max(r["rss"]["peak_run"] for r in sims if r["rss"]["peak_run"] is not None)),
            classes=last["classes"],
            fits=last["fits"],
            per_rank=[
                {"ranks": _ranks_text(sorted(rs)), "peak_gib": k[0], "fits": k[1], "class": k[2]}
                for k, rs in groups.items()
            ],  # fmt: skip
            text=last["text"],
        )
    if bases:
        base = statistics.median(r["wall_s"] for r in bases)
        out["baseline_s"] = base
        out["baseline_rss_growth_mib"] = _mib(max(r["rss"]["growth"] for r in bases if r["rss"]["growth"] is not None))
        out["baseline_peak_gib"] = bases[-1]["single_gpu"]["peak_gib"]
        if sims:
            out["seconds_per_rank_over_baseline"] = out["seconds_per_rank"] / base
            if out["later_ranks_step_s"] is not None:
                out["later_ranks_step_over_baseline"] = out["later_ranks_step_s"] / base
            out["rss_growth_over_baseline"] = (
                out["rss_growth_mib"] / out["baseline_rss_growth_mib"] if out["baseline_rss_growth_mib"] else None
            )
    return out


def _label(ranks: Any) -> str:
    return "all" if ranks == "all" else _ranks_text(ranks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--ranks", nargs="+", default=["0,63"],
                    help="one or more sets of ranks to record: comma-separated ranks, or 'all'")  # fmt: skip
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the published 80)")
    ap.add_argument("--ac", default="off,on", help="activation checkpointing settings to run: off, on or off,on")
    ap.add_argument("--init", choices=["meta", "device"], default="meta", help="where the model is built")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--runs", type=int, default=2,
                    help=f"baseline/simulation pairs per AC setting (ABBA order); 1 for a set of more than "
                         f"{MANY} ranks")  # fmt: skip
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per subprocess")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child)), default=str))
        return 0
    import torch
    import transformers

    sets: list[Any] = []
    for text in args.ranks:
        sets.append("all" if text == "all" else sorted({int(r) for r in text.split(",") if r.strip()}))
    acs = [{"off": False, "on": True}[a.strip()] for a in args.ac.split(",") if a.strip()]
    base = {"layers": args.layers, "init": args.init, "seq": args.seq, "batch": args.batch, "world": args.world,
            "gpu": args.gpu}  # fmt: skip
    doc: dict[str, Any] = {
        "what": f"{MODEL}, FSDP2 (fully_shard per decoder layer, then the root; built on {args.init}) over "
        f"{args.world} fake {args.gpu}s, bf16, batch {args.batch}, seq {args.seq}, AdamW, one training step per "
        "rank under fv.simulate; baseline: the same step unsharded on one fake GPU under fv.record, same AC",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpus": os.cpu_count(),
        "config": {
            **base,
            "layers": args.layers or "published (80)",
            "runs": args.runs,
            "ranks": [_label(r) for r in sets],
        },  # fmt: skip
        "results": {},
        "runs": [],
    }
    t0 = time.perf_counter()
    for ranks in sets:
        n = args.world if ranks == "all" else len(ranks)
        runs_here = args.runs if n <= MANY else 1
        key = f"ranks {_label(ranks)}"
        doc["results"][key] = {}
        for ac in acs:
            label = "ac_on" if ac else "ac_off"
            runs = []
            for i in range(runs_here):
                order = ["baseline", "simulate"] if i % 2 == 0 else ["simulate", "baseline"]
                for kind in order:
                    res = _run_child({**base, "ranks": ranks, "kind": kind, "ac": ac}, args.timeout)
                    res["ranks"] = _label(ranks)
                    runs.append(res)
                    what = res.get("error") or (
                        f"{res['seconds_per_rank']:.1f} s/rank, {res['text']}"
                        if kind == "simulate"
                        else f"{res['wall_s']:.1f} s, peak {res['single_gpu']['peak_gib']} GiB"
                    )
                    print(f"[{time.perf_counter() - t0:7.1f} s] {key} {label} {kind}: {what}", file=sys.stderr,
                          flush=True)  # fmt: skip
            doc["results"][key][label] = summarize(runs)
            doc["runs"].extend(runs)
            print(json.dumps({key: {label: doc["results"][key][label]}}, default=str), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
