"""``fv.fit(model, gpus="8xH100", seq=4096, batch=64)``: the budget search. Which ways of running one training step
of ``batch`` sequences on these GPUs fit, fastest first, each with its plan.

Note: [the budget search]
The knobs :func:`fit` turns all keep the math of the step the same (the same global batch, the same update):

* the layout: one GPU; several GPUs as one model split by a device map (``"balanced"``, data parallel 1); or
  torchtitan's recipe (:mod:`.parallel`) with ``dp_shard`` x ``tp`` (and ``dp_replicate`` x ``dp_shard``, HSDP)
  whose product is the GPU count, ``tp`` dividing the attention heads (what :func:`.parallel.check_tp` accepts);
  pipeline (``pp``, outermost, with ``dp_shard x tp``), context (``cp``, for long sequences) and expert (``ep``,
  for a mixture of experts) parallel: Note: [fit's parallel layouts] in :mod:`.fit_layouts` (``axes=`` narrows
  them);
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

For a pipeline the largest micro-batch that fits is not always the fastest (fewer microbatches, a larger
bubble): with a GPU kind its search goes on to smaller ones while they are faster (Note: [the pipeline bubble in
fit] in :mod:`.fit_layouts`). cp layouts are searched after their dp twins, and only where the twin needs a knob
that costs time (Note: [fit's parallel layouts]); ``df.attrs["pruned"]`` says which were not.
``df.attrs["configurations"]`` counts every configuration the search covers (layouts, knobs, micro-batches),
``df.attrs["points"]`` those recorded.

Order (``rank``): with a GPU kind, by the time of one global step (``step_s`` x ``accumulation``; a pipeline's
``step_s x (M + P - 1) / M``, its bubble included), fastest first; without one (``gpus="80GB"``), by peak, most
headroom first.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from .. import models
from .._core.errors import ArgumentError
from .._core.fmt import format_bytes
from .._core.gpus import parse_gpus
from .._core.limits import divisors
from . import executors, fit_layouts, offload, planning, steps
from .fit_layouts import dp as _dp
from .fit_layouts import name as _name
from .offload import OFFLOADS

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
    return divisors(n)  # O(sqrt n): Note: [size limits]


def _pp(layout: dict[str, int] | None) -> int:
    return 1 if layout is None else layout.get("pp", 1)


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
    if _pp(p["layout"]) > 1:  # the data-parallel rank's batch in microbatches (they replace accumulation)
        per = p["batch"] // _dp(p["layout"])
        kw.update(batch=per, microbatches=per // p["micro_batch"], schedule=p["schedule"])
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
            return planning.plan_point(model, gpus=caps, built=built["b"], **kw)
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
        return planning.plan_point(model, gpus=caps, built=built, **kw)
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


def _headroom(p: Any, cap: int) -> int:
    """The smallest GPU's headroom as the verdict judged it (capacity - judged: Note: [the verdict])."""
    gpu = offload.gpu_rows(p.peaks) if not isinstance(p, executors.Failed) else None
    return int(gpu.headroom.min()) if gpu is not None and len(gpu) else cap


