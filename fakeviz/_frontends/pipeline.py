"""``fv.plan(model, gpus="8xH100", parallel={"pp": 4, "dp_shard": 2}, microbatches=8, schedule="1F1B",
train=True)``: pipeline parallel through ``torch.distributed.pipelining``, simulated per rank.

Note: [pipeline plans]
The step every rank runs is torchtitan's pipeline recipe (``torchtitan/distributed/pipeline_parallel.py``) for a
decoder-only transformer of transformers' layout (``model.embed_tokens``, ``model.layers.N``, ``model.norm``,
``lm_head``):

* the mesh is ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``, ``pp`` outermost (torchtitan's order): rank
  ``r`` is pipeline rank ``r // (world / pp)``;
* the model is built on the meta device; ``tp`` splits it by its own plan first (:func:`.parallel.tensor_parallel`);
* the split: ``stages=`` (lists of module names, e.g. ``[["model.embed_tokens", "model.layers.0"], ...]``), or
  torchtitan's ``generate_llm_fqn_per_model_part``: the layers plus one for the embedding and one for norm + head,
  divided evenly over the stages, the first ``extra`` stages one more (so with layers not divisible by the stages,
  the first stages hold a block more: their peaks differ from the others');
* stages per rank: 1 for a single-stage schedule (``GPipe``, ``1F1B``), ``stages_per_rank`` (default 2) for a
  looped one (``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``: rank r holds stages r, r + pp, ...;
  ``ZBVZeroBubble``, ``DualPipeV``: the V, stages r and 2 pp - 1 - r), as torchtitan's ``stage_ids_this_rank``;
* each stage is a :class:`PipelineChunk` of those modules (the model's own layers, rotary embedding and causal mask,
  run as its forward does), FSDP2 over the data-parallel mesh per block and per chunk with
  ``reshard_after_forward=False`` (torchtitan's default under pp: each microbatch's forward would gather again),
  ``to_empty`` on the rank's GPU, then ``PipelineStage(chunk, index, stages, device, group=pp group)`` with no shapes
  given: torch infers them, its warm-up vote and metadata exchange reading what the neighbouring ranks sent (Note:
  [values between simulated ranks] in :mod:`fakeviz._engine.distributed`). A looped or V schedule's stages get
  their shapes (:func:`_shapes`: what torch's inference finds), since a rank's later stage receives from a rank
  recorded after it: the record has no metadata exchange and no inference forward where torchtitan's run has them
  (a few hundred bytes of p2p and one microbatch's forward and backward before the step). So do all stages on a
  torch that decides shapes locally under a fake group (>= 2.14:
  :func:`fakeviz._engine.torch_compat.pipeline_shapes_over_fake_group`);
* the schedule (``torch.distributed.pipelining.schedules``; a name this torch lacks is refused with the names it
  has) with ``microbatches`` (default: torchtitan's microbatch size 1, so ``batch`` microbatches) and torchtitan's
  loss (``cross_entropy`` of the flattened logits in float32) on the last stage; ``batch`` is the data-parallel
  rank's batch, every rank gets the targets, the first stage the inputs, ``return_outputs=False`` where the
  schedule has it (a trainer reads the losses; torch would otherwise keep every microbatch's logits until the step
  ends); then AdamW's step (its state made first, :func:`.steps.init_state`: a steady-state step).

Ranks of one pipeline rank whose parameters have the same local shapes record alike (:func:`.parallel.rank_keys`
with the pipeline coordinate in the key); ranks of different pipeline ranks never stand in for each other.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._core.errors import ArgumentError
from .._engine import torch_compat
from .._engine.distributed import current_mailbox

__all__ = ["SCHEDULES", "PipelineChunk", "pipeline_plan", "split_stages"]

#: schedule name -> torch's class name (``torch.distributed.pipelining.schedules``); the names are torch's own
SCHEDULES = {
    "GPipe": "ScheduleGPipe",
    "1F1B": "Schedule1F1B",
    "Interleaved1F1B": "ScheduleInterleaved1F1B",
    "LoopedBFS": "ScheduleLoopedBFS",
    "InterleavedZeroBubble": "ScheduleInterleavedZeroBubble",
    "ZBVZeroBubble": "ScheduleZBVZeroBubble",
    "DualPipeV": "ScheduleDualPipeV",
}
_V_STYLE = ("ZBVZeroBubble", "DualPipeV")


def schedule_class(name: Any) -> tuple[str, type]:
    """``(torch's name, class)`` of the schedule ``name`` (case-insensitive, as torch's ``get_schedule_class``);
    refused with the names this torch has."""
    have = {k: c for k, v in SCHEDULES.items() if (c := torch_compat.lookup(f"torch.distributed.pipelining.{v}"))
            is not None or (c := torch_compat.lookup(f"torch.distributed.pipelining.schedules.{v}")) is not None}  # fmt: skip
    match = {k.lower(): k for k in have}.get(str(name).lower()) if isinstance(name, str) else None
    if match is None:
        why = "this torch has no such schedule" if isinstance(name, str) and name.lower() in {
            k.lower() for k in SCHEDULES} else "not a pipeline schedule"  # fmt: skip
        raise ArgumentError("schedule", name, why, f"use one of {', '.join(map(repr, have))}")
    return match, have[match]


def _multi(cls: type) -> bool:
    multi = torch_compat.lookup("torch.distributed.pipelining.schedules.PipelineScheduleMulti")
    return multi is not None and issubclass(cls, multi)


def split_stages(layers: int, stages: int) -> list[list[str]]:
    """torchtitan's even split (``generate_llm_fqn_per_model_part`` with input and output weight 1) in the module
    names of transformers' decoder models: ``layers`` blocks plus one for the embedding and one for norm + head
    divided over ``stages``, the first ``extra`` stages one more."""
    effective = layers + 2
    if stages > effective:
        raise ArgumentError("parallel['pp']", stages, f"more stages than the model's {layers} layers + embedding + head",
                            f"use at most {effective} stages in all (pp x stages_per_rank)")  # fmt: skip
    per, extra = divmod(effective, stages)
    if per < 1:
        raise ArgumentError("parallel['pp']", stages, "some stages would be empty", "use fewer stages")
    out, nxt = [], 0
    for s in range(stages):
        n = per + (1 if s < extra else 0)
        names = []
        if s == 0:
            names.append("model.embed_tokens")
            n -= 1
        if s == stages - 1 and stages > 1:
            n -= 1
        for _ in range(max(0, n)):
            if nxt < layers:
                names.append(f"model.layers.{nxt}")
                nxt += 1
        if s == stages - 1:
            names += [f"model.layers.{i}" for i in range(nxt, layers)] + ["model.norm", "lm_head"]
        out.append(names)
    return out


def stage_ids(pp_rank: int, pp: int, stages: int, v_style: bool) -> tuple[int, ...]:
    """The stages pipeline rank ``pp_rank`` holds (torchtitan's ``stage_ids_this_rank``: looped or V)."""
    per = stages // pp
    if v_style:
        return (pp_rank, stages - 1 - pp_rank)
    return tuple(pp_rank + s * pp for s in range(per))


class PipelineChunk(nn.Module):
    """One pipeline stage of a transformers decoder model: the modules ``names`` names (the model's own, under their
    own names), run as the model's forward runs them: the embedding on the first stage, each layer with the causal
    mask and rotary embedding the model makes, the final norm and the head on the last."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        base = model.model
        self.model = nn.Module()
        self.model.embed_tokens = base.embed_tokens if "model.embed_tokens" in names else None
        keep = [n.rsplit(".", 1)[1] for n in names if n.startswith("model.layers.")]
        self.model.layers = nn.ModuleDict({i: base.layers[int(i)] for i in keep})
        self.model.norm = base.norm if "model.norm" in names else None
        self.model.rotary_emb = base.rotary_emb
        self.lm_head = model.lm_head if "lm_head" in names else None
        self.config = base.config
        self._mask = getattr(sys.modules[type(base).__module__], "create_causal_mask", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        h = m.embed_tokens(x) if m.embed_tokens is not None else x
        if len(m.layers):
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            mask = None
            if self._mask is not None:
                kw = {"config": self.config, "attention_mask": None, "position_ids": pos}
                params = inspect.signature(self._mask).parameters
                kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = h
                kw.update({k: None for k in ("cache", "past_key_values") if k in params})
                if "cache_position" in params:
                    kw["cache_position"] = torch.arange(h.shape[1], device=h.device)
                mask = self._mask(**kw)
            pe = m.rotary_emb(h, position_ids=pos)
            for layer in m.layers.values():
                h = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=pos)
                h = h[0] if isinstance(h, tuple) else h
        if m.norm is not None:
            h = m.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def _shapes(m: nn.Module, index: int, stages: int, settings: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Stage ``index``'s input and output as torch's dynamic shape inference finds them (meta tensors): the token
    ids of one microbatch into the first stage, one microbatch's hidden states (the model's dtype, carrying
    gradients) between stages, its logits out of the last (for a torch that will not infer them over a fake group:
    :func:`fakeviz._engine.torch_compat.pipeline_shapes_over_fake_group`)."""
    mb, seq = settings["batch"] // settings["microbatches"], settings["seq"]
    dtype = m.model.embed_tokens.weight.dtype
    hidden = torch.empty(mb, seq, m.config.hidden_size, dtype=dtype, device="meta", requires_grad=True)
    first = torch.empty(mb, seq, dtype=torch.long, device="meta")
    logits = torch.empty(mb, seq, m.config.vocab_size, dtype=m.lm_head.weight.dtype, device="meta")
    return {"input_args": first if index == 0 else hidden, "output_args": logits if index == stages - 1 else hidden}


def _layout(p: torch.Tensor) -> tuple[Any, ...]:
    """(global shape, mesh dim names, mesh shape, placements) of a DTensor parameter; a plain one: no mesh (as
    :func:`.parallel.rank_keys` reads them)."""
    mesh = getattr(p, "device_mesh", None)
    if mesh is None:
        return tuple(p.shape), None, (), ()
    return tuple(p.shape), tuple(mesh.mesh_dim_names or ()), tuple(mesh.shape), tuple(p.placements)


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """torchtitan's ``cross_entropy_loss``: the flattened logits in float32 against the targets."""
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


def _check_model(m: Any) -> None:
    base = getattr(m, "model", None)
    need = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, n) for n in need) or not hasattr(m, "lm_head"):
        raise ArgumentError("parallel['pp']", "pp", f"{type(m).__name__} is not a decoder of transformers' layout "
                            "(model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head)",
                            "split it yourself: build PipelineStages in your own step and call fakeviz.simulate")  # fmt: skip


