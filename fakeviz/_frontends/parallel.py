"""``fv.plan(model, gpus="64xH100", parallel={"dp_shard": 8, "tp": 8})``: a catalog model sharded by
torch.distributed's own recipes and simulated per rank (:func:`fakeviz.simulate`), no user step needed.

Note: [parallel plans]
The step every rank runs is the recipe torchtitan uses for a decoder-only transformer:

* the model is built on the meta device (nothing allocated until it is sharded);
* ``tp``: ``parallelize_module`` over the ``tp`` mesh with the model's own tensor-parallel plan
  (``config.base_model_tp_plan``, transformers' record of which projections split by column and which by
  row: ``colwise`` -> ``ColwiseParallel()``, ``rowwise`` -> ``RowwiseParallel()``); embeddings, norms and the
  output head are replicated across ``tp`` (``Replicate()`` DTensors: no sequence parallelism);
* activation checkpointing of the repeated blocks when asked (:func:`.steps.checkpointing`);
* ``ep``: the experts sharded by expert over ranks borrowed from ``dp_shard``, tokens moved by all-to-all (Note:
  [expert parallel plans] in :mod:`.context_expert`);
* ``dp_shard`` (FSDP2) / ``dp_replicate`` x ``dp_shard`` (HSDP): ``fully_shard`` of each repeated block, then
  of the root, over the data-parallel mesh (``dp_shard`` x ``cp`` flattened with ``cp``; a module kept in another
  dtype, a float32 router, gets its own group first);
* ``cp``: the step under torch's ``context_parallel``, the sequence sharded, ring attention (Note: [context
  parallel plans] in :mod:`.context_expert`);
* ``to_empty`` onto the rank's fake GPU, then the step: a steady-state training step with AdamW (the state
  made by its own code first, :func:`.steps.init_state`), or a forward, or ``generate``. ``batch`` is the
  batch of one data-parallel rank (torchtitan's local batch).

Ranks found identical are recorded once. This step has no rank-dependent code of its own: what differs
between ranks is only the local shard of each sharded parameter (uneven splits), so two ranks whose every
parameter has the same local shape (torch's ``_compute_local_shape_and_global_offset`` at their mesh
coordinates, from the placements rank 0's parameters got) record the same ops, shapes and bytes. Rank 0 is
recorded first; then one rank per other layout; every other rank stands in by its layout's recorded rank
(:attr:`fakeviz.Simulation.stand_ins`). ``ranks="all"`` records them all (the tests check that the classes
agree).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch

from .._core.errors import ArgumentError
from .._core.gpus import check_count, parse_gpus
from .._engine import torch_compat
from . import context_expert, offload

__all__ = ["AXES", "parallel_plan"]

AXES = (
    "pp",
    "dp_replicate",
    "dp_shard",
    "cp",
    "tp",
)  # mesh order: outermost (slowest-varying rank) first, as torchtitan
BORROWED = ("ep",)  # degrees that borrow the ranks of other axes (ep: dp_shard's), no mesh axis of their own
_STYLES = ("colwise", "rowwise")


def parse_parallel(parallel: dict[str, int], gpus: Any) -> tuple[tuple[int, ...], tuple[str, ...], Any]:
    """``(mesh_shape, mesh_dim_names, gpu)`` for ``parallel`` over ``gpus`` (``"64xH100"`` or one GPU kind)."""
    if not isinstance(parallel, dict) or not parallel:
        raise ValueError(f"parallel={parallel!r}: give degrees per axis, e.g. {{'dp_shard': 8, 'tp': 8}}")
    unknown = sorted(set(parallel) - set(AXES) - set(BORROWED))
    if unknown:
        raise ValueError(
            f"parallel: unknown axis {', '.join(map(repr, unknown))}; plan knows {', '.join(AXES)}.\n"
            "For another recipe, write the step yourself and call fakeviz.simulate(step, ...)."
        )
    sizes = {}
    for k, v in parallel.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"parallel[{k!r}]={v!r}: a degree is an integer >= 1")
        sizes[k] = v
    dims = [(a, sizes[a]) for a in AXES if sizes.get(a, 1) > 1] or [("dp_shard", 1)]
    world = math.prod(n for _, n in dims)
    # one limit for both ways of writing the job (Note: [GPU counts] in fakeviz._core.gpus)
    check_count(world, lambda problem, advice: ArgumentError("parallel", parallel, problem, advice), job=True)
    caps = parse_gpus(gpus, job=True)
    if len({c.bytes for c in caps}) != 1 or len({c.gpu for c in caps}) != 1:
        raise ValueError(f"gpus={gpus!r}: a parallel plan runs every rank on one GPU kind")
    if len(caps) not in (1, world):
        raise ValueError(
            f"gpus={gpus!r} holds {len(caps)} GPUs, but parallel={parallel} makes {world} ranks.\n"
            f"Give {world} GPUs (e.g. '{world}x{caps[0].label.split()[0]}') or change the degrees."
        )
    return tuple(n for _, n in dims), tuple(a for a, _ in dims), caps[0]


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks (``model.layers.0`` ...): what FSDP2 wraps one by one."""
    from .._analysis import placement

    return [model.get_submodule(n) for n in placement.units(model) if n.rsplit(".", 1)[-1].isdigit()]


