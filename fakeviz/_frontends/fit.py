"""``fv.fit(model, gpus="8xH100", seq=4096, batch=64)``: the budget search. Which ways of running one training step
of ``batch`` sequences on these GPUs fit, fastest first, each with its plan.

Note: [the budget search]
The knobs :func:`fit` turns all keep the math of the step the same (the same global batch, the same update):

* the layout: one GPU; several GPUs as one model split by a device map (``"balanced"``, data parallel 1); or
  torchtitan's recipe (:mod:`.parallel`) with ``dp_shard`` x ``tp`` (and ``dp_replicate`` x ``dp_shard``, HSDP)
  whose product is the GPU count, ``tp`` dividing the attention heads (what :func:`.parallel.check_tp` accepts);
* the micro-batch with gradient accumulation: ``batch = micro_batch x accumulation x dp`` (``dp``: the
  data-parallel degree), every divisor of ``batch / dp`` a candidate;
* activation checkpointing: none, ``"selective"`` where this fakeviz has it, full (``True``); and offload where
  ``plan`` has ``offload=`` (``"activations"``; ``"cpu"`` for a sharded layout), tried after full checkpointing.

What is recorded is one step at the micro-batch (:func:`fakeviz.plan`, or a :class:`~fakeviz.Simulation` for a
parallel layout); its peak is the configuration's. Assumed: with accumulation, the gradients of the earlier
micro-batches are alive through the next one's forward, which a single recorded step has only from its backward
on; ``df.attrs["assumptions"]`` says so where an accumulation > 1 is in the table.

Pruning, which is sound because a step's every tensor is at least as large at a larger micro-batch with the same
layout and knobs (so its peak is too): per layout and knob, a bisection over the micro-batch candidates finds the
largest that fits (the largest first: when it fits, one recording); a knob that costs time (recomputation,
transfers) is tried only for micro-batches larger than the best of the knobs before it, since at the same or a
smaller micro-batch that configuration is slower with no gain, and not at all once the largest candidate fits.
The table holds, per layout and knob, the largest micro-batch that fits (the others with those knobs are slower
per token); ``df.attrs["tried"]`` lists every recording, fitting or not, and ``df.attrs["recordings"]`` counts
them (a balanced map over several GPUs records twice: a first run places by its peaks). The points of one round
(every layout's next probe) are independent and run on ``executor`` (Note: [points on an executor] in
:mod:`.executors`).

Order (``rank``): with a GPU kind, by the time of one global step (``step_s`` x ``accumulation``), fastest
first; without one (``gpus="80GB"``), by peak, most headroom first.
"""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from .. import models
from .._core.errors import ArgumentError
from .._core.fmt import format_bytes
from .._core.gpus import parse_gpus
from . import executors, offload, planning, steps

__all__ = ["fit"]


def _checkpointing_kinds() -> list[Any]:
    """None, selective (where :func:`.steps.checkpointing` has it), full: fastest first."""
    kinds: list[Any] = [False]
    check = getattr(steps, "check_checkpointing", None)
    if check is not None:
        try:
            check("selective")
            kinds.append("selective")
        except (ValueError, TypeError):
            pass
    return [*kinds, True]