def pipeline_step(model: Any, names: tuple[str, ...], settings: dict[str, Any], split: list[list[str]],
                  layouts: list[Any], held: dict[int, list[str]]) -> Callable[[int, Any], None]:  # fmt: skip
    """The step of Note: [pipeline plans]; the first rank's sharded parameters' layouts go to ``layouts``, each
    recorded rank's stage indices to ``held``."""
    from .. import models
    from .parallel import tensor_parallel
    from .steps import checkpointing, init_state, make_optimizer

    PipelineStage = torch_compat.require("torch.distributed.pipelining.PipelineStage", "plan(parallel={'pp': ...})")
    name, cls = schedule_class(settings["schedule"])
    pp, n_stages, mb = settings["parallel"]["pp"], len(split), settings["microbatches"]

    multi, exchanged = _multi(cls), torch_compat.pipeline_shapes_over_fake_group()

    def step(rank: int, mesh: Any) -> None:
        dev = torch.device("cuda", torch.cuda.current_device())
        box = current_mailbox()
        if multi and exchanged and box is not None:  # every stage given its shapes votes STATIC (1)
            box.expect((1,), torch.int32, 1,
                       "PipelineStage's warm-up vote from a rank not recorded yet: 1 (STATIC), as every stage of a "
                       "pipeline plan with a looped schedule is given its shapes")  # fmt: skip
        with torch.device("meta"):
            m = models.build(model, dtype=settings["dtype"])
        _check_model(m)
        if "tp" in names:
            tensor_parallel(m, mesh["tp"])
        pp_mesh = mesh["pp"]
        ids = stage_ids(pp_mesh.get_local_rank(), pp, n_stages, name in _V_STYLE)
        dp = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
        chunks, stages = [], []
        for i in ids:
            chunk = PipelineChunk(m, split[i])
            if dp:
                fully_shard = torch_compat.require("torch.distributed.fsdp.fully_shard")
                dp_mesh = mesh[dp] if len(dp) > 1 else mesh[dp[0]]
                for block in chunk.model.layers.values():
                    fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
                fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=False)
            chunk.to_empty(device=dev)
            chunks.append(chunk)
            shapes = {} if exchanged and not multi else _shapes(m, i, n_stages, settings)
            stages.append(PipelineStage(chunk, i, n_stages, dev, group=pp_mesh.get_group(), **shapes))
        held[rank] = list(ids)
        if not layouts:
            layouts.extend(_layout(p) for c in chunks for p in c.parameters())
        whole = nn.ModuleList(chunks)
        opt = make_optimizer("adamw", whole)
        init_state(opt)
        sched = cls(stages if _multi(cls) else stages[0], n_microbatches=mb, loss_fn=_loss)
        vocab = m.config.vocab_size
        batch, seq = settings["batch"], settings["seq"]
        tokens = torch.randint(0, vocab, (batch, seq), device=dev)
        target = torch.randint(0, vocab, (batch, seq), device=dev)
        with contextlib.ExitStack() as stack, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*returned a view tensor", category=UserWarning)
            for c in chunks:  # each stage's blocks (its layers, numbered by the model's own indices)
                stack.enter_context(checkpointing(c.model.layers, settings["checkpointing"]))
            losses: list[Any] = []
            # the losses are what a trainer reads; torch would otherwise keep every microbatch's logits to the end
            quiet = {"return_outputs": False} if "return_outputs" in inspect.signature(sched.step).parameters else {}
            if any(s.is_first for s in stages):
                sched.step(tokens, target=target, losses=losses, **quiet)
            else:
                sched.step(target=target, losses=losses, **quiet)
        opt.step()
        opt.zero_grad()

    return step