def check_tp(cfg: Any, size: int) -> dict[str, str]:
    """The config's colwise/rowwise TP plan, after checking that ``size`` ranks can split it (whole heads)."""
    tp_plan = {k: v for k, v in dict(getattr(cfg, "base_model_tp_plan", None) or {}).items() if v in _STYLES}
    if not tp_plan:
        raise ValueError(
            f"tp: {type(cfg).__name__} has no tensor-parallel plan (config.base_model_tp_plan with colwise/rowwise "
            "entries); use dp_shard / dp_replicate, or parallelize the model in your own step with fakeviz.simulate"
        )
    for heads in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(cfg, heads, None)
        if isinstance(n, int) and n % size:
            raise ValueError(f"tp={size} does not divide {heads}={n}: every rank must hold whole attention heads")
    return tp_plan


def tensor_parallel(model: torch.nn.Module, tp_mesh: Any, replicated: list[str] | None = None) -> int:
    """``parallelize_module`` of the base model by its config's ``base_model_tp_plan``; returns the modules split,
    and appends to ``replicated`` the names of those every ``tp`` rank runs whole (:func:`_replicate_the_rest`)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {k: styles[v]() for k, v in check_tp(model.config, tp_mesh.size()).items()}
    parallelize_module(base, tp_mesh, plan)
    names = _replicate_the_rest(model, tp_mesh)
    if replicated is not None:
        replicated.extend(names)
    return len(plan)


def _replicate_the_rest(model: torch.nn.Module, mesh: Any) -> list[str]:
    """Every module the TP plan left with plain parameters (embeddings, norms, the output head) gets them as
    ``Replicate()`` DTensors over ``mesh`` (``distribute_module``), its inputs made DTensors and its outputs local
    again, so that every parameter is a DTensor: AdamW's foreach ops refuse a mix (as in torchtitan, where
    no parameter stays plain). Returns their names (the model's own: ``"lm_head"``, ``"model.norm"``)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def inputs(mod: Any, args: Any, mesh: Any) -> Any:
        return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                     if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a for a in args)  # fmt: skip

    def outputs(mod: Any, out: Any, mesh: Any) -> Any:
        return out.to_local() if isinstance(out, DTensor) else out

    names = []
    for name, mod in list(model.named_modules()):
        own = list(mod.parameters(recurse=False))
        if own and not all(isinstance(q, DTensor) for q in own):
            distribute_module(mod, mesh, input_fn=inputs, output_fn=outputs)
            names.append(name)
    return names


