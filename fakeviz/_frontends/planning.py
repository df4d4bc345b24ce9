"""What to run on what you have: :func:`plan` (a model placed on N GPUs and run as placed), :func:`sweep`,
:func:`max_batch` / :func:`max_seq` and :func:`compare`.

A plan builds the fake model once (``fakeviz.models.build``: catalog names, folders, configs; or takes a
module), computes a device map, moves each placed module to its fake GPU *before* the recording (the record
starts with the weights in place, as after loading a checkpoint with that map), hooks each placed module so
its inputs move to its device as accelerate's hooks do (every such move is a recorded ``_to_copy``: the
transfers table), and records one step: a forward (inference), ``generate`` of ``new_tokens`` with a KV cache,
or a training step (AdamW by default; ``optimizer=``), of the model quantized and with LoRA adapters when asked
(``quantization=``, ``lora=``: :mod:`.adapters`). The peaks per device, the verdict and the transfers are read from
that record.

Device maps: a dict (module name -> device, transformers' shape), ``"sequential"`` and ``"auto"`` computed by
transformers' own ``device_map`` code (``transformers.integrations.accelerate._get_device_map``, which calls
accelerate's ``get_max_memory``, ``get_balanced_memory`` and ``infer_auto_device_map``) with the GPUs'
capacities as ``max_memory``, and ``"balanced"``: Note: [balanced placement] in
:mod:`fakeviz._analysis.placement`.

Note: [planning's pipeline]
Every plan, and every point of a sweep, a search (max_batch / max_seq) or fv.fit, takes one path, each stage a
function with plain data in and out::

    fv.plan(model, gpus=..., **knobs)                     planning.plan: the public signature, one call
    └ plan_point(model, built=, costs_from=, **knobs)     planning: the entry of the points of a search
      0. check the request  (every knob refused here, before any work; the step's settings dict)
      ├ parallel=  -> parallel.parallel_plan | pipeline.pipeline_plan (pp) -> distributed.simulate -> Simulation
      └ a device map:
        1. resolve the model   plan_stages.resolve_model(model, dtype, quantization, lora, train, gpus) -> Built
                               (skipped when the caller passes the one it built: ``built``, Note: [one fake mode
                               per sweep] in :mod:`.plan_stages`)
           plan_stages.run_plan(built, device_map, gpus, settings, costs_from):
        2. measure costs       measure_costs(built, device_map, gpus, settings, costs_from) -> {unit: bytes}
                               ("balanced" only: a probe recording placed by weights, or ``costs_from``'s record)
        3. choose placement    choose_placement(device_map, model, gpus, costs) -> {module: device}
                               ("balanced": placement.balanced_map, a pure function of the costs)
        4. record the step     record_step(built, device_map, gpus, settings) -> Trace (steps.run inside)
        5. read the answers    Plan(model, gpus, device_map, trace, settings): peaks, verdict, transfers, speed,
                               each computed from the trace when read

sweep / max_batch / max_seq resolve the model once per build key (dtype, quantization, lora), then call
plan_point per point, here or on an executor (:mod:`.executors`: the worker resolves its own, once); a search's
probes after the first reuse the last probe's record as their costs (stage 2 without a recording). fv.fit
(:mod:`.fit`) calls plan_point the same way. Where a new knob goes: its argument check in stage 0
(:func:`plan_point`), a step setting in ``settings`` and :func:`.plan_stages.record_step` (offload, optimizer,
checkpointing do so), a placement kind in :func:`.plan_stages.choose_placement` (with its costs in
:func:`.plan_stages.measure_costs` if it needs any), an answer as a property of :class:`Plan`; a knob of the
parallel path in the recipe its axis runs (:mod:`.parallel`, :mod:`.pipeline`, :mod:`.context_expert`).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import itertools
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .. import models
from .._core.errors import ArgumentError
from .._core.gpus import Capacity, parse_gpus
from .._engine.arguments import as_dtype
from . import adapters, executors, plan_stages, ranking, steps
from . import offload as offloading
from .distributed import Simulation
from .plan_stages import MAPS, Built, Plan, accelerate_map, machine, own_mode, resolve_model
from .progress import progress_bar

__all__ = [
    "MAPS", "Plan", "Plans", "accelerate_map", "build_for", "check_sizes", "compare", "max_batch", "max_seq", "plan",
    "plan_point", "sweep",
]  # fmt: skip

# The names the points of a sweep build with and the tests reach for: ``_build`` is looked up here at every build
# (a test counts the builds of a sweep by replacing it), ``_machine`` / ``_own_mode`` are the stages' helpers.
_build = resolve_model
_machine = machine
_own_mode = own_mode


# ---------------------------------------------------------------------------------------------- plan
def plan(
    model: Any,
    *,
    gpus: Any,
    device_map: str | dict[str, Any] = "balanced",
    batch: int = 1,
    seq: int = 2048,
    train: bool = False,
    new_tokens: int = 0,
    dtype: Any = None,
    checkpointing: Any = False,
    quantization: Any = None,
    lora: Any = None,
    optimizer: str = "adamw",
    offload: Any = None,
    parallel: dict[str, int] | None = None,
    ranks: Any = "auto",
    microbatches: int | None = None,
    schedule: str | None = None,
    stages: list[list[str]] | None = None,
    stages_per_rank: int | None = None,
    executor: Any = None,
) -> Plan | Simulation:
    """Place ``model`` on ``gpus`` and run it as placed under fake tensors.

    Args:
        model: anything :func:`fakeviz.models.build` accepts (``"meta-llama/Llama-3.1-8B"``, a folder, a
            config) or a module.
        gpus: ``"4xH100"``, a GPU name or size, or a list of them (``["80GB", "40GiB"]``), in device order.
        device_map: ``"balanced"`` (fakeviz: even peaks including activations and KV cache, Note: [balanced
            placement]), ``"auto"`` / ``"sequential"`` (what transformers computes with accelerate's
            functions for these capacities), or a dict ``{module name: device}`` (ints, ``"cuda:N"``).
        batch, seq: the inputs (``fakeviz.models.inputs``).
        train: one training step with ``optimizer`` (forward with labels, backward, ``step``).
        new_tokens: with ``train=False``, ``generate`` that many tokens after the prefill (KV cache).
        dtype: parameter dtype (default: the published one).
        checkpointing: activation checkpointing of the repeated blocks (no code change needed): ``True`` /
            ``"full"``, ``"selective"`` (torchtitan's op-level SAC), an int n (every n-th block), or a policy
            function for ``create_selective_checkpoint_contexts`` (Note: [selective checkpointing] in :mod:`.steps`).
        quantization: the weights quantized by their library's own code (``"nf4"``, ``"fp4"``, ``"int8"``
            bitsandbytes; ``"int4"``, ``"fp8"`` torchao; or a ``BitsAndBytesConfig`` / torchao config:
            :func:`fakeviz.models.build`'s ``quantization=``). Training a quantized model trains adapters: give
            ``lora`` too (QLoRA).
        lora: LoRA adapters by peft's ``get_peft_model``: a rank (``16``: ``target_modules="all-linear"``) or a
            ``peft.LoraConfig`` (``use_dora=True`` for DoRA); with ``quantization``, after
            ``prepare_model_for_kbit_training`` (Note: [adapters in plans] in :mod:`fakeviz._frontends.adapters`).
            Gradients and optimizer state are then the adapters' only.
        optimizer: with ``train``: ``"adamw"``, ``"adamw_fused"``, ``"adam"``, ``"adafactor"``, ``"adamw8bit"``,
            ``"paged_adamw8bit"`` (bitsandbytes), ``"adamw8bit_ao"``, ``"adamw4bit_ao"`` (torchao), ``"sgd"`` or
            ``"none"`` (Note: [optimizer names] in :mod:`fakeviz._frontends.steps`).
        offload: ``"cpu"`` (with ``parallel`` and ``dp_shard``: FSDP2's ``CPUOffloadPolicy``, sharded parameters,
            gradients and optimizer state in host memory) or ``"activations"`` (``save_on_cpu``: saved activations in
            host memory); a ``cpu`` row in the peaks (Note: [offload] in :mod:`fakeviz._frontends.offload`).
        parallel: torch.distributed over ``gpus`` instead of a device map: degrees per axis, ``{"dp_shard": 8,
            "tp": 8}`` (``dp_replicate`` x ``dp_shard`` is HSDP), for a model given by name, folder or config.
            Every rank runs torchtitan's recipe (FSDP2 ``fully_shard`` per block, tensor parallel by the model's
            own plan) under the fake process group: Note: [parallel plans] in :mod:`fakeviz._frontends.parallel`.
            ``batch`` is then each data-parallel rank's batch. ``cp``: context parallel (torch's ring attention
            over the sequence split ``cp`` ways), ``ep``: expert parallel for a mixture of experts (its ranks
            borrowed from ``dp_shard``; all-to-all dispatch): Note: [context parallel plans], Note: [expert
            parallel plans] in :mod:`fakeviz._frontends.context_expert`.
        ranks: with ``parallel``: ``"auto"`` (one rank per shard layout; identical ranks stand in), ``"all"``,
            or a list.
        executor: with ``parallel`` and ``ranks="auto"``: where the first rank of each shard layout after rank 0
            is recorded (:func:`sweep`'s ``executor``: they are independent; by default here, one after another).
        microbatches, schedule, stages, stages_per_rank: with ``parallel={"pp": P, ...}`` (pipeline stages through
            ``torch.distributed.pipelining``, Note: [pipeline plans] in :mod:`fakeviz._frontends.pipeline`): the
            microbatches ``batch`` splits into (default ``batch``: torchtitan's microbatch size 1), the schedule
            by torch's name (``"1F1B"`` default, ``"GPipe"``, ``"Interleaved1F1B"``, ``"ZBVZeroBubble"``, ...),
            the module names of each stage (default: torchtitan's even split) and the stages per rank of a
            looped schedule (default 2).

    Returns:
        A :class:`Plan`; with ``parallel``, a :class:`~fakeviz.Simulation` (per-rank peaks, classes, verdict).
        The stages it runs: Note: [planning's pipeline].
    """
    return plan_point(**locals())  # every argument as given: this signature is the one list of plan's parameters


_SIGNATURE = inspect.signature(plan)


def plan_point(model: Any, *, built: Built | None = None, costs_from: Plan | None = None,
               **knobs: Any) -> Plan | Simulation:  # fmt: skip
    """:func:`plan` for the points of a sweep, a search or :func:`fakeviz.fit` (Note: [planning's pipeline]):
    ``knobs`` are :func:`plan`'s arguments (its defaults for those not given; a name it does not take is a
    ``TypeError`` as there); ``built``: the model the caller resolved once (:func:`build_for`, stage 1 skipped);
    ``costs_from``: an earlier plan of the same model and step whose record gives a ``"balanced"`` map its costs
    (stage 2 without a probe recording)."""
    a = _checked(model, knobs)
    if a["parallel"] is not None:
        if built is not None or costs_from is not None:  # every rank builds its own shard: nothing to reuse
            raise ValueError("plan_point: built= / costs_from= are for a device map; parallel= builds per rank")
        return _parallel_plan(a)
    batch, seq, train, new_tokens, device_map = (a[k] for k in ("batch", "seq", "train", "new_tokens", "device_map"))
    caps = parse_gpus(a["gpus"])
    optimizer, checkpointing, offload = a["optimizer"], a["checkpointing"], a["offload"]
    if built is None:  # 1. resolve the model
        built = _build(model, as_dtype(a["dtype"]), quantization=a["quantization"], lora=a["lora"], train=train,
                       gpus=caps)  # fmt: skip
    mod = built.model
    models.check_seq(mod, seq, new_tokens)  # a sequence past the context is refused, never shortened
    settings = {"batch": batch, "seq": seq, "train": train, "new_tokens": new_tokens, "checkpointing": checkpointing,
                "dtype": built.dtype or str(next(mod.parameters()).dtype), "quantization": built.quantization,
                "lora": built.lora, "optimizer": optimizer if train else None, "offload": offload,
                "device_map_kind": device_map if isinstance(device_map, str) else "dict"}  # fmt: skip
    return plan_stages.run_plan(built, device_map, caps, settings, costs_from)  # 2. to 5.


_PIPELINE_KNOBS = ("microbatches", "schedule", "stages", "stages_per_rank")


def _checked(model: Any, knobs: dict[str, Any]) -> dict[str, Any]:
    """Stage 0 of :func:`plan_point`: ``knobs`` bound to :func:`plan`'s signature (its defaults for the rest), and
    every value that can be refused without the model refused (:func:`sweep` calls it for each point of its grid
    before any point runs: a value of the user's is refused, never a failed row; Note: [failing points] in
    :mod:`.executors`). Returns the arguments, the step's knobs in their checked form."""
    args = _SIGNATURE.bind(model, **knobs)
    args.apply_defaults()
    a = args.arguments
    optimizer = steps.check_optimizer(a["optimizer"])
    checkpointing = steps.check_checkpointing(a["checkpointing"])  # its label, in settings["checkpointing"]
    offload = offloading.check_offload(a["offload"], parallel=a["parallel"], train=a["train"])
    adapters.lora_config(a["lora"])  # a bad rank or config: refused before any work
    executors.check(a["executor"])
    a = {**a, "optimizer": optimizer, "checkpointing": checkpointing, "offload": offload}
    batch, seq, train, new_tokens, device_map = (a[k] for k in ("batch", "seq", "train", "new_tokens", "device_map"))
    check_sizes(batch=batch, seq=seq, new_tokens=new_tokens)
    if train and new_tokens:
        raise ValueError("train=True and new_tokens: a plan is a training step or a generation, not both")
    if a["parallel"] is not None:
        return a
    if any(a[k] is not None for k in _PIPELINE_KNOBS):
        raise ValueError(
            "microbatches / schedule / stages / stages_per_rank are for a pipeline: give parallel={'pp': P}"
        )
    if isinstance(device_map, str) and device_map not in MAPS:
        raise ValueError(f"device_map={device_map!r}: use one of {', '.join(map(repr, MAPS))}, or a dict")
    if isinstance(device_map, dict):
        _check_map_devices(device_map, len(parse_gpus(a["gpus"])))
    adapters.check_finetune(train, a["quantization"], a["lora"])
    return a


def _check_map_devices(device_map: dict[str, Any], n: int) -> None:
    """A device map's devices are these GPUs (0..n-1 or ``"cuda:i"``), ``"cpu"`` or ``"disk"``: refused otherwise."""
    for name, v in device_map.items():
        text = str(v) if not isinstance(v, (int, bool)) else ""
        index = v if isinstance(v, int) and not isinstance(v, bool) else (
            int(text[5:]) if text.startswith("cuda:") and text[5:].isdigit() else None)  # fmt: skip
        if text in ("cpu", "disk") or (index is not None and 0 <= index < n):
            continue
        raise ArgumentError("device_map", device_map, f"{name!r} is put on {v!r}, and the plan has GPUs 0 to {n - 1}",
                            f"Give each module a GPU index below {n}, 'cpu' or 'disk' (e.g. {{{name!r}: 0}}).")  # fmt: skip


def _parallel_plan(a: dict[str, Any]) -> Simulation:
    """The parallel path of :func:`plan_point` (``a``: plan's arguments, the step's knobs already checked): the
    recipe of the axes asked for, every rank simulated (Note: [parallel plans] in :mod:`.parallel`); sizes and
    train-with-new-tokens already refused by :func:`_checked`."""
    from .parallel import parallel_plan

    parallel, batch, seq, train, new_tokens = (a[k] for k in ("parallel", "batch", "seq", "train", "new_tokens"))
    adapters.check_parallel(quantization=a["quantization"], lora=a["lora"], optimizer=a["optimizer"])
    if a["device_map"] != "balanced":
        raise ValueError("parallel= and device_map= are two ways to use the GPUs: give one of them")
    step = {"gpus": a["gpus"], "parallel": parallel, "batch": batch, "seq": seq, "train": train,
            "new_tokens": new_tokens, "dtype": a["dtype"], "checkpointing": a["checkpointing"], "ranks": a["ranks"]}  # fmt: skip
    if isinstance(parallel, dict) and parallel.get("pp", 1) != 1:  # Note: [pipeline plans]
        from .pipeline import pipeline_plan

        return pipeline_plan(a["model"], **step, **{k: a[k] for k in _PIPELINE_KNOBS if a[k] is not None})
    if any(a[k] is not None for k in _PIPELINE_KNOBS):
        raise ValueError(f"microbatches / schedule / stages are for a pipeline: give parallel={{'pp': P, ...}} "
                         f"with P >= 2 (parallel={parallel!r})")  # fmt: skip
    return parallel_plan(a["model"], **step, offload=a["offload"], executor=a["executor"])


def build_for(model: Any, dtype: Any, gpus: list[Capacity]) -> Built:
    """The fake model that every device-map point of a search (:func:`fakeviz.fit`) re-runs, built once (stage 1
    of Note: [planning's pipeline]; pass it to :func:`plan_point` as ``built``)."""
    return _build(model, as_dtype(dtype), gpus=gpus)


def check_sizes(**sizes: Any) -> None:
    """``batch`` and ``seq`` whole numbers >= 1, ``new_tokens`` >= 0: refused otherwise, never rounded."""
    for name, v in sizes.items():
        low = 0 if name == "new_tokens" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ArgumentError(name, v, f"{name} is a whole number of at least {low}",
                                f"Give e.g. {name}={max(low, 1) if name != 'seq' else 2048}.")  # fmt: skip


# --------------------------------------------------------------------------------------------- sweep
_EXAMPLE = {"batch": [1, 2, 4], "seq": [2048, 8192], "dtype": ["bf16", "fp32"], "checkpointing": [False, True],
            "train": [False, True], "new_tokens": [0, 256], "quantization": [None, "nf4"], "lora": [None, 16],
            "optimizer": ["adamw", "adamw8bit"], "offload": [None, "activations"]}  # fmt: skip
_BUILT_BY = ("dtype", "quantization", "lora")  # the axes a point's model depends on: outermost, one build per value


def _build_point(model: Any, c: dict[str, Any], caps: list[Capacity]) -> Built:
    q, lora = c.get("quantization"), c.get("lora")
    extra: dict[str, Any] = {k: v for k, v in (("quantization", q), ("lora", lora)) if v is not None}
    if q is not None:
        extra["gpus"] = caps  # torch.cuda answers as them while quantizing
    if q is not None and adapters.lora_config(lora) is not None and c.get("train"):
        extra["train"] = True  # QLoRA's preparation for training
    return _build(model, as_dtype(c.get("dtype")), **extra)


def _remote_point(shared: dict[str, Any], c: dict[str, Any]) -> Plan:
    """One point of a sweep in a worker process (:mod:`.executors`): the model built once per build key."""
    model, caps = shared["model"], shared["gpus"]
    built = executors.worker_cache((repr(model), adapters.build_key(c)), lambda: _build_point(model, c, caps))
    return plan_point(model, gpus=caps, device_map=shared["device_map"], built=built,
                      **{k: v for k, v in c.items() if k != "dtype"})  # fmt: skip


def sweep(model: Any, *, gpus: Any, device_map: str | dict[str, Any] = "balanced", progress: bool = True,
          rank_by: str | None = "auto", executor: Any = None, **axes: Any) -> pd.DataFrame:  # fmt: skip
    """One :func:`plan` per combination of ``axes`` (``batch=[1, 2, 4]``, ``seq=[2048, 8192]``,
    ``dtype=[...]``, ``checkpointing=[False, True]``, ``train=[...]``, ``new_tokens=[...]``,
    ``quantization=[None, "nf4"]``, ``lora=[None, 16]``, ``optimizer=["adamw", "adamw8bit"]``; a scalar is one
    value): a DataFrame, one row per combination, with the peak of every GPU and its bytes per kind, the
    verdict and where it first fails, and the estimated ``step_s``, ``tokens_per_s`` (all GPUs) and ``mfu``
    (NaN without a GPU kind: ``gpus="80GB"``). The fake model is built once per dtype, quantization and adapter;
    each later point re-runs the step. ``quantization`` and ``lora`` columns hold their labels (``"nf4"``,
    ``"LoRA r=16"``; None without); ``dtype`` stays the compute dtype. The plans are on ``df.attrs["plans"]``, in
    the rows' order.

    Ranking (``rank_by``): the configurations that fit come first, fastest first, numbered in a ``rank`` column;
    those that do not fit follow in the grid's order. ``"auto"`` (the default) ranks by estimated step time where
    the GPU kind is known: ``step_s`` when every point runs the same tokens per step, else time per token
    (``tokens_per_s``, highest first: a step of batch 1 is shorter than one of batch 8 but does less); without a GPU
    kind the grid's order is kept. ``"step_s"``, ``"tokens_per_s"`` or ``"mfu"`` rank by that figure;
    ``None`` keeps the grid's order.

    ``executor``: where the points run (Note: [points on an executor] in :mod:`fakeviz._frontends.executors`):
    None (the default; False is the same), one after another in this process; ``"processes"``, a process pool over
    this machine's cores once a point is slow enough to pay for it (Note: [the default executor]; call it under
    ``if __name__ == "__main__":`` in a script, since each worker imports the script: Note: [the main guard]); or any
    ``concurrent.futures.Executor`` (a dask ``Client(...).get_executor()``). A point that fails there has ``fits`` False and its error in ``error`` and
    ``first fails`` (its entry in ``df.attrs["plans"]`` is an :class:`~fakeviz._frontends.executors.Failed`);
    ``df.attrs["executor"]`` says where the points ran."""
    ranking.check_rank_by(rank_by)
    executors.check(executor)
    known = set(_EXAMPLE)
    for k in sorted(set(axes) - known):
        near = tuple(difflib.get_close_matches(k, sorted(known), n=3))
        raise ArgumentError(k, axes[k], "sweep has no such axis",
                            (f"Did you mean {near[0]!r}? " if near else "") + f"The axes are {', '.join(sorted(known))}.",
                            suggestions=near)  # fmt: skip
    grid = {k: (list(v) if isinstance(v, (list, tuple, range)) else [v]) for k, v in axes.items()}
    for k, v in grid.items():
        if not v:  # an empty axis makes no point at all: an empty frame would read as "nothing fits"
            raise ArgumentError(k, axes[k], "an empty axis: a sweep over it has no point to run",
                                f"Give {k} at least one value, e.g. {k}={_EXAMPLE.get(k, [1])!r}.")  # fmt: skip
    for v in grid.get("optimizer", []):  # every value checked before any recording
        steps.check_optimizer(v)
    for v in grid.get("checkpointing", []):
        steps.check_checkpointing(v)
    for v in grid.get("lora", []):
        adapters.lora_config(v)
    for v in grid.get("quantization", []):
        adapters.resolve_quantization(v)
    # outermost: one build per dtype, quantization and adapter (and train: QLoRA prepares for training only)
    outer = [k for k in (*_BUILT_BY, "train") if k in grid and (k != "train" or "quantization" in grid)]
    grid = {**{k: grid.pop(k) for k in outer}, **grid}
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    caps = parse_gpus(gpus)
    for c in combos:  # every point's values, before any point runs (Note: [failing points] in .executors)
        _checked(model, {"gpus": caps, "device_map": device_map, **{k: v for k, v in c.items() if k != "dtype"}})
    built: dict[Any, Built] = {}
    if any(k in grid for k in ("seq", "new_tokens")):  # every point's sequence, before any recording
        built[adapters.build_key(combos[0])] = first = _build_point(model, combos[0], caps)
        for c in combos:
            models.check_seq(first.model, c.get("seq", 2048), c.get("new_tokens", 0))
    bar = progress_bar(len(combos)) if progress else None

    def local(c: dict[str, Any]) -> Plan:
        key = adapters.build_key(c)
        if key not in built:
            built.clear()  # one model alive at a time
            built[key] = _build_point(model, c, caps)
        return plan_point(model, gpus=caps, device_map=device_map, built=built[key],
                          **{k: v for k, v in c.items() if k != "dtype"})  # fmt: skip

    def arrived(i: int, p: Any) -> None:
        # the row's analysis (verdict, time model) as each point arrives, not after the last: with a pool this
        # process then takes fewer points from the shared queue, and the work stays balanced (measured: the rows
        # after the last point were about 0.2 s each of a 70B training point's 4 s, on this process alone)
        if not isinstance(p, executors.Failed):
            with contextlib.suppress(Exception):  # a failure here is raised again where the row is made
                p.verdict, p.speed  # noqa: B018 - cached properties: computed and kept
        if bar is not None:
            bar(i, p)

    with executors.runner(model, executor) as run:
        plans = run.run(combos, local=local, remote=_remote_point, progress=arrived,
                        shared={"model": model, "gpus": caps, "device_map": device_map})  # fmt: skip
    rows = [
        executors.failed_row(c, p) if isinstance(p, executors.Failed) else _row(p, c) for p, c in zip(plans, combos)
    ]
    ok = [i for i, p in enumerate(plans) if not isinstance(p, executors.Failed)]
    order, by = ranking.ranking([plans[i].speed for i in ok], [plans[i].fits for i in ok], rank_by)
    order = [ok[i] for i in order] + [i for i in range(len(plans)) if i not in set(ok)]
    df = pd.DataFrame(rows)
    if by is not None:
        ranks = pd.array([pd.NA] * len(df), dtype="Int64")
        for k, i in enumerate(order[: ranking.ranked_count(plans, order, by)]):
            ranks[i] = k + 1
        df["rank"] = ranks
        df = df.iloc[order].reset_index(drop=True)
        plans = [plans[i] for i in order]
    df.attrs["plans"] = Plans(plans)
    df.attrs["rank_by"] = by
    df.attrs["executor"] = run.where
    return df


class Plans(list):  # type: ignore[type-arg]
    """The plans of a sweep (and of :func:`fakeviz.fit`), on ``df.attrs["plans"]``: pandas deep-copies ``attrs``
    into every frame it derives (a column, a filter), and a copy of each plan's model and trace would cost as much
    as the sweep."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Plans:
        return self


def _row(p: Plan, combo: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {k: (str(v) if k == "dtype" else p.settings[k] if k in ("quantization", "lora", "checkpointing")
                               else steps.check_optimizer(v) if k == "optimizer" else v) for k, v in combo.items()}  # fmt: skip
    pk = p.peaks
    for r in pk.itertuples(index=False):
        row[f"{r.device} peak"] = r.peak
        for kind in ("weights", "gradients", "optimizer", "kv_cache", "activations", "temporaries"):
            row[f"{r.device} {kind}"] = getattr(r, kind)
    row["max peak"] = int(offloading.gpu_rows(pk).peak.max()) if len(pk) else 0  # the GPUs' (not a host row's)
    row["fits"] = p.fits
    oom = p.first_oom
    row["first fails"] = f"{oom['device']}: {oom['where']}" if oom else ("" if p.fits else p.fit_text)
    sp = p.speed
    for k in ("step_s", "tokens_per_s", "mfu"):
        v = getattr(sp, k)
        row[k] = float(v) if v is not None else float("nan")
    return row


# ------------------------------------------------------------------------------------ max_batch / seq
@dataclass
class Largest:
    """The largest value of ``axis`` that fits: ``value``, the ``plan`` at it, the plan just above it that fails
    (``failing``: its ``first_oom`` names the device, op and module), and ``recordings`` made."""

    axis: str
    value: int
    plan: Plan | None
    failing: Plan | None
    recordings: int
    tried: list[tuple[int, bool]]
    bound: str = ""  # what stopped the search other than memory ("the model's context (...)"), if anything

    def __repr__(self) -> str:
        above = self.failing.first_oom if self.failing is not None else None
        where = f"; {self.value + 1} fails on {above['device']}: {above['where']}" if above else ""
        if self.bound:
            where = f"; it fits, and {self.bound} allows no longer"
        return f"Largest {self.axis}={self.value} ({self.recordings} recordings){where}"


def _remote_probe(shared: dict[str, Any], v: int) -> Plan:
    """One probe of :func:`max_batch` / :func:`max_seq` in a worker (:mod:`.executors`), built once per search."""
    model, caps, kw = shared["model"], shared["gpus"], dict(shared["kw"])
    built = executors.worker_cache(("largest", repr(model), repr(shared["build"])),
                                   lambda: _build(model, gpus=caps, **shared["build"]))  # fmt: skip
    return plan_point(model, gpus=caps, built=built, **{kw.pop("axis"): v}, **kw)


def _largest(axis: str, model: Any, gpus: Any, limit: int, executor: Any = None, **kw: Any) -> Largest:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ArgumentError("limit", limit, f"the largest {axis} to try is a whole number of at least 1",
                            f"Give e.g. limit={4096 if axis == 'batch' else 1 << 20}.")  # fmt: skip
    caps = parse_gpus(gpus)
    executors.check(executor)
    kw["optimizer"] = steps.check_optimizer(kw.get("optimizer", "adamw"))
    adapters.check_finetune(bool(kw.get("train")), kw.get("quantization"), kw.get("lora"))
    build = {"dtype": as_dtype(kw.pop("dtype", None)), "quantization": kw.get("quantization"), "lora": kw.get("lora"),
             "train": bool(kw.get("train"))}  # fmt: skip
    built = _build(model, **build, gpus=caps)
    bound = ""
    if axis == "seq":  # never past the model's context (models.check_seq would refuse it)
        ctx = models.context(built.model)
        if ctx is not None and ctx[0] - kw.get("new_tokens", 0) < limit:
            limit, bound = ctx[0] - kw.get("new_tokens", 0), f"the model's context ({ctx[1]})"
        if limit < 1:
            models.check_seq(built.model, 1, kw.get("new_tokens", 0))
    tried: list[tuple[int, bool]] = []
    plans: dict[int, Plan] = {}
    recordings = 0
    last: list[Plan | None] = [None]

    def local(v: int) -> Plan:  # one probe at a time reuses the last one's placement costs
        return plan_point(model, gpus=caps, built=built, costs_from=last[0] if alone[0] else None, **{axis: v}, **kw)

    def probe(values: list[int]) -> list[bool]:
        nonlocal recordings
        alone[0] = len(values) == 1
        shared = {"model": model, "gpus": caps, "build": build, "kw": {**kw, "axis": axis}}
        results = run.run(values, local=local, remote=_remote_probe, shared=shared, expected=limit.bit_length())
        for p in results:  # a probe that raised says nothing about memory (Note: [failing points] in .executors)
            if isinstance(p, executors.Failed):
                p.reraise()
        for v, p in zip(values, results):
            recordings += p.recordings
            last[0], plans[v] = (p, p) if not isinstance(p, executors.Failed) else (last[0], p)
            tried.append((v, bool(p.fits)))
        return [bool(plans[v].fits) for v in values]

    alone = [True]
    with executors.runner(model, executor) as run:
        lo, hi = executors.search_largest(probe, limit, run.width)
    failing = plans.get(hi)
    return Largest(axis, lo, plans.get(lo), failing, recordings, tried, bound if lo == limit else "")


def max_batch(model: Any, *, gpus: Any, seq: int = 2048, train: bool = False, limit: int = 4096, **kw: Any) -> Largest:
    """The largest batch that fits at ``seq`` (doubling, then bisection: a logarithmic number of recordings),
    with the plan at it and the plan at one more that fails (which device, which op). ``**kw``: :func:`plan`'s
    (``dtype``, ``checkpointing``, ``quantization``, ``lora``, ``optimizer``, ``device_map``, ...); one build.
    ``executor=``: as :func:`sweep`'s; with several workers each round holds several probes (the doubling phase's
    next values, then the interval cut in as many parts), each probe then placed as a plan of its own."""
    return _largest("batch", model, gpus, limit, seq=seq, train=train, **kw)


def max_seq(model: Any, *, gpus: Any, batch: int = 1, train: bool = False, limit: int = 1 << 20, **kw: Any) -> Largest:
    """The longest sequence that fits at ``batch``: as :func:`max_batch`."""
    return _largest("seq", model, gpus, limit, batch=batch, train=train, **kw)


# -------------------------------------------------------------------------------------------- compare
def compare(items: Any, *, labels: list[str] | None = None, rank_by: str | None = "auto") -> Any:
    """Plans or traces side by side on one scale (:class:`fakeviz._views.compare.Comparison`), ranked: the plans
    that fit first, fastest first (``rank_by`` as in :func:`sweep`: ``"auto"`` ranks by estimated step time when
    every item is a plan on a known GPU kind, by time per token when they run different tokens per step, and keeps
    the order given otherwise), then the rest in the order given. ``.ranking`` is the table (run, fits, step_s,
    tokens_per_s, mfu, rank)."""
    items = list(items.attrs["plans"]) if isinstance(items, pd.DataFrame) else list(items)
    if labels is not None and len(labels) != len(items):
        raise ValueError(f"compare: {len(labels)} labels for {len(items)} runs")
    if labels is None and items and all(isinstance(it, Plan) for it in items) and any(it.finetune for it in items):
        labels = [it.label for it in items]  # the plans' quantization, adapters and optimizer in their names
    speeds = [getattr(it, "speed", None) if hasattr(it, "fits") else None for it in items]
    order, by = ranking.ranking(speeds, [bool(getattr(it, "fits", False)) for it in items], rank_by)
    items = [items[i] for i in order]
    labels = [labels[i] for i in order] if labels is not None else None
    return ranking.Ranked(items, labels=labels, rank_by=by)