def check(parallel: dict[str, int], *, batch: int, microbatches: Any, schedule: Any, stages: Any,
          stages_per_rank: Any, layers: int, train: bool, new_tokens: int) -> tuple[int, list[list[str]]]:  # fmt: skip
    """The microbatch count and the stage split for a pipeline plan, or a refusal naming the argument."""
    pp = parallel["pp"]
    other = sorted(set(k for k, v in parallel.items() if v > 1) - {"pp", "dp_shard", "dp_replicate", "tp"})
    if other:
        raise ArgumentError("parallel", parallel, f"pp with {', '.join(other)} is not simulated yet",
                            "combine pp with dp_shard, dp_replicate and tp")  # fmt: skip
    if not train or new_tokens:
        raise ArgumentError("train", train, "a pipeline plan records a training step",
                            "give train=True (for inference, plan without pp)")  # fmt: skip
    name, cls = schedule_class(schedule)
    multi = _multi(cls)
    if stages_per_rank is None:
        stages_per_rank = 2 if multi else 1
    if not isinstance(stages_per_rank, int) or isinstance(stages_per_rank, bool) or stages_per_rank < 1:
        raise ArgumentError("stages_per_rank", stages_per_rank, "not a count", "give an integer >= 1")
    if not multi and stages_per_rank != 1:
        raise ArgumentError("stages_per_rank", stages_per_rank, f"{name} runs one stage per rank",
                            "use a looped schedule (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) or 1")  # fmt: skip
    if name in _V_STYLE and stages_per_rank != 2:
        raise ArgumentError("stages_per_rank", stages_per_rank, f"{name} runs a V of two stages per rank", "give 2")
    if stages is not None:
        if not isinstance(stages, (list, tuple)) or not all(isinstance(s, (list, tuple)) and s for s in stages):
            raise ArgumentError("stages", stages, "not a list of module-name lists",
                                'give e.g. [["model.embed_tokens", "model.layers.0"], ["model.norm", "lm_head"]]')  # fmt: skip
        split = [list(s) for s in stages]
        valid = {"model.embed_tokens", "model.norm", "lm_head"} | {f"model.layers.{i}" for i in range(layers)}
        bad = sorted({n for s in split for n in s} - valid)
        if bad:
            raise ArgumentError("stages", stages, f"unknown module {bad[0]!r}",
                                f"name model.embed_tokens, model.layers.0 .. model.layers.{layers - 1}, model.norm, "
                                "lm_head")  # fmt: skip
        flat = [n for s in split for n in s]
        if len(flat) != len(set(flat)) or set(flat) != valid:
            raise ArgumentError("stages", stages, "every module must be in exactly one stage", "list each once")
        if len(split) != pp * stages_per_rank:
            raise ArgumentError("stages", stages, f"{len(split)} stages for pp={pp} x stages_per_rank="
                                f"{stages_per_rank}", f"give {pp * stages_per_rank} stages")  # fmt: skip
    else:
        split = split_stages(layers, pp * stages_per_rank)
    mb = batch if microbatches is None else microbatches
    if not isinstance(mb, int) or isinstance(mb, bool) or mb < 1:
        raise ArgumentError("microbatches", microbatches, "not a count", "give an integer >= 1")
    if batch % mb:
        raise ArgumentError("microbatches", mb, f"batch={batch} does not split into {mb} equal microbatches",
                            f"give a divisor of {batch} (batch is one data-parallel rank's)")  # fmt: skip
    if name == "1F1B" and mb < pp:
        raise ArgumentError("microbatches", mb, f"1F1B needs at least as many microbatches as stages ({pp})",
                            f"give microbatches >= {pp}, or schedule='GPipe'")  # fmt: skip
    return mb, split