# ------------------------------------------------------------------------------------------------ search
@dataclass
class _Search:
    """The bisection of one layout: over ``cands`` (micro-batches, ascending) for knob ``knobs[k]``; ``lo`` the
    index that fits (or the floor set by the knobs before: ``floor``), ``hi`` the index known to fail. A pipeline
    with a GPU kind (``descend``) then probes smaller micro-batches while its global step gets faster (``down``:
    the next one; Note: [the pipeline bubble in fit])."""

    layout: dict[str, int] | None
    cands: list[int]
    knobs: list[tuple[Any, str | None]]
    per_rank: int  # the data-parallel rank's sequences per step
    schedule: str | None = None
    descend: bool = False
    order: int = 0  # which to search first among equal bounds (Note: [bounds in fit]): the dp twins first
    stages: list[list[str]] | None = None  # a pipeline's parts per stage (fit_layouts.stage_parts)
    k: int = 0
    lo: int = -1
    hi: int = 0
    floor: int = -1
    down: int | None = None
    first: bool = True
    best: dict[int, Any] = field(default_factory=dict)  # knob index -> (micro-batch index, plan)
    dropped: set[int] = field(default_factory=set)  # knobs whose row a bound ended before it was the grid's answer
    pruned: str = ""  # why the rest of the search was not recorded

    def __post_init__(self) -> None:
        self.hi = len(self.cands)

    @property
    def lay(self) -> dict[str, int]:
        return self.layout or {}

    def next_probe(self, lower: Any = None, beat: tuple[float, str] | None = None) -> int | None:
        """The next micro-batch index to record (None: done). ``lower(i)``: a lower bound on the global step at
        candidate ``i`` (Note: [bounds in fit]); ``beat``: the fastest fitting configuration so far (seconds, words):
        a knob none of whose candidates can beat it is not started, and the search ends there; a bisection whose
        micro-batches left cannot beat it ends that knob."""
        while self.k < len(self.knobs):
            if self.first and self.hi == len(self.cands) and self.lo == self.floor and lower and beat:
                rest = range(self.floor + 1, len(self.cands))
                # every later knob's candidates are among these (Note: [the budget search]), its bound its own
                low = min((lower(i, k) for i in rest for k in range(self.k, len(self.knobs))), default=math.inf)
                if low > beat[0]:
                    what = "every configuration" if self.k == 0 else f"checkpointing={_label(self.knobs[self.k][0])}" + (
                        f" offload={self.knobs[self.k][1]}" if self.knobs[self.k][1] else "") + " and later knobs"
                    self.pruned += ("; " if self.pruned else "") + (
                        f"{what} not recorded: at least {low:.3g} s per global step, slower than {beat[1]}")  # fmt: skip
                    self.k = len(self.knobs)
                    return None
            if self.hi - self.lo > 1 and not self.first and lower and beat:
                low = min(lower(i) for i in range(self.lo + 1, self.hi))
                if low > beat[0]:  # the micro-batches left between lo and hi cannot beat it: this knob ends here
                    self.pruned += ("; " if self.pruned else "") + (
                        f"checkpointing={_label(self.knobs[self.k][0])}"
                        + (f" offload={self.knobs[self.k][1]}" if self.knobs[self.k][1] else "")
                        + f" at micro-batches {self.cands[self.lo + 1]}-{self.cands[self.hi - 1]} not recorded: at least "
                        f"{low:.3g} s per global step, slower than {beat[1]}")  # fmt: skip
                    if self.k in self.best and self.global_s(*self.best[self.k]) > beat[0]:
                        self.dropped.add(self.k)  # its answer, a larger micro-batch if any fits, is slower than beat
                    self.hi = self.lo + 1
            if self.hi - self.lo > 1:
                return self.hi - 1 if self.first else (self.lo + self.hi) // 2
            if self.descend and self.lo > self.floor:
                nxt = self.lo - 1 if self.down is None else self.down
                if nxt > self.floor and lower and self.k in self.best:
                    low, row = lower(nxt), self.global_s(*self.best[self.k])
                    if low >= row:  # no smaller micro-batch can beat the row: the descent ends, the row is exact
                        nxt = self.floor
                    elif beat and low > beat[0]:  # the row's answer is unknown but slower than beat: dominated
                        nxt = self.floor
                        if row > beat[0]:
                            self.dropped.add(self.k)
                if nxt > self.floor:
                    self.down = nxt
                    return nxt
            if self.lo == len(self.cands) - 1:  # the largest fits: later knobs only cost time
                self.k = len(self.knobs)
                return None
            self.k, self.hi, self.first, self.floor, self.down = self.k + 1, len(self.cands), True, self.lo, None
        return None

    def record(self, i: int, fits: bool, p: Any) -> None:
        if self.down == i and self.hi - self.lo <= 1:  # a probe below the largest that fits
            if fits and self.global_s(i, p) < self.global_s(*self.best[self.k]):
                self.best[self.k], self.down = (i, p), i - 1
            else:
                self.down = self.floor
            return
        self.first = False
        if fits:
            self.lo = i
            self.best[self.k] = (i, p)
        else:
            self.hi = i

    def steps(self, i: int) -> int:
        """Micro-batches per global step at candidate ``i``: a pipeline's microbatches, else the accumulation."""
        return self.per_rank // self.cands[i]

    def global_s(self, i: int, p: Any) -> float:
        """One global step's seconds (NaN without a GPU kind): the accumulated micro-steps, or the pipeline's
        step with its bubble, ``step_s x (M + P - 1) / M`` (Note: [the pipeline bubble in fit])."""
        sp = p.step_s
        if sp is None:
            return float("nan")
        m = self.steps(i)
        return float(sp) / (1 - fit_layouts.bubble(_pp(self.layout), m)) if _pp(self.layout) > 1 else float(sp) * m


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
    axes: Any = None,
    schedules: Any = None,
    executor: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The configurations of one step of ``batch`` sequences of ``seq`` tokens on ``gpus`` that fit, fastest first.

    Args:
        model: a name, folder or config (every layout), or a module (a device map only: it cannot be rebuilt on
            each rank).
        gpus: the GPUs, ``"8xH100"`` (a GPU kind gives step times; ``"8x80GB"`` ranks by headroom).
        seq, batch: the global batch: ``batch`` sequences per optimizer step, split as ``micro_batch x
            accumulation x`` data-parallel ranks (with ``pp``: ``micro_batch x microbatches x`` data-parallel ranks).
        train: a training step (``optimizer``); False: a forward of ``batch`` sequences in micro-batches.
        dtype: the parameters' dtype (default: the published one).
        optimizer: with a device map; the parallel layouts run torchtitan's AdamW (another optimizer skips them).
        checkpointing: the checkpointing kinds to try (default: none, ``"selective"`` where available, full).
        offload: the ``offload=`` values to try after full checkpointing (default: those ``plan`` has; ``[]``:
            none). Refused with ``pp`` (listed as refused in ``attrs["tried"]``).
        parallel: the layouts to try: a list of ``{"dp_shard": 4, "tp": 2}`` dicts (the degrees, ``ep`` aside,
            multiply to the GPU count; ``{"pp": 2, "dp_shard": 2}``, ``{"cp": 2, "dp_shard": 2}``,
            ``{"dp_shard": 4, "ep": 2}`` as :func:`fakeviz.plan` takes them) and ``"balanced"`` (a device map);
            default: every layout of ``axes`` (Note: [fit's parallel layouts] in :mod:`.fit_layouts`).
        axes: the axes the default layouts combine: a list of ``"device_map"``, ``"dp_replicate"``,
            ``"dp_shard"``, ``"tp"``, ``"pp"``, ``"cp"``, ``"ep"`` (default: all).
        schedules: the pipeline schedules to try: ``["1F1B"]`` (default), ``"GPipe"`` (Note: [the pipeline
            bubble in fit]).
        executor: where the recordings of one round run (:func:`fakeviz.sweep`'s ``executor``).
        progress: a progress line per recording.

    Returns:
        A DataFrame, one row per layout and knobs with the largest micro-batch that fits (a pipeline's: the fastest
        that fits), ranked (``rank``): layout, dp, tp, pp, cp, ep, schedule, checkpointing, offload, micro_batch,
        accumulation, microbatches (a pipeline's), batch, max peak (reserved, without a limit), headroom (the
        smallest GPU's capacity - judged bytes: Note: [the verdict]), step_s (one recorded step),
        bubble (a pipeline's idle share), global_step_s, tokens_per_s. ``attrs``: ``plans`` (each row's
        :class:`~fakeviz.Plan` or :class:`~fakeviz.Simulation`), ``recordings`` (ranks and runs recorded),
        ``points`` (configurations recorded), ``configurations`` (every configuration covered), ``tried`` (every
        point: fits or not, its peak; offload with pp as refused), ``pruned`` (cp layouts not searched, and why),
        ``message`` (what was tried when nothing fits), ``assumptions``, ``executor``.
    """
    caps = parse_gpus(gpus)
    n = len(caps)
    planning.check_sizes(batch=batch, seq=seq)
    models.check_step(model, batch=batch, seq=seq)  # the context and Note: [size limits], before any search
    for o in offload or ():  # each value as plan's offload= names it: an unknown one is refused, never skipped
        if not isinstance(o, str) or o.strip().lower() not in OFFLOADS:
            raise ArgumentError("offload", offload, f"{o!r} is not an offload fakeviz knows",
                                "Give a list of 'activations' and 'cpu', or [] for none.")  # fmt: skip
    optimizer = steps.check_optimizer(optimizer)
    executors.check(executor)
    models.as_dtype(dtype)  # a dtype it cannot read is refused here, not in every configuration
    axes = fit_layouts.check_axes(axes)
    schedules = fit_layouts.check_schedules(schedules)
    layouts = fit_layouts.layouts(model, n, parallel, axes)
    if not layouts:
        raise ArgumentError("axes", list(axes), f"no layout of {n} GPUs and this model uses only these axes",
                            "Add 'dp_shard' or 'device_map' (a pp stage holds at least one layer).")  # fmt: skip
    if isinstance(model, torch.nn.Module) and any(lay is not None for lay in layouts):
        raise ArgumentError("parallel", parallel, "a module runs on a device map only (each rank rebuilds the model)",
                            "Give the model's name, folder or config, or parallel=None.")  # fmt: skip
    if not train and any(_pp(lay) > 1 for lay in layouts) and parallel is not None:
        raise ArgumentError("parallel", parallel, "a pipeline plan records a training step",
                            "Give train=True, or layouts without pp.")  # fmt: skip
    kinds = [False] if not train else _checkpointing_kinds() if checkpointing is None else list(checkpointing)
    for c in kinds:
        if hasattr(steps, "check_checkpointing"):
            steps.check_checkpointing(c, written="checkpointing")
    timed = steps.gpu_kind(caps)[0] is not None
    skipped: list[str] = []
    tried: list[dict[str, Any]] = []

    def searches_for(lay: dict[str, int] | None, strict: bool) -> list[_Search]:
        d = _dp(lay)
        why = ""
        if batch % d:
            why = f"batch {batch} is not a multiple of its data parallel degree {d}"
        elif lay is not None and optimizer != "adamw":
            why = f"the parallel recipe runs AdamW, not {optimizer}"
        elif _pp(lay) > 1 and not train:
            why = "a pipeline plan records a training step"
        if why and strict and batch % d:
            raise ArgumentError("batch", batch, f"not divisible by the data-parallel degree {d} of {lay}",
                                f"Give a batch that is a multiple of {d}, or another layout.")  # fmt: skip
        if why:
            skipped.append(f"{_name(lay, n)}: {why}")
            return []
        per = batch // d
        sharded = lay is not None and lay.get("dp_shard", 1) > 1
        offs = [] if not train else _offloads(sharded) if offload is None else list(offload)
        if _pp(lay) == 1:
            knobs = [(c, None) for c in kinds] + [(True, o) for o in offs]
            return [_Search(lay, _divisors(per), knobs, per)]
        out = []
        for sched in schedules:
            for o in offs:  # Note: [pipeline plans]: plan has no offload with pp; said, not dropped
                tried.append({"layout": _name(lay, n), "schedule": sched, "checkpointing": True, "offload": o,
                              "micro_batch": None, "fits": False, "max peak": 0, "recordings": 0,
                              "error": "refused: fv.plan simulates no offload with pp"})  # fmt: skip
            # 1F1B needs at least P microbatches; GPipe takes any count
            cands = [m for m in _divisors(per) if sched == "GPipe" or per // m >= _pp(lay)]
            if not cands:
                skipped.append(f"{_name(lay, n)} {sched}: {per} sequences per data-parallel rank make fewer than "
                               f"{_pp(lay)} microbatches")  # fmt: skip
                continue
            out.append(_Search(lay, cands, [(c, None) for c in kinds], per, sched, descend=timed))
        return out

    def shaped(found: list[_Search]) -> list[_Search]:
        for s in found:
            s.order = _order(s, n)
            if _pp(s.layout) > 1:
                s.stages = fit_layouts.stage_parts(model, _pp(s.layout))
        return found

    searches = shaped([s for lay in layouts for s in searches_for(lay, parallel is not None)])
    if not searches:
        raise ArgumentError("batch", batch, "no layout of these GPUs can split it", "; ".join(skipped))
    base = {"seq": seq, "train": train, "dtype": dtype, "optimizer": optimizer, "batch": batch}
    bounds = _Bounds(n, batch, steps.gpu_kind(caps)[0], model)
    with executors.runner(model, executor) as run:
        shared, local = {"model": model, "gpus": caps}, _local(model, caps, {})
        _search(searches, base, run, local, shared, tried, n, progress, bounds)
        pruned: list[Any] = []
        if parallel is None:  # cp after its dp twins (Note: [fit's parallel layouts])
            by_layout = {repr(s.layout): s for s in searches}

            def twin_fits(twin: dict[str, int]) -> bool:
                s = by_layout.get(repr(twin))
                return s is not None and 0 in s.best and s.best[0][0] == len(s.cands) - 1

            cp, pruned = fit_layouts.cp_layouts(model, n, seq, dtype, train, axes, twin_fits)
            more = shaped([s for lay in cp for s in searches_for(lay, False)])
            _search(more, base, run, local, shared, tried, n, progress, bounds)
            searches += more
        where = run.where
    if progress:
        print(file=sys.stderr)
    out = _table(searches, tried, skipped, caps, batch, seq, where)
    out.attrs["pruned"] = [why for _, why in pruned] + [f"{_name(s.layout, n)}{' ' + s.schedule if _pp(s.layout) > 1 else ''}: "
                                                        f"{s.pruned}" for s in searches if s.pruned]  # fmt: skip
    out.attrs["pruned"] += [f"{_name(s.layout, n)} checkpointing={_label(s.knobs[k][0])}: its fastest micro-batch is slower "
                            f"than {bounds.beat[1] if bounds.beat else '-'} (Note: [bounds in fit])"
                            for s in searches for k in sorted(s.dropped)]  # fmt: skip
    out.attrs["configurations"] = sum(len(s.cands) * len(s.knobs) for s in searches) + sum(
        len(s.cands) * len(s.knobs) for lay, _ in pruned for s in searches_for(lay, False)
    )
    return out


def _twin(s: _Search, n: int) -> dict[str, int] | None:
    """The dp twin whose recordings bound ``s`` (Note: [bounds in fit]): ``{"dp_shard": n / tp, "tp": tp}``; None for a
    device map or ep."""
    if s.layout is None or s.lay.get("ep", 1) > 1:
        return None
    tp = s.lay.get("tp", 1)
    return fit_layouts.lay(dp_shard=n // tp, tp=tp)


class _Bounds:
    """What the recordings so far prove (Note: [bounds in fit]): the fastest fitting configuration, the math per
    sequence of each tp's dp twin, and which micro-batches failed per layout and knob."""

    def __init__(self, n: int, batch: int, gpu: str | None, model: Any) -> None:
        self.n, self.batch, self.gpu, self.model = n, batch, gpu, model
        self.beat: tuple[float, str] | None = None  # (global step seconds, the configuration in words)
        self.work: dict[int, dict[int, fit_layouts.Work]] = {}  # tp -> the twin's micro-batch -> its math
        self.gemm: float | None = None  # GEMM seconds per sequence of the whole model (a tp 1 recording)
        self.fails: dict[tuple[str, str], int] = {}  # (layout, knob) -> the smallest micro-batch that failed
        self.own: dict[tuple[str, str], dict[int, float]] = {}  # (layout, knob) -> micro-batch -> its global step

    def add(self, s: _Search, i: int, fits: bool, p: Any) -> None:
        knob = repr(s.knobs[s.k])
        if not fits and not isinstance(p, executors.Failed):
            key = (_key(s.layout), knob)
            self.fails[key] = min(self.fails.get(key, s.cands[i]), s.cands[i])
        if self.gpu is None or isinstance(p, executors.Failed):
            return
        g = s.global_s(i, p)
        if g == g and s.layout is not None and _pp(s.layout) == 1:  # fitting or not: a bound at smaller micro-batches
            own = self.own.setdefault((_key(s.layout), repr(s.knobs[s.k])), {})
            own[s.cands[i]] = min(g, own.get(s.cands[i], g))
        if fits and g == g and (self.beat is None or g < self.beat[0]):
            self.beat = (g, f"{_name(s.layout, self.n)} micro-batch {s.cands[i]} checkpointing="
                            f"{_label(s.knobs[s.k][0])}" + (f" offload={s.knobs[s.k][1]}" if s.knobs[s.k][1] else "")
                            + f" ({g:.3g} s), which fits")  # fmt: skip
        if s.knobs[s.k] != (False, None) or s.layout is None or _key(s.layout) != _key(_twin(s, self.n)):
            return
        w = fit_layouts.work(next(iter(p.traces.values())), self.gpu, s.cands[i])
        if w is not None:
            self.work.setdefault(s.lay.get("tp", 1), {})[s.cands[i]] = w
            if s.lay.get("tp", 1) == 1:
                self.gemm = max(self.gemm or 0.0, w.gemm)

    def lower(self, s: _Search, i: int, k: int | None = None) -> float:
        """A lower bound on the global step of ``s`` at candidate ``i`` with knob ``k`` (default: the knob searched;
        0: none known)."""
        if self.gpu is None or s.lay.get("ep", 1) > 1:
            return 0.0
        pp, cp, m = s.lay.get("pp", 1), s.lay.get("cp", 1), s.cands[i]
        bubble = 1.0 / (1.0 - fit_layouts.bubble(pp, s.steps(i))) if pp > 1 else 1.0
        out = 0.0
        if pp == 1 and s.layout is not None:  # its own recordings at micro-batches >= m: its knob's, or without knobs
            knob = s.knobs[s.k if k is None else k]
            for key in {repr(knob), *([repr((False, None))] if knob[1] is None else [])}:
                out = max([out, *(g for m_r, g in self.own.get((_key(s.layout), key), {}).items() if m_r >= m)])
        if self.gemm is not None:
            out = max(out, self.gemm * self.batch / (1 if s.layout is None else self.n) * bubble)
        if s.layout is None:
            return out
        for m_r, w in self.work.get(s.lay.get("tp", 1), {}).items():
            if m / cp > m_r:
                continue
            if pp > 1:
                stages = s.stages or []
                low = max((sum(w.parts.get(part, 0.0) for part in stage) for stage in stages), default=0.0)
                out = max(out, s.per_rank * low * bubble)
            else:
                out = max(out, s.per_rank / cp * (w.total - (w.attention if cp > 1 else 0.0)))
        return out

    def known_fail(self, s: _Search, i: int) -> str:
        """Why ``s`` cannot fit at candidate ``i`` with its knob without recording it (Note: [bounds in fit]), or ""."""
        twin = _twin(s, self.n)
        if twin is None or _key(twin) == _key(s.layout) or s.lay.get("pp", 1) > 1:
            return ""
        cp = s.lay.get("cp", 1)
        if cp == 1 and s.lay.get("dp_replicate", 1) == 1:
            return ""
        failed = self.fails.get((_key(twin), repr(s.knobs[s.k])))
        if failed is None or s.cands[i] < failed * cp:
            return ""
        return (f"does not fit: its dp twin {_name(twin, self.n)} does not at micro-batch {failed}, and it holds at least as "
                f"much{' at micro-batch ' + str(failed * cp) if cp > 1 else ''}")  # fmt: skip


def _key(layout: dict[str, int] | None) -> str:
    return repr(None if layout is None else sorted(layout.items()))


def _order(s: _Search, n: int) -> int:
    """Which search first among equal bounds: the dp twins (their recordings bound the others), HSDP, pp, cp, ep,
    then the device map (it records twice per point)."""
    if s.layout is None:
        return 9
    lay = s.lay
    rank = 0 if _key(s.layout) == _key(_twin(s, n)) else 1 if lay.get("dp_replicate", 1) > 1 else 2 if lay.get("pp", 1) > 1 else \
        3 if lay.get("cp", 1) > 1 else 4
    return rank * 10 + int(math.log2(max(1, lay.get("tp", 1))))


def _search(searches: list[_Search], base: dict[str, Any], run: Any, local: Any, shared: dict[str, Any],
            tried: list[dict[str, Any]], n: int, progress: bool, bounds: _Bounds) -> None:  # fmt: skip
    """Round after round, until no search has a probe: the searches whose best remaining configuration has the lowest
    bound first (Note: [bounds in fit]), as many per round as the executor runs at once; a point that a dp twin's
    failure proves does not fit is marked without a recording."""
    width = max(1, os.cpu_count() or 1) if run.remote else 1
    while True:
        ready = []
        for s in searches:
            lower = (lambda i, k=None, s=s: bounds.lower(s, i, k)) if bounds.gpu else None
            while (i := s.next_probe(lower, bounds.beat)) is not None and (why := bounds.known_fail(s, i)):
                s.record(i, False, None)
                tried.append(_tried(s, i, n, False, None, why))
            if i is None:
                continue
            low = min(bounds.lower(s, j) for j in {i, *range(max(s.lo, s.floor) + 1, s.hi)})
            ready.append((low, s.order, id(s), s, i))
        if not ready:
            return
        probes = [(s, i) for *_, s, i in sorted(ready, key=lambda r: r[:3])[:width]]
        points = [{**base, "layout": s.layout, "micro_batch": s.cands[i], "checkpointing": s.knobs[s.k][0],
                   "offload": s.knobs[s.k][1], "schedule": s.schedule} for s, i in probes]  # fmt: skip
        results = run.run(points, local=local, remote=_remote, shared=shared)
        for (s, i), r in zip(probes, results):
            r = _unpacked(r)
            failed = isinstance(r, executors.Failed)
            ok = not failed and bool(r.fits)
            bounds.add(s, i, ok, r)
            s.record(i, ok, r)
            tried.append(_tried(s, i, n, ok, r, r.error if failed else ""))
        if progress:
            print(f"\rfit: {sum(t['recordings'] > 0 for t in tried)} configurations recorded", end="", file=sys.stderr,
                  flush=True)  # fmt: skip


def _tried(s: _Search, i: int, n: int, ok: bool, r: Any, error: str) -> dict[str, Any]:
    g = s.global_s(i, r) if r is not None and not isinstance(r, executors.Failed) else float("nan")
    return {"layout": _name(s.layout, n), "schedule": s.schedule, "checkpointing": _label(s.knobs[s.k][0]),
            "offload": s.knobs[s.k][1], "micro_batch": s.cands[i], "fits": ok,
            "max peak": _peak(r) if r is not None else 0, "global_step_s": g,
            "recordings": _recordings(r) if r is not None else 0, "error": error}  # fmt: skip


def _recordings(r: Any) -> int:
    if isinstance(r, executors.Failed):
        return 0
    return len(r.traces) if hasattr(r, "traces") else int(getattr(r, "recordings", 1))


def _label(c: Any) -> Any:
    """A checkpointing value as a table shows it (a policy function by its name)."""
    return c if isinstance(c, (bool, str, int)) or c is None else getattr(c, "__name__", str(c))


_COLUMNS = ["layout", "dp", "tp", "pp", "cp", "ep", "schedule", "checkpointing", "offload", "micro_batch",
            "accumulation", "microbatches", "batch", "max peak", "headroom", "step_s", "bubble", "global_step_s",
            "tokens_per_s"]  # fmt: skip


def _table(searches: list[_Search], tried: list[dict[str, Any]], skipped: list[str], caps: Any, batch: int,
           seq: int, where: str) -> pd.DataFrame:  # fmt: skip
    n = len(caps)
    cap = min(c.bytes for c in caps)
    rows, plans = [], []
    for s in searches:
        lay = s.layout or {}
        pp = _pp(s.layout)
        for k, (i, p) in sorted(s.best.items()):
            if k in s.dropped:
                continue
            m = s.steps(i)
            peak = _peak(p)
            sp = p.step_s
            g = s.global_s(i, p)
            rows.append({"layout": _name(s.layout, n), "dp": _dp(s.layout), "tp": lay.get("tp", 1), "pp": pp,
                         "cp": lay.get("cp", 1), "ep": lay.get("ep", 1), "schedule": s.schedule,
                         "checkpointing": _label(s.knobs[k][0]), "offload": s.knobs[k][1], "micro_batch": s.cands[i],
                         "accumulation": 1 if pp > 1 else m, "microbatches": m if pp > 1 else None, "batch": batch,
                         "max peak": peak, "headroom": _headroom(p, cap),
                         "step_s": float(sp) if sp is not None else float("nan"),
                         "bubble": fit_layouts.bubble(pp, m) if pp > 1 else 0.0, "global_step_s": g,
                         "tokens_per_s": batch * seq / g if pd.notna(g) and g else float("nan")})  # fmt: skip
            plans.append(p)
    df = pd.DataFrame(rows, columns=_COLUMNS)
    timed = len(df) and df.global_step_s.notna().all()
    order = sorted(range(len(df)), key=lambda j: (df.global_step_s.iloc[j], -df.headroom.iloc[j]) if timed
                   else (-df.headroom.iloc[j],))  # fmt: skip
    df = df.iloc[order].reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    tried_df = pd.DataFrame(tried)
    df.attrs["plans"] = planning.Plans([plans[j] for j in order])
    df.attrs["tried"] = tried_df
    df.attrs["recordings"] = int(tried_df.recordings.sum()) if len(tried_df) else 0
    df.attrs["points"] = int((tried_df.recordings > 0).sum()) if len(tried_df) else 0
    df.attrs["rank_by"] = "global_step_s" if timed else "headroom"
    df.attrs["executor"] = where
    said = []
    if (df.accumulation > 1).any():
        said.append("with accumulation > 1, the earlier micro-batches' gradients alive through the next forward are "
                    "not in the recorded step's peak")  # fmt: skip
    if timed and (df.pp > 1).any():
        said.append("a pipeline's step time is the recorded stages' slowest times (M + P - 1) / M, the bubble of "
                    "GPipe and 1F1B by their formula: the record has no time waiting for the neighbouring stages")  # fmt: skip
    if (df.schedule == "GPipe").any():
        said.append("GPipe holds every microbatch in flight: its search took the peak as non-decreasing in the "
                    "micro-batch, which the allocator's rounding of many small blocks can break")  # fmt: skip
    df.attrs["assumptions"] = said
    if not len(df):
        what = "; ".join(f"{r['layout']} offload={r['offload']}: {r['error']}" if r["micro_batch"] is None else
                         f"{r['layout']} micro-batch {r['micro_batch']} checkpointing={r['checkpointing']}"
                         + (f" offload={r['offload']}" if r["offload"] else "")
                         + (f": failed ({r['error']})" if r["error"] else f": {format_bytes(r['max peak'])}")
                         for r in tried)  # fmt: skip
        df.attrs["message"] = (f"nothing fits {n} x {format_bytes(cap)}: tried {what}"
                               + (f"; skipped {'; '.join(skipped)}" if skipped else ""))  # fmt: skip
    else:
        df.attrs["message"] = ""
    return df
