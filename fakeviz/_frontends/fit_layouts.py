"""The layouts :func:`fakeviz.fit` tries (Note: [the budget search] in :mod:`.fit`): a device map, torchtitan's
``dp_replicate x dp_shard x tp``, pipeline (``pp``), context (``cp``) and expert (``ep``) parallel, and what each
costs or saves that a recording does not say (the pipeline's bubble).

Note: [fit's parallel layouts]
The degrees of a layout multiply to the GPU count (``ep`` borrows its ranks from ``dp_shard``, as in
:func:`fakeviz.plan`, so it does not count); the data-parallel degree ``dp = dp_replicate x dp_shard`` splits the
global batch. Which layouts are tried, each as :func:`fakeviz.plan` accepts it:

* ``pp`` (pipeline, Note: [pipeline plans] in :mod:`.pipeline`): ``P`` dividing the GPU count, at most the number of
  layers, every stage of torchtitan's even split (:func:`.pipeline.split_stages`) holding at least one layer;
  outermost, times ``dp_shard x tp`` (no ``dp_replicate``, ``cp`` or ``ep``: plan does not simulate pp with cp or
  ep). The pipeline's microbatches replace gradient accumulation: ``batch = micro_batch x microbatches x dp``.
  ``1F1B`` (the default schedule) needs ``microbatches >= P``, so only micro-batches up to ``batch / dp / P`` are
  candidates. Offload is refused with pp (plan has none): the search lists it as refused in ``attrs["tried"]``.
* ``cp`` (context parallel, Note: [context parallel plans] in :mod:`.context_expert`): ``C`` dividing ``dp_shard``
  of a ``dp_shard x tp`` layout, where ``seq`` divides by ``2 x C`` and :func:`.context_expert.check_cp` accepts
  the model (no sliding-window attention, no float32 with grouped-query attention). ``{"dp_shard": S / C, "cp": C,
  "tp": T}`` is tried after ``{"dp_shard": S, "tp": T}`` (its *dp twin*), and only where the twin does not fit its
  largest micro-batch with the cheapest knob (or cannot split the batch, or was not tried). Sound because at the
  twin's largest micro-batch ``m`` (``batch / S`` sequences) a cp rank holds the same tokens as a twin rank (``C x
  m`` sequences of ``seq / C`` tokens: cp's largest), the same share of every weight (FSDP2 over ``dp_shard x cp``)
  and in addition the ring's gathered keys and values, and runs the same FLOPs plus the ring's collectives: it is
  neither smaller nor faster, and a smaller cp micro-batch is slower per token. Where the twin needs checkpointing
  or offload, cp's finer split (``seq / C`` tokens per sequence) can fit without it: that is when cp is tried.
* ``ep`` (expert parallel, Note: [expert parallel plans]): for a mixture-of-experts model, ``{"dp_shard": N,
  "ep": E}`` for every ``E >= 2`` that :func:`.context_expert.check_ep` accepts (``E`` divides the experts and
  ``dp_shard``; not with tp, which plan refuses).

Note: [the pipeline bubble in fit]
A pipeline plan records each stage's work: every microbatch's forward and backward on its rank, not the time a rank
waits for its neighbours (the fake process group delivers at once), so :attr:`fakeviz.Simulation.step_s` (the
slowest rank) holds no bubble, and :mod:`.pipeline` reports none. :func:`bubble` is the schedule's formula: with
``P`` stages and ``M`` microbatches, GPipe and 1F1B run ``M + P - 1`` microbatch slots of which ``P - 1`` idle, so
the step takes ``step_s x (M + P - 1) / M`` and the bubble is ``(P - 1) / (M + P - 1)`` of it. Only those two
schedules are offered (``schedules=``); a looped schedule's bubble depends on its stages per rank.

Fewer microbatches of a larger micro-batch make the bubble larger, so the largest micro-batch that fits is not
always the fastest (unlike accumulation): with a GPU kind, the search goes on to the next smaller micro-batches
while the step gets faster and keeps the fastest. That stops at the first slower one, which finds the fastest when
the step time ``(B / m + P - 1) x t(m)`` is unimodal in the micro-batch ``m``: true when one microbatch's time is
affine, ``t(m) = a + b m`` (then it is ``B b + (P - 1) a + B a / m + (P - 1) b m``, convex), the time model's shape
above its per-op floors. Every smaller micro-batch fits (1F1B holds ``P - s`` microbatches on stage ``s`` whatever
their count, each smaller), so no fit is lost, only, outside that shape, a faster point.

GPipe (``schedules=["GPipe"]``) runs every microbatch's forward before any backward: all ``M`` are in flight, so
the saved activations are the rank's whole batch however it is split, and the peak changes with the micro-batch
only by one microbatch's working set (and by the allocator's rounding of more, smaller blocks). Its bisection
takes that peak as non-decreasing in the micro-batch, an assumption ``df.attrs["assumptions"]`` states where a
GPipe row is in the table.

Note: [bounds in fit]
A configuration that cannot be faster than one that fits is never recorded: fit prunes it with a lower bound on its
global step, taken from configurations already recorded (:class:`Work`). Three facts of the time model (Note: [time
model] in :mod:`fakeviz._analysis.timing`) make the bounds hold:

1. a step takes at least the sum of its compute-stream ops' times: the stream runs them one after another
   (``gpu_i = max(gpu_{i-1}, host_i) + est_i``), collectives and FSDP2's copy-ins aside;
2. an op's time, ``max(FLOPs / (peak x c), bytes / (bw x m)) + launch``, per sequence does not grow with the
   micro-batch: its FLOPs and bytes are affine in the micro-batch with nonnegative intercepts (the weights are read
   once per op, the activations scale), so at micro-batch ``m <= m_R`` the ops of ``per`` sequences take at least
   ``per / m_R`` times those of one recorded micro-step at ``m_R`` (the GEMMs' leading dimensions are the weights'
   sizes, never the token count, so the misalignment factor does not change with it);
3. the model's math (:data:`MATH`: GEMMs, attention, elementwise and reduction kernels of the forward and backward)
   is the same ops, in the same dtype (the recipe has no mixed-precision policy), on a rank of every layout with the
   same ``tp`` at the same micro-batch: FSDP2 and HSDP add only copies, casts and collectives, a pipeline stage runs
   its own modules' share (:func:`.pipeline.split_stages`), ``cp`` runs the token-wise ops (all but attention) of
   ``m`` sequences of ``seq / C`` tokens as a dp rank does those of ``m / C`` sequences; checkpointing adds a
   recomputed forward and offload adds copies, so every knob runs at least the math of none.

So, from a recording ``R`` of the dp twin ``{"dp_shard": n / T, "tp": T}`` without knobs at micro-batch ``m_R``
(``w``: its math's seconds per sequence, ``per``: a layout's sequences per data-parallel rank), every configuration of
the same ``T`` at a micro-batch ``m`` with ``m / C <= m_R`` takes at least: ``per x w`` (the twin, HSDP); ``per / C x
w`` of the token-wise ops (cp); ``max over stages of per x w(stage) x (M + P - 1) / M`` (pp: the stages split the
math, the bubble of Note: [the pipeline bubble in fit] on top). And from any recording of a whole model on one rank
(the dp twin with ``T = 1``), with ``g`` its GEMMs' FLOPs per sequence at their dtype's peak and the best fraction
(:data:`fakeviz._analysis.timing.ACHIEVED`): every layout without ``ep`` takes at least ``batch x g / n`` (the busiest
rank runs at least the mean of every GEMM of the batch, split or not; a pipeline's bubble on top), a device map
``batch x g`` (its GPUs run one after another). Expert parallel layouts get no bound (their routing changes the
expert GEMMs). Without a GPU kind there is no time and nothing is pruned by it.

A layout's own recordings bound it too (not a pipeline's, whose microbatch count changes with the micro-batch, nor a
device map's, whose placement does): at a micro-batch ``m <= m_R`` its step runs the same ops as at ``m_R``, each at
least ``m / m_R`` of its time (fact 2, and for collectives and copies likewise: their bytes are affine in the
micro-batch with nonnegative intercepts), and a stream's finishing time grows with its ops' times and scales with
them (``max`` and ``+`` only), so ``step(m) >= m / m_R x step(m_R)``: its global step, ``per / m`` micro-steps, is at
least that recorded at ``m_R``, fitting or not. That holds with the recording's knob, and from a recording without
knobs for any checkpointing (it only adds recomputed ops; an offload knob is bounded by its own recordings only:
``"cpu"`` moves the optimizer off the GPU). A layout whose largest micro-batch is slower than a configuration that
fits is then recorded once (``dp_shard 4 x tp 2`` in the README's 8B call: 3.82 s per global step at micro-batch 16,
against ``dp_shard 8`` at 2, 3.51 s), and a bisection stops where the micro-batches left cannot be faster.

Memory: a configuration whose every tensor is at least as large as one that does not fit does not fit either (the
argument of Note: [the budget search]): HSDP ``dp_replicate x dp_shard`` holds what its twin ``dp_shard`` holds with
larger shards, and cp at micro-batch ``m`` what its twin holds at ``m / C`` plus the ring's keys and values; such
points are marked as not fitting in ``attrs["tried"]`` with why, not recorded.

What is pruned is dominated: it fits no better (the configuration it loses to fits) and is no faster. Its rows are
not in the table; ``attrs["pruned"]`` names each with its bound and the configuration it loses to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._core.errors import ArgumentError

__all__ = ["AXES", "MATH", "SCHEDULES", "Work", "bubble", "check_axes", "check_schedules", "cp_layouts", "dp",
           "layouts", "name", "stage_parts", "work"]  # fmt: skip

#: the axes :func:`fakeviz.fit` combines (``"device_map"``: accelerate-style placement over the GPUs)
AXES = ("device_map", "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
#: the pipeline schedules fit tries (those whose bubble :func:`bubble` knows)
SCHEDULES = ("1F1B", "GPipe")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def dp(layout: dict[str, int] | None) -> int:
    """The data-parallel degree that splits the global batch: ``dp_replicate x dp_shard`` (1 for a device map)."""
    return 1 if layout is None else layout.get("dp_replicate", 1) * layout.get("dp_shard", 1)


def name(layout: dict[str, int] | None, n: int) -> str:
    """A layout as a table shows it: ``"pp 2 x dp_shard 2"``, ``"balanced map over 4 GPUs"``."""
    if layout is None:
        return "1 GPU" if n == 1 else f"balanced map over {n} GPUs"
    return " x ".join(f"{k} {v}" for k, v in layout.items())


def bubble(pp: int, microbatches: int) -> float:
    """The idle share of a GPipe or 1F1B step (Note: [the pipeline bubble in fit]): ``(P - 1) / (M + P - 1)``."""
    return (pp - 1) / (microbatches + pp - 1)


def check_axes(axes: Any) -> tuple[str, ...]:
    """``axes=`` of :func:`fakeviz.fit`: names from :data:`AXES` (None: all), or refused."""
    if axes is None:
        return AXES
    given = [axes] if isinstance(axes, str) else axes
    if not isinstance(given, (list, tuple, set)) or not given or any(a not in AXES for a in given):
        raise ArgumentError("axes", axes, "not a list of parallel axes", f"give names from {', '.join(AXES)}")
    return tuple(a for a in AXES if a in given)


def check_schedules(schedules: Any) -> list[str]:
    """``schedules=`` of :func:`fakeviz.fit`: names from :data:`SCHEDULES`, as torch spells them (None: 1F1B)."""
    if schedules is None:
        return ["1F1B"]
    given = [schedules] if isinstance(schedules, str) else schedules
    low = {s.lower(): s for s in SCHEDULES}
    if not isinstance(given, (list, tuple)) or not given or any(str(s).lower() not in low for s in given):
        raise ArgumentError("schedules", schedules, "fit's step time knows the bubble of 1F1B and GPipe only",
                            "give schedules=['1F1B'] or ['1F1B', 'GPipe']; plan a looped schedule with "
                            "fv.plan(parallel={'pp': P}, schedule=...)")  # fmt: skip
    return list(dict.fromkeys(low[str(s).lower()] for s in given))


def _ok(check: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        check(*args, **kwargs)
    except (ValueError, TypeError):  # ArgumentError is a ValueError
        return False
    return True


def _layers_per_stage_ok(layers: int, pp: int) -> bool:
    from .pipeline import split_stages

    if not 2 <= pp <= layers:
        return False
    return all(any(m.startswith("model.layers.") for m in s) for s in split_stages(layers, pp))


def lay(**degrees: int) -> dict[str, int]:
    """A layout as ``parallel=`` takes it: the degrees above 1 (``{"dp_shard": 1}`` when none is)."""
    return {k: v for k, v in degrees.items() if v > 1} or {"dp_shard": 1}


def layouts(model: Any, n: int, given: Any, axes: tuple[str, ...]) -> list[dict[str, int] | None]:
    """The layouts to search (Note: [fit's parallel layouts]): ``given`` checked (None for a device map, or
    degrees whose product, ``ep`` aside, is ``n``), or every layout of ``axes`` except cp (:func:`cp_layouts`)."""
    import torch

    from .context_expert import with_ep_defaults

    if given is not None:
        out: list[dict[str, int] | None] = []
        for g in given if isinstance(given, (list, tuple)) else [given]:
            if g in (None, "balanced"):
                out.append(None)
                continue
            full = with_ep_defaults(g) if isinstance(g, dict) else g
            if not isinstance(full, dict) or math.prod(v for k, v in full.items() if k != "ep") != n:
                raise ArgumentError("parallel", given, f"each layout's degrees (ep aside) multiply to the GPU count ({n})",
                                    f"Give e.g. parallel=[{{'dp_shard': {n}}}], or None to try every layout.")  # fmt: skip
            out.append(dict(full))
        return out
    out = [None] if "device_map" in axes else []
    if n == 1 or isinstance(model, torch.nn.Module):
        return out or [None]
    from .. import models
    from .context_expert import check_ep
    from .parallel import check_tp

    cfg = models.config(model)
    tps = [t for t in _divisors(n) if t <= 8 and (t == 1 or ("tp" in axes and _ok(check_tp, cfg, t)))]
    reps = "dp_replicate" in axes
    for tp in tps:
        for rep in _divisors(n // tp) if reps else [1]:
            shard = n // tp // rep
            if rep > 1 and shard == 1:  # replicate without sharding: plan's recipe would shard over it
                continue
            if shard > 1 and "dp_shard" not in axes:
                continue
            out.append(lay(dp_replicate=rep, dp_shard=shard, tp=tp))
    if "pp" in axes:
        layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        for pp in (p for p in _divisors(n) if _layers_per_stage_ok(layers, p)):
            for tp in (t for t in tps if (n // pp) % t == 0):
                shard = n // pp // tp
                if shard > 1 and "dp_shard" not in axes:
                    continue
                out.append({"pp": pp, **{k: v for k, v in (("dp_shard", shard), ("tp", tp)) if v > 1}})
    if "ep" in axes and "dp_shard" in axes:
        for ep in _divisors(n)[1:]:
            ep_lay = {"dp_shard": n, "ep": ep}
            if _ok(check_ep, cfg, ep_lay):
                out.append(ep_lay)
    return out


def cp_layouts(model: Any, n: int, seq: int, dtype: Any, train: bool, axes: tuple[str, ...],
               twin_fits: Any) -> tuple[list[dict[str, int]], list[tuple[dict[str, int], str]]]:  # fmt: skip
    """The cp layouts to try (Note: [fit's parallel layouts]), and the others with why they were not:
    ``twin_fits(layout)`` says whether the dp twin fits its largest micro-batch with the cheapest knob."""
    if "cp" not in axes or n == 1 or _is_module(model):
        return [], []
    from .. import models
    from .context_expert import check_cp
    from .parallel import check_tp

    cfg = models.config(model)
    dt = models.as_dtype(dtype)
    out, pruned = [], []
    tps = [t for t in _divisors(n) if t <= 8 and (t == 1 or ("tp" in axes and _ok(check_tp, cfg, t)))]
    for tp in tps:
        shard = n // tp
        for cp in _divisors(shard)[1:]:
            cp_lay = {k: v for k, v in (("dp_shard", shard // cp), ("cp", cp), ("tp", tp)) if v > 1}
            if not _ok(check_cp, cfg, cp, seq=seq, dtype=dt, train=train, new_tokens=0):
                continue
            twin = lay(dp_shard=shard, tp=tp)
            if twin_fits(twin):
                pruned.append((cp_lay, f"{name(cp_lay, n)}: its dp twin {name(twin, n)} fits its largest micro-batch with the "
                              "cheapest knob (cp holds as many tokens per rank, plus the ring's keys and values)"))  # fmt: skip
                continue
            out.append(cp_lay)
    return out, pruned


def _is_module(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.Module)


# ----------------------------------------------------------------------------------------------- bounds
#: the kernel classes of a model's own math (Note: [bounds in fit]): every layout runs them; FSDP2's copies, casts and
#: collectives are "copy", "foreach" and "collective"
MATH = ("gemm", "grouped_gemm", "attention", "attention_backward", "conv", "elementwise", "reduction")


@dataclass(frozen=True)
class Work:
    """One recorded rank's math per sequence of its micro-batch (Note: [bounds in fit]): GPU seconds of its forward
    and backward :data:`MATH` ops on the compute stream, in all (``total``), of attention (``attention``), by part
    (``parts``: ``"model.embed_tokens"``, ``"model.layers.3"``, ``"model.norm"``, ``"lm_head"``; a model's own ops
    outside them in none), and its GEMMs' FLOPs at their dtype's peak and the best GEMM fraction (``gemm``)."""

    micro_batch: int
    total: float
    attention: float
    gemm: float
    parts: dict[str, float] = field(default_factory=dict)


def _part(module: str) -> str:
    tail = module.partition(".")[2]  # below the root module
    bits = tail.split(".")
    return ".".join(bits[:3]) if tail.startswith("model.layers.") else ".".join(bits[:2]) if bits[0] == "model" else bits[0]


def work(trace: Any, gpu: str, micro_batch: int) -> Work | None:
    """The :class:`Work` of one recorded rank's step on ``gpu`` (None: the record stopped at an error)."""
    from .._analysis import timing
    from .._core.schema import PHASES
    from .steps import step_start

    if trace.error:
        return None
    start = step_start(trace)
    f = timing.features(trace).tail(start)
    est, _ = timing.estimate(f, gpu)
    on_comm = f.on_comm if len(f.on_comm) == len(est) else np.zeros(len(est), bool)
    phase = np.asarray(trace.col("phase"))[start:]
    fb = np.isin(phase, [PHASES.index("forward"), PHASES.index("backward")])
    math_ops = fb & ~on_comm & np.isin(f.cls, [timing.CLASSES.index(c) for c in MATH])
    attn = math_ops & np.isin(f.cls, [timing.CLASSES.index(c) for c in ("attention", "attention_backward")])
    gemm = fb & (f.cls == timing.CLASSES.index("gemm"))
    spec = timing.gpu_spec(gpu)
    flop_s = np.maximum(f.flops, 0).astype(np.float64) / (timing.peak_flops(spec, f.dtype, False) * timing.ACHIEVED["gemm"].compute)
    modules = trace.strings("modules")
    codes = np.asarray(trace.col("module"))[start:]
    by_code = np.bincount(codes[math_ops & (codes >= 0)], weights=est[math_ops & (codes >= 0)], minlength=len(modules))
    parts: dict[str, float] = {}
    for code in np.flatnonzero(by_code):
        key = _part(modules[code])
        parts[key] = parts.get(key, 0.0) + float(by_code[code])
    m = float(micro_batch)
    return Work(micro_batch, float(est[math_ops].sum()) / m, float(est[attn].sum()) / m,
                float(flop_s[gemm].sum()) / m, {k: v / m for k, v in parts.items()})  # fmt: skip


def stage_parts(model: Any, pp: int) -> list[list[str]]:
    """The parts (:class:`Work`) each of ``pp`` stages runs: torchtitan's even split (:func:`.pipeline.split_stages`)."""
    from .. import models
    from .pipeline import split_stages

    return split_stages(int(models.config(model).num_hidden_layers), pp)