def pipeline_plan(model: Any, *, gpus: Any, parallel: dict[str, int], batch: int, seq: int, train: bool,
                  new_tokens: int, dtype: Any, checkpointing: Any, ranks: Any = "auto", microbatches: int | None = None,
                  schedule: str = "1F1B", stages: list[list[str]] | None = None,
                  stages_per_rank: int | None = None, offload: Any = None) -> Any:  # fmt: skip
    """:func:`fakeviz.plan` with ``parallel={"pp": P, ...}`` (Note: [pipeline plans]).

    Args:
        model: a name, folder or config of a transformers decoder model (rebuilt on every rank).
        gpus, parallel, batch, seq, dtype, checkpointing, ranks: as :func:`fakeviz.plan`; ``batch`` is one
            data-parallel rank's batch, split into ``microbatches``.
        microbatches: microbatches per step (default: ``batch``, torchtitan's microbatch size 1).
        schedule: a schedule of ``torch.distributed.pipelining`` by name (:data:`SCHEDULES`).
        stages: the modules of each stage (default: torchtitan's even split, :func:`split_stages`).
        stages_per_rank: stages each rank holds (looped and V schedules; default 2 for those, else 1).

    Returns:
        A :class:`~fakeviz.Simulation`; ``settings["stages"]`` holds the split, ``settings["stage_of"]`` each
        recorded rank's stage indices.
    """
    from .. import models
    from ..models import as_dtype
    from .distributed import simulate_recipe
    from .parallel import check_tp, parse_parallel, rank_keys

    if offload is not None:
        raise ArgumentError("offload", offload, "not simulated with pp yet", "plan pp without offload")
    if isinstance(model, torch.nn.Module):
        raise ArgumentError("model", type(model).__name__, "a pipeline plan builds the model on every rank",
                            "pass its name, folder or config (a module cannot be rebuilt)")  # fmt: skip
    shape, names, gpu = parse_parallel(parallel, gpus)
    cfg = models.config(model)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    mb, split = check(parallel, batch=batch, microbatches=microbatches, schedule=schedule, stages=stages,
                      stages_per_rank=stages_per_rank, layers=layers, train=train, new_tokens=new_tokens)  # fmt: skip
    if "tp" in names:
        check_tp(cfg, shape[names.index("tp")])
    if {"dp_shard", "dp_replicate"} & set(names):
        torch_compat.require("torch.distributed.fsdp.fully_shard", "plan(parallel=...) with dp_shard / dp_replicate")
    pp_size = math.prod(shape) // shape[0]
    if not isinstance(ranks, str):  # Note: [values between simulated ranks]: what the earlier stages send
        asked = sorted({int(r) for r in ranks})
        need = sorted({q for r in asked for q in range(r % pp_size, r + 1, pp_size)})
        if need != asked:
            raise ArgumentError("ranks", ranks, "a pipeline rank reads what the ranks before it in its pipeline send "
                                "(the warm-up vote, the shapes)", f"give ranks={need}, or ranks='auto'")  # fmt: skip
    settings = {"batch": batch, "seq": seq, "train": train, "new_tokens": 0, "checkpointing": checkpointing,
                "dtype": as_dtype(dtype), "parallel": dict(parallel), "microbatches": mb,
                "schedule": schedule_class(schedule)[0]}  # fmt: skip
    layouts: list[Any] = []
    held: dict[int, list[str]] = {}
    step = pipeline_step(model, names, settings, split, layouts, held)

    def keys() -> dict[int, Any]:
        # Rank 0's layouts stand for every stage's: a stage holds blocks (all of one shape), and the first and last
        # stages the embedding or the norm and head, whose shapes are rank 0's embedding's (vocab x hidden) and a
        # block's norm's. Where rank 0 holds no block, that does not hold: every rank is recorded.
        if not any(".layers." in n for n in split[0]):
            return {r: r for r in range(math.prod(shape))}
        within = rank_keys(layouts, shape, names)
        return {r: (r // pp_size, k) for r, k in within.items()}

    sim = simulate_recipe(step, math.prod(shape), mesh_shape=shape, mesh_dim_names=names, gpu=gpu.spec, ranks=ranks,
                          rank_keys=keys)  # fmt: skip
    if _multi(schedule_class(schedule)[1]) or not torch_compat.pipeline_shapes_over_fake_group():
        said = ("PipelineStage was given each stage's shapes (Note: [pipeline plans]): torchtitan's stages, given "
                "none, agree them at the first step (a metadata exchange of a few hundred bytes and one microbatch's "
                "forward and backward before the schedule runs), which this record does not have")  # fmt: skip
        for t in sim.traces.values():
            t.meta.setdefault("assumptions", []).append([-1, "PipelineStage", said, None, None])
    sim.settings = {**settings, "dtype": str(settings["dtype"]) if settings["dtype"] else None, "model": str(model),
                    "tp_replicated": [], "stages": split, "stage_of": dict(held)}  # fmt: skip
    return sim
