"""``fv.plan(..., parallel={"cp": C})`` and ``parallel={"ep": E}``: context parallel (torch's ring attention over a
sharded sequence) and expert parallel (experts sharded by expert, tokens dispatched and combined by all-to-all), as
steps of the recipe of Note: [parallel plans] in :mod:`fakeviz._frontends.parallel`.

Note: [context parallel plans]
``cp`` is torch's ``context_parallel`` as transformers' Trainer and accelerate run it for a transformers model
(torchtitan's ``maybe_enable_context_parallel`` before its own attention rewrite did the same with its own model):

* the step's buffers ``input_ids``, ``labels``, ``shift_labels`` (the labels shifted by one, padded with -100, as the
  Trainer makes them: a shard's last label belongs to the next shard's first token) and ``position_ids``
  (``arange(seq)`` per row) are sharded along the sequence (dim 1) by ``context_parallel(mesh["cp"], buffers=...,
  buffer_seq_dims=[1, 1, 1, 1])``: with torch's head-tail load balancing (its default,
  ``_create_default_load_balancer``) rank ``r`` holds chunks ``r`` and ``2C - 1 - r`` of ``2C`` equal chunks, so each
  rank holds ``seq / C`` tokens of each, and ``seq`` must divide by ``2 x C`` (refused otherwise: without the load
  balancing the shards' causal work differs by rank and torch's ring needs equal shards);
* SDPA is replaced by torch's ring attention for the block (``context_parallel`` wraps
  ``F.scaled_dot_product_attention``; q, k, v become ``Shard(2)`` DTensors on the cp mesh and the flash, efficient or
  cuDNN kernel runs once per ring step on the local query against each rank's K/V). The K/V exchange is torch's
  default rotate method, ``"allgather"`` (torchtitan's and accelerate's default too): each attention all-gathers its
  local K and V, flattened and concatenated, once in forward (``C x`` the local ``2 x B x kv_heads x seq/C x
  head_dim`` elements come back) and again in backward, where the K/V gradients travel back by ``all_to_all``. The
  collectives table shows each with its bytes;
* accelerate's ``_attach_context_parallel_hooks``: every ``self_attn`` module's forward gets ``attention_mask=None``
  and ``is_causal=True`` (ring attention takes no mask; sliding-window or chunked attention cannot be expressed and is
  refused, as accelerate refuses it);
* the weights are sharded by FSDP2 over ``dp_shard x cp`` flattened (torchtitan's ``fsdp`` mesh: "when cp is used,
  FSDP is also applied ... even if there may be no data parallelism"), so each cp rank holds ``1 / (dp_shard x cp)``
  of each weight;
* the ring attention needs a fused kernel: float32 with grouped-query attention (``num_key_value_heads <
  num_attention_heads``) gets SDPA's math kernel on a GPU, which torch's ring does not take: refused, give bf16.

The ring's work differs by rank (with load balancing, rank ``r`` at ring step ``i <= r`` attends to the first half
of the K/V it got, at ``i > r`` runs only the second half of its queries), so two cp ranks record different ops
and ``ranks="auto"`` records one rank per cp coordinate (per shard layout of each).

Note: [expert parallel plans]
``ep`` shards a mixture-of-experts model's experts by expert, as torchtitan's ``ExpertParallel`` does
(``distribute_tensor(param, ep_mesh, [Shard(0)])`` of each experts weight, dim 0 the expert), and moves tokens to
the rank of their expert and back with ``all_to_all_single``. torchtitan's ``ExpertParallel`` expects its own
``GroupedExperts`` (``w1``/``w2``/``w3`` and a ``token_dispatcher``); transformers 5 has its own expert
parallelism over its fused experts (``gate_up_proj`` / ``down_proj`` of shape ``[experts, ...]``):
``transformers.distributed.expert_parallel.apply_expert_parallelism`` with the model's own
``config.base_model_ep_plan`` (``grouped_gemm``: ``Shard(0)`` over the ep mesh, ``ep_dispatch_experts``: the
experts' forward through ``AllToAllEP``: an all-to-all of the per-expert token counts, the tokens by
``all_to_all_single_autograd``, the experts on their local ids, and the outputs back by a second all-to-all). That is
what runs here (``ep_implementation="all_to_all"``, torchtitan's dispatch), with torchtitan's meshes: ep borrows
ranks from ``dp_shard`` (``E`` divides ``dp_shard``; ``dp_shard`` defaults to ``E``), the experts are further
sharded by FSDP2 over ``efsdp = dp_shard / E`` (torchtitan's ``efsdp``: the ``dp_shard`` ranks that hold the same
experts), the rest of the model over ``dp_shard``. Two meshes share no root in torch (FSDP2 requires the experts'
ep mesh and their FSDP mesh to share one), so the experts' mesh is a second one over the same ranks,
``(dp_replicate, efsdp, ep, cp, etp)`` (``etp`` of size 1: transformers' dispatch takes the group that shares a
batch, the tensor-parallel one; ep with tp is refused).

Routing is unknown under fake tensors (Note: [routing under fake tensors]): the router's ``topk`` is assumed
balanced (each expert gets ``tokens x top_k / experts`` of a rank's tokens), and the counts another rank sends,
which the fake process group does not move, are this rank's own (Note: [values after collectives]); with every rank
routing its tokens the same balanced way, a rank receives from each peer what it sends to that peer, ``tokens x
top_k / E`` rows, so the dispatch all-to-all moves ``tokens x top_k x hidden`` elements each way per layer and each
rank's experts run on ``tokens x top_k`` rows. Both are rows of ``fidelity()["assumptions"]``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = [
    "EP_ASSUMPTION", "check_cp", "check_ep", "cp_run", "derived_coordinates", "expert_parallel", "fsdp_mesh",
    "shard_own_dtypes", "with_ep_defaults",
]  # fmt: skip

EP_ASSUMPTION = (
    "expert parallel: every rank routes its {tokens} tokens the same balanced way (the router's topk assumed balanced), "
    "so it receives from each of the {ep} ranks of its ep group what it sends to that rank ({rows} rows of top_k x "
    "tokens / ep): the all-to-all's received counts are this rank's own sent counts"
)


# ------------------------------------------------------------------------------------------------ checks
def with_ep_defaults(parallel: dict[str, int]) -> dict[str, int]:
    """``parallel`` with ``dp_shard`` set to ``ep`` where ep is given without it (ep borrows dp_shard's ranks)."""
    ep = parallel.get("ep", 1)
    if isinstance(ep, int) and not isinstance(ep, bool) and ep > 1 and "dp_shard" not in parallel:
        return {**parallel, "dp_shard": ep}
    return dict(parallel)


def _text_config(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_cp(cfg: Any, cp: int, *, seq: int, dtype: Any, train: bool, new_tokens: int) -> None:
    """Refuse ``cp`` where torch's ring attention cannot run it (Note: [context parallel plans]).

    Args:
        cfg: the model's config.
        cp: the context-parallel degree.
        seq: the sequence length of the step (every cp rank holds ``seq / cp`` tokens).
        dtype: the model's dtype (``None``: the config's).
        train: a training step (else a forward).
        new_tokens: tokens to generate (refused: ring attention shards a full sequence, not a KV cache).

    Raises:
        ArgumentError: naming ``parallel`` (or ``seq``) and what to give instead.
    """
    text = _text_config(cfg)
    if new_tokens and not train:
        raise ArgumentError("parallel", {"cp": cp}, "context parallel shards a whole sequence; generate does not",
                            "Plan a training step or a forward (new_tokens=0) with cp, or generate without cp.")  # fmt: skip
    if seq % (2 * cp):
        raise ArgumentError("seq", seq, f"cp={cp} needs seq divisible by 2 x cp = {2 * cp}",
                            "torch's load balancing splits the sequence into 2 x cp equal chunks (rank r holds chunks r "
                            f"and 2cp-1-r); give seq={(seq // (2 * cp) + 1) * 2 * cp} or another multiple.")  # fmt: skip
    layer_types = getattr(text, "layer_types", None)
    windowed = {t for t in layer_types or () if t != "full_attention"}
    if layer_types is None and getattr(text, "sliding_window", None):
        windowed = {"sliding_attention"}
    if windowed:
        raise ArgumentError("parallel", {"cp": cp}, f"{type(cfg).__name__} has {sorted(windowed)} attention layers",
                            "Ring attention can only express full causal attention (accelerate refuses these models "
                            "too); plan it without cp.")  # fmt: skip
    heads, kv = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    dt = dtype if isinstance(dtype, torch.dtype) else getattr(text, "dtype", None)
    dt = dt if isinstance(dt, torch.dtype) else torch.float32
    if dt == torch.float32 and isinstance(heads, int) and isinstance(kv, int) and kv < heads:
        raise ArgumentError("parallel", {"cp": cp}, f"float32 with grouped-query attention ({kv} key/value heads, "
                            f"{heads} query heads) runs SDPA's math kernel, which torch's ring attention does not take",
                            "Give dtype='bfloat16' (flash attention) for a cp plan.")  # fmt: skip


def _num_experts(cfg: Any) -> int | None:
    text = _text_config(cfg)
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        n = getattr(text, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return None


def check_ep(cfg: Any, parallel: dict[str, int]) -> None:
    """Refuse ``ep`` for a dense model, a model without an expert-parallel plan, ``ep`` not dividing the number of
    experts or ``dp_shard``, and ep with tp (Note: [expert parallel plans]).

    Args:
        cfg: the model's config.
        parallel: the degrees, ``dp_shard`` filled in (:func:`with_ep_defaults`).

    Raises:
        ArgumentError: naming ``parallel`` and what to give instead.
    """
    ep = parallel["ep"]
    experts = _num_experts(cfg)
    name = type(cfg).__name__
    if experts is None:
        raise ArgumentError("parallel", parallel, f"ep needs a mixture-of-experts model; {name} is dense",
                            "Use dp_shard / tp for a dense model, or plan a MoE model (Mixtral, Qwen3-MoE, DeepSeek-V3).")  # fmt: skip
    if not dict(getattr(_text_config(cfg), "base_model_ep_plan", None) or {}):
        raise ArgumentError("parallel", parallel, f"{name} has no expert-parallel plan (config.base_model_ep_plan)",
                            "Plan it without ep, or shard its experts in your own step with fakeviz.simulate.")  # fmt: skip
    if experts % ep:
        raise ArgumentError("parallel", parallel, f"ep={ep} does not divide the {experts} experts of {name}",
                            "Every ep rank holds experts / ep whole experts: give an ep that divides "
                            f"{experts}.")  # fmt: skip
    if parallel.get("dp_shard", 1) % ep:
        raise ArgumentError("parallel", parallel, f"ep={ep} does not divide dp_shard={parallel.get('dp_shard', 1)}",
                            "ep borrows its ranks from dp_shard (torchtitan's mesh): give a dp_shard that ep divides.")  # fmt: skip
    if parallel.get("tp", 1) > 1:
        raise ArgumentError("parallel", parallel, "ep with tp is not supported by fakeviz's plan",
                            "Give ep with dp_shard / dp_replicate / cp, or write the step and call fakeviz.simulate.")  # fmt: skip
    try:
        import transformers.distributed.expert_parallel  # noqa: F401
    except ImportError:
        raise ArgumentError("parallel", parallel, "this transformers has no expert parallelism",
                            "Install transformers >= 5 (transformers.distributed.expert_parallel).") from None  # fmt: skip


# ------------------------------------------------------------------------------------------------ meshes
def _sizes(names: tuple[str, ...], shape: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(names, shape))


def derived_coordinates(names: tuple[str, ...], shape: tuple[int, ...], ep: int) -> Callable[[dict[str, int]], Any]:
    """``coord -> (more coordinates, own key)`` for :func:`.parallel.rank_keys`: the coordinates of the meshes made
    here (``dp_shard_cp``: FSDP over dp_shard x cp; ``efsdp``, ``ep``, ``etp``: the experts' mesh) from a rank's
    coordinates on the plan's mesh, and the rank's cp coordinate as part of its key (Note: [context parallel plans]:
    cp ranks run different ring steps)."""
    sizes = _sizes(names, shape)
    cp = sizes.get("cp", 1)

    def derive(coord: dict[str, int]) -> tuple[dict[str, int], tuple[int, ...]]:
        ds, c = coord.get("dp_shard", 0), coord.get("cp", 0)
        more = {"dp_shard_cp": ds * cp + c, "etp": 0}
        if ep > 1:
            more.update(efsdp=ds // ep, ep=ds % ep)
        return more, ((c,) if cp > 1 else ())

    return derive


def fsdp_mesh(mesh: Any, names: tuple[str, ...]) -> Any:
    """The mesh FSDP2 shards the dense weights over: ``dp_shard x cp`` flattened (torchtitan's ``fsdp``), with
    ``dp_replicate`` in front for HSDP; None when there is no data or context parallelism."""
    shard = [n for n in ("dp_shard", "cp") if n in names]
    replicate = "dp_replicate" in names
    if len(shard) == 2:
        if not replicate:  # the flattened mesh itself (torch deprecates slicing a flattened dim from the root)
            return mesh[tuple(shard)]._flatten("dp_shard_cp")
        mesh[tuple(shard)]._flatten("dp_shard_cp")
        with warnings.catch_warnings():  # HSDP's 2-D view has no other spelling than a slice of the root
            warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
            return mesh[("dp_replicate", "dp_shard_cp")]
    dims = (["dp_replicate"] if replicate else []) + shard
    if not dims:
        return None
    return mesh[tuple(dims)] if len(dims) > 1 else mesh[dims[0]]


def expert_parallel(model: torch.nn.Module, mesh: Any, names: tuple[str, ...], ep: int) -> int:
    """Note: [expert parallel plans]: the experts of ``model`` sharded over ``ep`` ranks of a second mesh over the
    same ranks, their forward through transformers' ``AllToAllEP``, then each experts module FSDP-sharded over its
    ``efsdp`` ranks (before the blocks, as torchtitan). Returns the number of experts modules."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    from .._engine import torch_compat

    sizes = _sizes(names, mesh.shape)
    dims = [("dp_replicate", sizes.get("dp_replicate", 1)), ("efsdp", sizes["dp_shard"] // ep), ("ep", ep),
            ("cp", sizes.get("cp", 1)), ("etp", 1)]  # fmt: skip
    dims = [(n, s) for n, s in dims if s > 1 or n in ("efsdp", "ep", "etp")]
    sparse = init_device_mesh(mesh.device_type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
    plan = model._expand_parallel_plan(model.ep_plan)  # the model's plan, one entry per layer (transformers' own)
    apply_expert_parallelism(model, sparse["ep"], sparse["etp"], plan, ep_implementation="all_to_all")
    experts = [model.get_submodule(n) for n, style in plan.items() if style == "ep_dispatch_experts"]
    fully_shard = torch_compat.require("torch.distributed.fsdp.fully_shard")
    edp = sparse[("dp_replicate", "efsdp")] if "dp_replicate" in sizes else sparse["efsdp"]
    for module in experts:
        fully_shard(module, mesh=edp)
    return len(experts)


def shard_own_dtypes(model: torch.nn.Module, mesh: Any, fully_shard: Callable[..., Any], **kwargs: Any) -> int:
    """FSDP2 groups hold one dtype: each module whose own parameters are of another dtype than the model's (a MoE
    router kept in float32: DeepSeek-V3's ``mlp.gate``, transformers' ``_keep_in_fp32_modules_strict``) gets a
    ``fully_shard`` of its own over ``mesh`` before its block, as transformers' FSDP plan gives them their own group.
    Returns how many."""
    from torch.distributed.tensor import DTensor

    sizes: dict[torch.dtype, int] = {}
    for p in model.parameters():
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    if len(sizes) < 2:
        return 0
    main = max(sizes, key=lambda d: sizes[d])
    n = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and all(p.dtype != main and not isinstance(p, DTensor) for p in own):
            fully_shard(module, mesh=mesh, **kwargs)
            n += 1
    return n


# ------------------------------------------------------------------------------------------------ the run
@contextlib.contextmanager
def _causal_attention(model: torch.nn.Module) -> Iterator[None]:
    """accelerate's ``_attach_context_parallel_hooks``: each ``self_attn`` forward without its mask, causal."""

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = None
            kwargs["is_causal"] = True
        return args, kwargs

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "self_attn"]  # fmt: skip
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def cp_run(model: torch.nn.Module, cp_mesh: Any, *, batch: int, seq: int, train: bool,
           optimizer: torch.optim.Optimizer | None) -> None:  # fmt: skip
    """A plan's run under context parallel (Note: [context parallel plans]): a training step (or a forward) of
    ``batch x seq`` tokens whose buffers ``context_parallel`` shards over ``cp_mesh``."""
    from torch.distributed.tensor.experimental import context_parallel

    from .. import models
    from .steps import base_of, forward, train_steps

    base = base_of(model)
    models.check_seq(base, seq, 0)
    ids = models.inputs(base, batch=batch, seq=seq, labels=False)["input_ids"]
    kwargs: dict[str, Any] = {"input_ids": ids}
    if train:  # what transformers' Trainer gives a cp step: labels and the shifted labels, sharded alike
        kwargs["labels"] = ids.clone()
        kwargs["shift_labels"] = torch.nn.functional.pad(kwargs["labels"], (0, 1), value=-100)[:, 1:].contiguous()
    kwargs["position_ids"] = torch.arange(seq, device=ids.device).repeat(batch, 1)
    buffers = list(kwargs.values())
    with _causal_attention(model), context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers),
                                                    no_restore_buffers=set(buffers)):  # fmt: skip
        if train:
            train_steps(model, kwargs, optimizer=optimizer, steps=1)
        else:
            forward(model, kwargs)