def _offloads(sharded: bool) -> list[str]:
    """The ``offload=`` values :func:`fakeviz.plan` takes in this fakeviz, for this layout."""
    if "offload" not in inspect.signature(planning.plan).parameters:
        return []
    return ["activations", *(["cpu"] if sharded else [])]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layouts(model: Any, n: int, given: Any) -> list[dict[str, int] | None]:
    """None for a device map, or the parallel degrees whose product is ``n`` (Note: [the budget search])."""
    if given is not None:
        out = []
        for lay in given if isinstance(given, (list, tuple)) else [given]:
            if lay in (None, "balanced"):
                out.append(None)
                continue
            if not isinstance(lay, dict) or math.prod(lay.values()) != n:
                raise ArgumentError("parallel", given, f"each layout's degrees multiply to the GPU count ({n})",
                                    f"Give e.g. parallel=[{{'dp_shard': {n}}}], or None to try every layout.")  # fmt: skip
            out.append(dict(lay))
        return out
    out: list[dict[str, int] | None] = [None]
    if n == 1 or isinstance(model, torch.nn.Module):
        return out
    from .parallel import check_tp

    cfg = models.config(model)
    for tp in (t for t in _divisors(n) if t <= 8):
        if tp > 1:
            try:
                check_tp(cfg, tp)
            except ValueError:
                continue
        for rep in _divisors(n // tp):
            shard = n // tp // rep
            if rep > 1 and shard == 1:  # replicate without sharding: plan's recipe would shard over it
                continue
            lay = {k: v for k, v in (("dp_replicate", rep), ("dp_shard", shard), ("tp", tp)) if v > 1}
            out.append(lay or {"dp_shard": 1})
    return out


def _dp(layout: dict[str, int] | None) -> int:
    return 1 if layout is None else layout.get("dp_replicate", 1) * layout.get("dp_shard", 1)


def _name(layout: dict[str, int] | None, n: int) -> str:
    if layout is None:
        return "1 GPU" if n == 1 else f"balanced map over {n} GPUs"
    return " x ".join(f"{k} {v}" for k, v in layout.items())


# ------------------------------------------------------------------------------------------------- points
def _point_kw(p: dict[str, Any]) -> dict[str, Any]:
    kw = {"batch": p["micro_batch"], "seq": p["seq"], "train": p["train"], "dtype": p["dtype"],
          "checkpointing": p["checkpointing"]}  # fmt: skip
    if p["offload"] is not None:
        kw["offload"] = p["offload"]
    if p["layout"] is None:
        kw["optimizer"] = p["optimizer"]
    else:  # the fit's points are what runs at once: each parallel plan's rank classes one after another
        kw["parallel"], kw["executor"] = p["layout"], False
    return kw


def _local(model: Any, caps: Any, built: dict[str, Any]) -> Any:
    def run(p: dict[str, Any]) -> Any:
        kw = _point_kw(p)
        try:
            if p["layout"] is not None:
                return planning.plan(model, gpus=caps, **kw)
            if "b" not in built:  # one build for every device-map point (the dtype is the call's)
                built["b"] = planning.build_for(model, kw["dtype"], caps)
            kw.pop("dtype")
            return planning.plan(model, gpus=caps, _built=built["b"], **kw)
        except Exception as exc:  # noqa: BLE001 - one configuration that cannot run is reported, the search goes on
            return executors.Failed(p, executors.error_text(exc), getattr(exc, "trace", None))

    return run


def _remote(shared: dict[str, Any], p: dict[str, Any]) -> Any:
    """One point in a worker (:mod:`.executors`): a plan, or a parallel plan's ranks as ``.fvz`` bytes."""
    model, caps = shared["model"], shared["gpus"]
    kw = _point_kw(p)
    if p["layout"] is None:
        dtype = kw.pop("dtype")
        built = executors.worker_cache(("fit", repr(model), str(dtype)), lambda: planning.build_for(model, dtype, caps))
        return planning.plan(model, gpus=caps, _built=built, **kw)
    sim = planning.plan(model, gpus=caps, **kw)
    return {"simulation": {k: getattr(sim, k) for k in _SIM_FIELDS}, "settings": sim.settings,
            "traces": {r: t.to_bytes() for r, t in sim.traces.items()}, "stand_ins": dict(sim.stand_ins)}  # fmt: skip


_SIM_FIELDS = ("world_size", "mesh_shape", "mesh_dim_names", "device", "gpu", "gpus_per_node")


def _unpacked(result: Any) -> Any:
    """A parallel point's ranks back as a :class:`~fakeviz.Simulation` (the rest as they came)."""
    if not (isinstance(result, dict) and "traces" in result):
        return result
    from .._trace import Trace
    from .distributed import Simulation

    sim = Simulation(**result["simulation"], ranks=sorted({*result["traces"], *result["stand_ins"]}))
    sim.traces = {r: Trace.load(b) for r, b in result["traces"].items()}
    sim.stand_ins = dict(result["stand_ins"])
    sim.settings = result["settings"]
    return sim


def _peak(p: Any) -> int:
    if isinstance(p, executors.Failed):
        return 0
    gpu = offload.gpu_rows(p.peaks)  # a plan with offload has cpu rows (the host): never the GPU's peak
    return int(gpu.peak.max()) if len(gpu) else 0


# ------------------------------------------------------------------------------------------------ search
@dataclass
class _Search:
    """The bisection of one layout: over ``cands`` (micro-batches, ascending) for knob ``knobs[k]``; ``lo`` the
    index that fits (or the floor set by the knobs before), ``hi`` the index known to fail."""

    layout: dict[str, int] | None
    cands: list[int]
    knobs: list[tuple[Any, str | None]]
    k: int = 0
    lo: int = -1
    hi: int = 0
    first: bool = True
    best: dict[int, Any] = field(default_factory=dict)  # knob index -> (micro-batch index, plan)

    def __post_init__(self) -> None:
        self.hi = len(self.cands)

    def next_probe(self) -> int | None:
        while self.k < len(self.knobs):
            if self.hi - self.lo > 1:
                return self.hi - 1 if self.first else (self.lo + self.hi) // 2
            if self.lo == len(self.cands) - 1:  # the largest fits: later knobs only cost time
                self.k = len(self.knobs)
                return None
            self.k, self.hi, self.first = self.k + 1, len(self.cands), True
        return None

    def record(self, i: int, fits: bool, p: Any) -> None:
        self.first = False
        if fits:
            self.lo = i
            self.best[self.k] = (i, p)
        else:
            self.hi = i


def fit(
    model: Any,
    *,
    gpus: Any,
    seq: int = 2048,
    batch: int = 8,
    train: bool = True,
    dtype: Any = None,
    optimizer: str = "adamw",
    checkpointing: list[Any] | None = None,
    offload: list[Any] | None = None,
    parallel: Any = None,
    executor: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The configurations of one step of ``batch`` sequences of ``seq`` tokens on ``gpus`` that fit, fastest first.

    Args:
        model: a name, folder or config (every layout), or a module (a device map only: it cannot be rebuilt on
            each rank).
        gpus: the GPUs, ``"8xH100"`` (a GPU kind gives step times; ``"8x80GB"`` ranks by headroom).
        seq, batch: the global batch: ``batch`` sequences per optimizer step, split as ``micro_batch x
            accumulation x`` data-parallel ranks.
        train: a training step (``optimizer``); False: a forward of ``batch`` sequences in micro-batches.
        dtype: the parameters' dtype (default: the published one).
        optimizer: with a device map; the parallel layouts run torchtitan's AdamW (another optimizer skips them).
        checkpointing: the checkpointing kinds to try (default: none, ``"selective"`` where available, full).
        offload: the ``offload=`` values to try after full checkpointing (default: those ``plan`` has; ``[]``:
            none).
        parallel: the layouts to try: a list of ``{"dp_shard": 4, "tp": 2}`` dicts (the degrees multiply to the
            GPU count) and ``"balanced"`` (a device map); default: every layout (Note: [the budget search]).
        executor: where the recordings of one round run (:func:`fakeviz.sweep`'s ``executor``).
        progress: a progress line per recording.

    Returns:
        A DataFrame, one row per layout and knobs with the largest micro-batch that fits, ranked (``rank``): layout,
        dp, checkpointing, offload, micro_batch, accumulation, max peak, headroom, step_s (one micro-batch step),
        global_step_s, tokens_per_s. ``attrs``: ``plans`` (each row's :class:`~fakeviz.Plan` or
        :class:`~fakeviz.Simulation`), ``recordings``, ``tried`` (every recording: fits or not, its peak),
        ``message`` (what was tried when nothing fits), ``assumptions``, ``executor``.
    """
    caps = parse_gpus(gpus)
    n = len(caps)
    planning.check_sizes(batch=batch, seq=seq)
    optimizer = steps.check_optimizer(optimizer)
    executors.check(executor)
    models.as_dtype(dtype)  # a dtype it cannot read is refused here, not in every configuration
    layouts = _layouts(model, n, parallel)
    if isinstance(model, torch.nn.Module) and any(lay is not None for lay in layouts):
        raise ArgumentError("parallel", parallel, "a module runs on a device map only (each rank rebuilds the model)",
                            "Give the model's name, folder or config, or parallel=None.")  # fmt: skip
    kinds = [False] if not train else _checkpointing_kinds() if checkpointing is None else list(checkpointing)
    for c in kinds:
        if hasattr(steps, "check_checkpointing"):
            steps.check_checkpointing(c, written="checkpointing")
    skipped: list[str] = []
    searches: list[_Search] = []
    for lay in layouts:
        dp = _dp(lay)
        if batch % dp:
            if parallel is not None:
                raise ArgumentError("batch", batch, f"not divisible by the data-parallel degree {dp} of {lay}",
                                    f"Give a batch that is a multiple of {dp}, or another layout.")  # fmt: skip
            skipped.append(f"{_name(lay, n)}: batch {batch} is not a multiple of its data parallel degree {dp}")
            continue
        if lay is not None and optimizer != "adamw":
            skipped.append(f"{_name(lay, n)}: the parallel recipe runs AdamW, not {optimizer}")
            continue
        offs = _offloads(lay is not None and lay.get("dp_shard", 1) > 1) if offload is None else list(offload)
        offs = offs if train else []
        knobs = [(c, None) for c in kinds] + [(True, o) for o in offs]
        searches.append(_Search(lay, _divisors(batch // dp), knobs))
    if not searches:
        raise ArgumentError("batch", batch, "no layout of these GPUs can split it", "; ".join(skipped))
    base = {"seq": seq, "train": train, "dtype": dtype, "optimizer": optimizer}
    tried: list[dict[str, Any]] = []
    local = _local(model, caps, {})
    with executors.runner(model, executor) as run:
        while True:
            probes = [(s, i) for s in searches if (i := s.next_probe()) is not None]
            if not probes:
                break
            points = [{**base, "layout": s.layout, "micro_batch": s.cands[i], "checkpointing": s.knobs[s.k][0],
                       "offload": s.knobs[s.k][1]} for s, i in probes]  # fmt: skip
            results = run.run(points, local=local, remote=_remote, shared={"model": model, "gpus": caps})
            for (s, i), pt, r in zip(probes, points, results):
                r = _unpacked(r)
                failed = isinstance(r, executors.Failed)
                ok = not failed and bool(r.fits)
                s.record(i, ok, r)
                tried.append({"layout": _name(s.layout, n), "checkpointing": _label(pt["checkpointing"]),
                              "offload": pt["offload"], "micro_batch": pt["micro_batch"], "fits": ok,
                              "max peak": _peak(r), "recordings": _recordings(r), "error": r.error if failed else ""})  # fmt: skip
            if progress:
                print(f"\rfit: {len(tried)} configurations recorded", end="", file=sys.stderr, flush=True)
        where = run.where
    if progress:
        print(file=sys.stderr)
    return _table(searches, tried, skipped, caps, batch, seq, where)


def _recordings(r: Any) -> int:
    if isinstance(r, executors.Failed):
        return 0
    return len(r.traces) if hasattr(r, "traces") else int(getattr(r, "recordings", 1))


def _label(c: Any) -> Any:
    """A checkpointing value as a table shows it (a policy function by its name)."""
    return c if isinstance(c, (bool, str, int)) or c is None else getattr(c, "__name__", str(c))


def _table(searches: list[_Search], tried: list[dict[str, Any]], skipped: list[str], caps: Any, batch: int,
           seq: int, where: str) -> pd.DataFrame:  # fmt: skip
    n = len(caps)
    cap = min(c.bytes for c in caps)
    rows, plans = [], []
    for s in searches:
        for k, (i, p) in sorted(s.best.items()):
            mb = s.cands[i]
            dp = _dp(s.layout)
            acc = batch // dp // mb
            peak = _peak(p)
            sp = p.step_s
            rows.append({"layout": _name(s.layout, n), "dp": dp, "tp": (s.layout or {}).get("tp", 1),
                         "checkpointing": _label(s.knobs[k][0]), "offload": s.knobs[k][1], "micro_batch": mb,
                         "accumulation": acc, "batch": batch, "max peak": peak, "headroom": cap - peak,
                         "step_s": float(sp) if sp is not None else float("nan"),
                         "global_step_s": float(sp) * acc if sp is not None else float("nan"),
                         "tokens_per_s": batch * seq / (float(sp) * acc) if sp else float("nan")})  # fmt: skip
            plans.append(p)
    df = pd.DataFrame(rows, columns=["layout", "dp", "tp", "checkpointing", "offload", "micro_batch", "accumulation",
                                     "batch", "max peak", "headroom", "step_s", "global_step_s", "tokens_per_s"])  # fmt: skip
    timed = len(df) and df.global_step_s.notna().all()
    order = sorted(range(len(df)), key=lambda j: (df.global_step_s.iloc[j], -df.headroom.iloc[j]) if timed
                   else (-df.headroom.iloc[j],))  # fmt: skip
    df = df.iloc[order].reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    tried_df = pd.DataFrame(tried)
    df.attrs["plans"] = planning.Plans([plans[j] for j in order])
    df.attrs["tried"] = tried_df
    df.attrs["recordings"] = int(tried_df.recordings.sum()) if len(tried_df) else 0
    df.attrs["rank_by"] = "global_step_s" if timed else "headroom"
    df.attrs["executor"] = where
    df.attrs["assumptions"] = (["with accumulation > 1, the earlier micro-batches' gradients alive through the next "
                                "forward are not in the recorded step's peak"] if (df.accumulation > 1).any() else [])  # fmt: skip
    if not len(df):
        what = "; ".join(f"{r['layout']} micro-batch {r['micro_batch']} checkpointing={r['checkpointing']}"
                         + (f" offload={r['offload']}" if r["offload"] else "")
                         + (f": failed ({r['error']})" if r["error"] else f": {format_bytes(r['max peak'])}")
                         for r in tried)  # fmt: skip
        df.attrs["message"] = (f"nothing fits {n} x {format_bytes(cap)}: tried {what}"
                               + (f"; skipped {'; '.join(skipped)}" if skipped else ""))  # fmt: skip
    else:
        df.attrs["message"] = ""
    return df