def parallel_step(model: Any, names: tuple[str, ...], settings: dict[str, Any],
                  layouts: list[tuple[tuple[int, ...], tuple[str, ...] | None, tuple[int, ...], tuple[Any, ...]]],
                  replicated: list[str] | None = None) -> Callable[[int, Any], None]:  # fmt: skip
    """The step of Note: [parallel plans]; the first rank's sharded parameters' layouts go to ``layouts``, the
    modules every ``tp`` rank runs whole to ``replicated`` (for the model FLOPs: Note: [model FLOPs])."""
    from .. import models
    from .steps import checkpointing, init_state, make_optimizer, run

    def step(rank: int, mesh: Any) -> None:
        with torch.device("meta"):
            m = models.build(model, dtype=settings["dtype"])
        if "tp" in names:
            tensor_parallel(m, mesh["tp"], replicated if replicated is not None and not replicated else None)
        if settings["parallel"].get("ep", 1) > 1:  # Note: [expert parallel plans]
            context_expert.expert_parallel(m, mesh, names, settings["parallel"]["ep"])
        dp = tuple(n for n in ("dp_replicate", "dp_shard", "cp") if n in names)
        if dp:
            fully_shard = torch_compat.require("torch.distributed.fsdp.fully_shard")
            dp_mesh = context_expert.fsdp_mesh(mesh, names)  # dp_shard x cp flattened (torchtitan's fsdp mesh)
            context_expert.shard_own_dtypes(m, dp_mesh, fully_shard, **offload.fsdp_kwargs(settings))
            for block in _blocks(m):
                fully_shard(block, mesh=dp_mesh, **offload.fsdp_kwargs(settings))
            fully_shard(m, mesh=dp_mesh, **offload.fsdp_kwargs(settings))  # Note: [offload]
        offload.materialize(m, settings)  # to_empty on the GPU (offload="cpu": on the host, buffers on the GPU)
        if not layouts:
            layouts.extend(_layout(p) for p in m.parameters())
        opt = None
        if settings["train"]:
            opt = make_optimizer("adamw", m)
            init_state(opt)
        with checkpointing(m, settings["checkpointing"]), offload.saved_on_host(settings), warnings.catch_warnings():
            # the root's output is the head's local view (``to_local``): nothing here writes it in place
            warnings.filterwarnings("ignore", message=".*returned a view tensor", category=UserWarning)
            if "cp" in names:  # Note: [context parallel plans]
                context_expert.cp_run(m, mesh["cp"], batch=settings["batch"], seq=settings["seq"],
                                      train=settings["train"], optimizer=opt)  # fmt: skip
            else:
                run(m, batch=settings["batch"], seq=settings["seq"], train=settings["train"],
                      new_tokens=settings["new_tokens"], optimizer=opt)  # fmt: skip

    return step


def _layout(p: torch.Tensor) -> tuple[tuple[int, ...], tuple[str, ...] | None, tuple[int, ...], tuple[Any, ...]]:
    """(global shape, mesh dim names, mesh shape, placements) of a DTensor parameter; a plain one: no mesh."""
    mesh = getattr(p, "device_mesh", None)
    if mesh is None:
        return tuple(p.shape), None, (), ()
    return tuple(p.shape), tuple(mesh.mesh_dim_names or ()), tuple(mesh.shape), tuple(p.placements)


def rank_keys(layouts: list[Any], mesh_shape: tuple[int, ...], names: tuple[str, ...],
              derived: Callable[[dict[str, int]], Any] | None = None) -> dict[int, Hashable]:  # fmt: skip
    """rank -> the local shape of every parameter at the rank's coordinates: equal keys, identical records (every
    rank its own key on a torch without ``_compute_local_shape_and_global_offset``: all recorded). ``derived``:
    ``coord -> (coordinates on the recipe's other meshes, the rank's own key part)`` (cp and ep plans:
    :func:`.context_expert.derived_coordinates`)."""
    local_shape = torch_compat.lookup("torch.distributed.tensor._utils._compute_local_shape_and_global_offset")
    world = math.prod(mesh_shape)
    if local_shape is None:
        return {q: q for q in range(world)}
    keys: dict[int, Hashable] = {}
    for r in range(world):
        coord = dict(zip(names, (int(c) for c in np.unravel_index(r, mesh_shape))))
        key: list[Any] = []
        if derived is not None:
            more, own = derived(coord)
            coord = {**more, **coord}
            key.append(own)
        for shape, dims, sub_shape, placements in layouts:
            if dims is None:
                continue
            if not dims or any(d not in coord for d in dims):  # a mesh this recipe did not name: no skipping
                return {q: q for q in range(world)}
            local, _ = local_shape(shape, sub_shape, [coord[d] for d in dims], placements)
            key.append(tuple(local))
        keys[r] = tuple(key)
    return keys