def ep_assumption(settings: dict[str, Any], parallel: dict[str, int], experts_per_token: int) -> str:
    """The text of :data:`EP_ASSUMPTION` for a plan's settings."""
    tokens = settings["batch"] * settings["seq"] // parallel.get("cp", 1)
    ep = parallel["ep"]
    return EP_ASSUMPTION.format(tokens=tokens, ep=ep, rows=math.prod((tokens, experts_per_token)) // ep)


def top_k(cfg: Any) -> int:
    """The experts each token takes (``num_experts_per_tok``)."""
    text = _text_config(cfg)
    return int(getattr(text, "num_experts_per_tok", None) or getattr(text, "moe_topk", None) or 1)


# ------------------------------------------------------------------------------------------------ plan hooks
def check(model: Any, parallel: dict[str, int], shape: tuple[int, ...], names: tuple[str, ...], *, batch: int,
          seq: int, dtype: Any, train: bool, new_tokens: int) -> None:  # fmt: skip
    """:func:`check_cp` and :func:`check_ep` for a plan whose degrees ask for them, before any rank runs."""
    if "cp" not in names and parallel.get("ep", 1) <= 1:
        return
    from .. import models
    from ..models import as_dtype

    cfg = models.config(model)
    sizes = _sizes(names, shape)
    if "cp" in names:
        check_cp(cfg, sizes["cp"], seq=seq, dtype=as_dtype(dtype), train=train, new_tokens=new_tokens)
    if parallel.get("ep", 1) > 1:
        check_ep(cfg, parallel)


def state_assumptions(sim: Any, model: Any, settings: dict[str, Any]) -> None:
    """Add the expert-parallel routing assumption (Note: [expert parallel plans]) to each recorded rank's
    ``fidelity()["assumptions"]`` (a row for the whole run, ``seq`` -1)."""
    parallel = settings["parallel"]
    if parallel.get("ep", 1) <= 1:
        return
    from .. import models

    text = ep_assumption(settings, parallel, top_k(models.config(model)))
    for r in sim.ranks:
        rows = sim.trace(r).meta.setdefault("assumptions", [])
        rows.append([-1, "c10d.alltoall_base_.default", text, None, None])