def remote_rank(shared: dict[str, Any], rank: int) -> Any:
    """One rank of a parallel plan in a worker (:mod:`.executors`): the step rebuilt from its description."""
    from .distributed import run_rank

    step = parallel_step(shared["model"], shared["names"], shared["settings"], [], [])
    return run_rank(step, shared["sim"], rank)


def parallel_plan(model: Any, *, gpus: Any, parallel: dict[str, int], batch: int, seq: int, train: bool,
                  new_tokens: int, dtype: Any, checkpointing: Any, ranks: Any = "auto",
                  offload: str | None = None, executor: Any = None) -> Any:  # fmt: skip
    """:func:`fakeviz.plan` with ``parallel=``: a :class:`~fakeviz.Simulation` of every rank (Note: [parallel plans]);
    with ``pp``: :func:`.pipeline.pipeline_plan`. ``executor``: where the first rank of each class after rank 0 is
    recorded (:func:`fakeviz.sweep`'s ``executor``)."""
    from ..models import as_dtype
    from .distributed import simulate_recipe

    if isinstance(model, torch.nn.Module):
        raise ValueError(
            "parallel= builds the model on every rank: pass its name, folder or config (a module cannot be rebuilt);\n"
            "for your own module, write the step and call fakeviz.simulate(step, world_size, ...)"
        )
    if isinstance(parallel, dict) and parallel.get("pp", 1) != 1:  # Note: [pipeline plans]: their own step
        raise ValueError("parallel_plan: a plan with pp runs fakeviz._frontends.pipeline.pipeline_plan (fakeviz.plan "
                         "picks it)")  # fmt: skip
    parallel = context_expert.with_ep_defaults(parallel) if isinstance(parallel, dict) else parallel
    shape, names, gpu = parse_parallel(parallel, gpus)
    if {"dp_shard", "dp_replicate"} & set(names):  # before any rank runs (Note: [torch versions])
        torch_compat.require("torch.distributed.fsdp.fully_shard", "plan(parallel=...) with dp_shard / dp_replicate")
    if "tp" in names:
        from .. import models

        check_tp(models.config(model), shape[names.index("tp")])
    context_expert.check(model, parallel, shape, names, batch=batch, seq=seq, dtype=dtype, train=train,
                         new_tokens=new_tokens)  # fmt: skip
    settings = {"batch": batch, "seq": seq, "train": train, "new_tokens": new_tokens, "checkpointing": checkpointing,
                "dtype": as_dtype(dtype), "parallel": dict(parallel), "offload": offload}  # fmt: skip
    layouts: list[Any] = []
    replicated: list[str] = []
    step = parallel_step(model, names, settings, layouts, replicated)
    derived = context_expert.derived_coordinates(names, shape, parallel.get("ep", 1))
    sim = simulate_recipe(step, math.prod(shape), mesh_shape=shape, mesh_dim_names=names, gpu=gpu.spec, ranks=ranks,
                          rank_keys=lambda: rank_keys(layouts, shape, names, derived), executor=executor,
                          remote=(remote_rank, {"model": model, "names": names, "settings": settings}))  # fmt: skip
    context_expert.state_assumptions(sim, model, settings)
    sim.settings = {**settings, "dtype": str(settings["dtype"]) if settings["dtype"] else None, "model": str(model),
                    "tp_replicated": replicated}  # fmt: skip
    return sim
