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
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .. import models
from .._analysis import placement as _placement
from .._core.errors import ArgumentError
from .._core.fmt import format_bytes
from .._core.gpus import Capacity, parse_gpus
from . import adapters, executors, ranking, steps
from . import offload as offloading
from .progress import progress_bar

__all__ = ["Plan", "compare", "max_batch", "max_seq", "plan", "sweep"]

MAPS = ("balanced", "auto", "sequential")


# ----------------------------------------------------------------------------------------------- Plan
@dataclass
class Plan:
    """A model placed on GPUs and run as placed (see :func:`plan`).

    ``device_map``: module name -> ``"cuda:N"`` (or ``"cpu"`` where an accelerate map offloads), the dict
    transformers' ``from_pretrained(device_map=...)`` takes; ``trace``: the record of the step;
    ``peaks``: one row per GPU (weights, gradients, optimizer, kv_cache, activations, temporaries, other,
    peak, capacity, headroom, fits); ``transfers``: bytes moved per device boundary; ``fits``; ``module``: the
    fake model the plan ran, placed by ``device_map`` (a copy when a module was passed: the plan leaves the
    user's model where it was; the points of one sweep share it, placed as the last one ran).
    """

    model: str
    gpus: list[Capacity]
    device_map: dict[str, str]
    trace: Any
    settings: dict[str, Any]
    recordings: int = 1
    module: torch.nn.Module | None = None

    @property
    def capacities(self) -> dict[str, int]:
        return {f"cuda:{i}": c.bytes for i, c in enumerate(self.gpus)}

    @functools.cached_property
    def verdict(self) -> dict[str, Any]:
        """The verdict of the record with each GPU's own capacity (:func:`fakeviz._analysis.verdict.verdict`)."""
        from .._analysis.verdict import verdict

        return verdict(self.trace, self.capacities)

    @property
    def offloaded(self) -> list[str]:
        """The modules the map put on the cpu or disk (accelerate's maps offload what does not fit)."""
        return [k for k, d in self.device_map.items() if not d.startswith("cuda")]

    @property
    def fits(self) -> bool:
        """True when every GPU fits, the run completed, and nothing was offloaded to the cpu or disk."""
        return bool(self.verdict["fits"]) and not self.offloaded

    @property
    def peaks(self) -> pd.DataFrame:
        return offloading.with_host_row(_placement.peaks_table(self.trace, self.capacities), self.trace, self.settings)

    @property
    def transfers(self) -> pd.DataFrame:
        return _placement.transfers(self.trace)

    @property
    def first_oom(self) -> dict[str, Any] | None:
        """Where the plan first runs out of memory (device, op, module, line), None when it fits."""
        for dev, v in self.verdict["devices"].items():
            if not v["fits"] and v.get("first_oom"):
                return {"device": dev, **v["first_oom"]}
        return None

    @property
    def fit_text(self) -> str:
        """The verdict, with what the map offloaded and the optimizer state that is paged."""
        t = self.verdict["text"]
        if self.offloaded:
            t = f"does not fit on the GPUs: the map offloads {len(self.offloaded)} modules to cpu/disk; " + t
        if self.settings.get("paged_bytes"):
            t += (f" ({format_bytes(self.settings['paged_bytes'])} of it paged optimizer state: CUDA unified memory, "
                  "counted on the GPU; the driver moves pages to host memory when the GPU runs out)")  # fmt: skip
        return t

    @property
    def text(self) -> str:
        """One line: the verdict, with what the map offloaded, then the step time, tokens/s and MFU (or why not)."""
        return f"{self.fit_text}; {self.speed.text()}"

    # ---------------------------------------------------------------------------------------- how long
    @functools.cached_property
    def speed(self) -> steps.Speed:
        """How long the recorded step takes on the plan's GPU kind (:class:`~fakeviz._frontends.steps.Speed`):
        the time model (:meth:`fakeviz.Trace.step_time`) on the step's ops, tokens over the whole machine, model
        FLOPs (Note: [model FLOPs] in :mod:`fakeviz._frontends.steps`). A capacity without a GPU kind (``"80GB"``),
        GPUs of several kinds, or a map that offloads to the cpu give no time; ``speed.note`` says which."""
        gpu, note = steps.gpu_kind(self.gpus)
        if not note and self.offloaded:
            note = f"the map offloads {len(self.offloaded)} modules to cpu/disk, and the time model covers GPUs only"
        return steps.speed([(self.trace, 1)], gpu=gpu, gpus=len(self.gpus), tokens=steps.tokens_per_step(self.settings),
                           note=note, dtype=self.settings.get("dtype"))  # fmt: skip

    @property
    def step_s(self) -> float | None:
        """Estimated seconds per step on the plan's GPUs (None: no GPU kind, ``speed.note`` says why)."""
        return self.speed.step_s

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second over all the plan's GPUs: ``batch x seq`` per step (a generation: ``batch x
        new_tokens``, the tokens it generates) over :attr:`step_s`."""
        return self.speed.tokens_per_s

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: 3 x the forward's FLOPs for training (the forward's for inference) over
        ``step_s x GPUs x`` the GPU's dense peak in the model's dtype; recomputation not counted."""
        return self.speed.mfu

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization: every matrix FLOP the step ran (recomputation included), as :attr:`mfu`."""
        return self.speed.hfu

    def explore(self, **kw: Any) -> Any:
        """The explorer of this plan's record, with its GPUs' capacity."""
        return self.trace.explore(min(self.gpus, key=lambda c: c.bytes).spec, **kw)

    @property
    def finetune(self) -> str:
        """What the plan's weights and training are beyond the model: ``"nf4, LoRA r=16, adamw8bit"`` ("" for none;
        the optimizer named when it is not AdamW)."""
        s = self.settings
        opt = s.get("optimizer")
        return ", ".join(x for x in (s.get("quantization"), s.get("lora"), opt if opt not in (None, "adamw") else None)
                         if x)  # fmt: skip

    @property
    def label(self) -> str:
        """A short name for tables and comparisons: ``"balanced b1 s2048 train ckpt nf4, LoRA r=16"``."""
        s = self.settings
        run = "train" if s["train"] else (f"gen {s['new_tokens']}" if s["new_tokens"] else "fwd")
        tag = steps.checkpointing_tag(s["checkpointing"])
        head = f"{s['device_map_kind']} b{s['batch']} s{s['seq']} {run}" + (f" {tag}" if tag else "")
        return head + (f" {self.finetune}" if self.finetune else "")

    def __repr__(self) -> str:
        s = self.settings
        run = "train" if s["train"] else (f"generate {s['new_tokens']}" if s["new_tokens"] else "forward")
        extra = f", {self.finetune}" if self.finetune else ""
        return (f"Plan({self.model}, {len(self.gpus)} GPUs, {s['device_map_kind']}, batch={s['batch']}, "
                f"seq={s['seq']}, {run}{extra}): {self.text}")  # fmt: skip


# ------------------------------------------------------------------------------------------ helpers
def _dtype(dtype: Any) -> torch.dtype | None:
    from ..models import as_dtype

    return as_dtype(dtype)


@dataclass
class _Built:
    """The fake model a plan, a sweep or a search runs, built once (per dtype) and reused by every point.

    Note: [one fake mode per sweep]
    The model lives in the fake mode of a :class:`~fakeviz.FakeSession`, and each point records with that
    session: the parameters are the record's own tensors, not converted into a new fake mode at every
    recording (for Llama-3.1-8B that conversion was a third of a point's time), and what one point leaves
    alive (the parameters, the optimizer state) is carried into the next as existing before it (Note:
    [carried storages]). A module the user passes is copied into that mode (:func:`fakeviz.fakeify`: tied
    weights stay tied), so the plan never moves the user's own model. For training, ``optimizer`` is an AdamW
    over the parameters whose state was made once by its own code (:func:`.steps.init_state`): every
    recorded training step is a steady-state step, the state alive through forward and backward as from the
    second step of a real run on (the first step's peak is never the larger: there the state is made only
    at ``step()``).
    """

    model: torch.nn.Module
    label: str
    session: Any
    optimizer: torch.optim.Optimizer | None = None
    placed: dict[str, str] | None = None  # the device map the model was last moved by (:func:`_apply`)
    runner: torch.nn.Module | None = None  # what a step calls: the PEFT model with lora=, else the model
    dtype: str = ""  # the compute dtype (a quantized model's, not its packed weights')
    lora: str | None = None  # labels of lora= and quantization= (:mod:`.adapters`)
    quantization: str | None = None
    optimizer_name: str = ""

    def train_optimizer(self, name: str = "adamw", gpus: list[Capacity] | None = None) -> torch.optim.Optimizer | None:
        """The optimizer ``name`` of training steps (None for ``"none"``), its state made (once per name, with
        ``torch.cuda`` answering as ``gpus``: bitsandbytes synchronizes the device) and on its parameters' devices (a
        map moves them)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = self.optimizer
        if name == "none":
            self.optimizer, self.optimizer_name = None, name
            return None
        with _own_mode(self.model), _machine(len(gpus or [0]), gpus):
            if (opt is None or self.optimizer_name != name
                    or [id(p) for g in opt.param_groups for p in g["params"]] != [id(p) for p in params]):  # fmt: skip
                self.optimizer = None  # the last one's state goes before the next is made
                opt = self.optimizer = steps.make_optimizer(name, self.model)
                self.optimizer_name = name
                steps.init_state(opt)
            for p, st in opt.state.items():
                for k, v in st.items():  # AdamW keeps ``step`` on the cpu unless capturable/fused
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.device != p.device:
                        st[k] = v.to(p.device)
        return opt


def _build(model: Any, dtype: torch.dtype | None, *, quantization: Any = None, lora: Any = None,
           train: bool = False, gpus: list[Capacity] | None = None) -> _Built:  # fmt: skip
    """``model`` built (a name, folder or config) or copied (a module) into a new fake session's mode, on cuda:0,
    quantized and with adapters when asked (:mod:`.adapters`; ``train``: QLoRA's preparation for training). A
    quantization library asks ``torch.cuda`` what the GPU can do (torchao's fp8 needs compute capability 8.9):
    ``torch.cuda`` answers as the plan's ``gpus`` while it quantizes."""
    from .._api import FakeSession
    from .._engine.session import fakeify, session_patches

    q = adapters.resolve_quantization(quantization)
    session = FakeSession()
    kind = gpus[0].gpu if gpus and all(c.gpu == gpus[0].gpu for c in gpus) else None
    machine = _machine(len(gpus or [0]), gpus) if q is not None else contextlib.nullcontext()
    with session_patches(), session.mode, machine, adapters.quantizing(q, kind):
        if isinstance(model, torch.nn.Module):
            mod = fakeify(model, mode=session.mode, device="cuda:0")
            if dtype is not None:
                mod = mod.to(dtype)
            if q is not None:
                adapters.quantize(mod, q)
            label = type(model).__name__
        else:
            label = model if isinstance(model, str) else type(model).__name__
            extra = {"quantization": quantization} if q is not None else {}
            mod = models.build(model, device="cuda:0", dtype=dtype, **extra)
        compute = str(next((p.dtype for p in mod.parameters() if p.dtype.is_floating_point), torch.float32))
        # QLoRA's own preparation enables no checkpointing here: each point switches it as asked
        # (:func:`.steps.checkpointing`, the same ``use_reentrant=False`` switch; Note: [adapters in plans])
        ad = adapters.apply(mod, lora=lora, quantized=q is not None, train=train, checkpointing=False,
                            quantization=None if q is None else str(q.label))  # fmt: skip
    return _Built(mod, label, session, runner=ad.runner, dtype=compute, lora=ad.lora, quantization=ad.quantization)


@contextlib.contextmanager
def _machine(n: int, gpus: list[Capacity] | None = None) -> Iterator[None]:
    """``torch.cuda`` answering as ``n`` fake GPUs (for transformers' device-map code), of the kind of ``gpus``."""
    from .._engine import cuda_api

    kind = gpus[0].gpu if gpus and all(c.gpu == gpus[0].gpu for c in gpus) else None
    with cuda_api.gpu_session(on=True, gpu=kind, count=n):
        yield


def accelerate_map(model: torch.nn.Module, kind: str, gpus: list[Capacity]) -> dict[str, str]:
    """transformers' ``device_map=kind`` for these GPUs (``"auto"`` / ``"sequential"``), computed by its own code
    with the capacities as ``max_memory``; devices as ``"cuda:N"``, ``"cpu"``, ``"disk"``."""
    from transformers.integrations.accelerate import _get_device_map

    max_memory = {i: c.bytes for i, c in enumerate(gpus)}
    with _machine(len(gpus)):
        dm = _get_device_map(model, kind, max_memory, None)
    return {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in dm.items()}


def _placed_device(device: str) -> str:
    return "cpu" if device == "disk" else device


def _apply(model: torch.nn.Module, device_map: dict[str, str], placed: dict[str, str] | None = None) -> list[Any]:
    """Move each mapped module to its device (shallower names first; no moves when ``placed``, the map the model
    was last moved by, is the same) and hook it so its inputs follow; returns the hook handles."""
    from torch.utils._pytree import tree_map

    if placed != device_map:
        with _own_mode(model):
            # from a clean slate: what an earlier plan moved and this map does not name starts on the first device
            model.to(torch.device(next((d for d in device_map.values() if d.startswith("cuda")), "cuda:0")))
            for name in sorted(device_map, key=lambda k: (k.count(".") + (k != ""), k)):
                dev = torch.device(_placed_device(device_map[name]))
                (model.get_submodule(name) if name else model).to(dev)

    def mover(dev: torch.device) -> Callable[..., Any]:
        def move(x: Any) -> Any:
            return x.to(dev) if isinstance(x, torch.Tensor) and x.device != dev else x

        def hook(mod: Any, args: Any, kwargs: Any) -> Any:
            return tree_map(move, args), tree_map(move, kwargs)

        return hook

    def called(mod: Any) -> list[Any]:
        # a ModuleList / ModuleDict is never called: its members are
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            return [m for child in mod.children() for m in called(child)]
        return [mod]

    handles = []
    for name, device in device_map.items():
        for mod in called(model.get_submodule(name) if name else model):
            hook = mover(torch.device(_placed_device(device)))
            handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def _balanced_map(
    model: torch.nn.Module, names: list[str], costs: dict[str, float], gpus: list[Capacity]
) -> dict[str, str]:
    order = _placement.balanced_partition([costs[n] for n in names], [c.bytes for c in gpus])
    dm = {n: f"cuda:{d}" for n, d in zip(names, order)}
    for later, first in _placement.tied_groups(model, names).items():
        dm[later] = dm[first]
    return dm


def _reset(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _record_step(built: _Built, device_map: dict[str, str], gpus: list[Capacity], s: dict[str, Any]) -> Any:
    from .._api import record
    from .._core.errors import RecordError

    model = built.model
    placed, built.placed = built.placed, None  # None until the moves are done
    handles = _apply(model, device_map, placed)
    built.placed = dict(device_map)
    trace = None
    gpu = gpus[0].gpu if all(c.gpu == gpus[0].gpu for c in gpus) else None
    try:
        if not s["train"]:  # a forward holds no optimizer state, whatever an earlier point of a sweep trained
            built.optimizer, built.optimizer_name = None, ""
        opt = built.train_optimizer(s.get("optimizer") or "adamw", gpus) if s["train"] else None
        s["paged_bytes"] = steps.paged_bytes(opt)
        with steps.checkpointing(model, s["checkpointing"]):
            try:
                with (
                    record(device="cuda:0", gpus=len(gpus), gpu=gpu, modules=[model], session=built.session) as trace,
                    offloading.saved_on_host(s),
                ):  # inside: Note: [saved activations on the host in a record]
                    steps.run(built.runner or model, batch=s["batch"], seq=s["seq"], train=s["train"],
                              new_tokens=s["new_tokens"], optimizer=opt)  # fmt: skip
            except RecordError as exc:  # the step failed: the partial record says where (never "fits")
                trace = exc.trace if exc.trace is not None else trace
            except RuntimeError as exc:
                adapters.check_backward(exc, s)  # adapters over a kernel torch has no backward for: said shortly
                raise
    finally:
        for h in handles:
            h.remove()
        _reset(model)
        built.session.records.clear()  # each plan keeps its own trace; the session only carries storages
    trace.meta["capacity"] = min(gpus, key=lambda c: c.bytes).spec
    return trace


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
    _built: _Built | None = None,
    _costs_from: Plan | None = None,
) -> Any:
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
            is recorded (:func:`sweep`'s ``executor``: they are independent).
        microbatches, schedule, stages, stages_per_rank: with ``parallel={"pp": P, ...}`` (pipeline stages through
            ``torch.distributed.pipelining``, Note: [pipeline plans] in :mod:`fakeviz._frontends.pipeline`): the
            microbatches ``batch`` splits into (default ``batch``: torchtitan's microbatch size 1), the schedule
            by torch's name (``"1F1B"`` default, ``"GPipe"``, ``"Interleaved1F1B"``, ``"ZBVZeroBubble"``, ...),
            the module names of each stage (default: torchtitan's even split) and the stages per rank of a
            looped schedule (default 2).

    Returns:
        A :class:`Plan`; with ``parallel``, a :class:`~fakeviz.Simulation` (per-rank peaks, classes, verdict).
    """
    optimizer = steps.check_optimizer(optimizer)
    checkpointing = steps.check_checkpointing(checkpointing)  # its label, in settings["checkpointing"]
    offload = offloading.check_offload(offload, parallel=parallel, train=train)
    adapters.lora_config(lora)  # a bad rank or config: refused before any work
    if parallel is not None:
        from .parallel import parallel_plan

        adapters.check_parallel(quantization=quantization, lora=lora, optimizer=optimizer)
        if device_map != "balanced":
            raise ValueError("parallel= and device_map= are two ways to use the GPUs: give one of them")
        _check_sizes(batch=batch, seq=seq, new_tokens=new_tokens)
        if train and new_tokens:
            raise ValueError(f"batch={batch}, seq={seq}, new_tokens={new_tokens}, train={train}: not a step to run")
        pipe = {
            "microbatches": microbatches,
            "schedule": schedule,
            "stages": stages,
            "stages_per_rank": stages_per_rank,
        }
        if isinstance(parallel, dict) and parallel.get("pp", 1) != 1:  # Note: [pipeline plans]
            from .pipeline import pipeline_plan

            return pipeline_plan(model, gpus=gpus, parallel=parallel, batch=batch, seq=seq, train=train,
                                 new_tokens=new_tokens, dtype=dtype, checkpointing=checkpointing, ranks=ranks,
                                 **{k: v for k, v in pipe.items() if v is not None})  # fmt: skip
        if any(v is not None for v in pipe.values()):
            raise ValueError(f"microbatches / schedule / stages are for a pipeline: give parallel={{'pp': P, ...}} "
                             f"with P >= 2 (parallel={parallel!r})")  # fmt: skip
        return parallel_plan(model, gpus=gpus, parallel=parallel, offload=offload, batch=batch, seq=seq, train=train,
                             new_tokens=new_tokens, dtype=dtype, checkpointing=checkpointing, ranks=ranks,
                             executor=executor)  # fmt: skip
    if any(v is not None for v in (microbatches, schedule, stages, stages_per_rank)):
        raise ValueError(
            "microbatches / schedule / stages / stages_per_rank are for a pipeline: give parallel={'pp': P}"
        )
    caps = parse_gpus(gpus)
    if isinstance(device_map, str) and device_map not in MAPS:
        raise ValueError(f"device_map={device_map!r}: use one of {', '.join(map(repr, MAPS))}, or a dict")
    _check_sizes(batch=batch, seq=seq, new_tokens=new_tokens)
    if train and new_tokens:
        raise ValueError("train=True and new_tokens: a plan is a training step or a generation, not both")
    adapters.check_finetune(train, quantization, lora)
    built = _built if _built is not None else _build(model, _dtype(dtype), quantization=quantization, lora=lora,
                                                     train=train, gpus=caps)  # fmt: skip
    mod, label = built.model, built.label
    models.check_seq(mod, seq, new_tokens)  # a sequence past the context is refused, never shortened
    settings = {"batch": batch, "seq": seq, "train": train, "new_tokens": new_tokens, "checkpointing": checkpointing,
                "dtype": built.dtype or str(next(mod.parameters()).dtype), "quantization": built.quantization,
                "lora": built.lora, "optimizer": optimizer if train else None, "offload": offload,
                "device_map_kind": device_map if isinstance(device_map, str) else "dict"}  # fmt: skip
    recordings = 0
    if isinstance(device_map, dict):
        dm = {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in device_map.items()}
    elif device_map in ("auto", "sequential"):
        _apply_all(mod, "cpu")
        built.placed = None
        dm = accelerate_map(mod, device_map, caps)
    else:
        names = _placement.units(mod)
        if _costs_from is not None:
            costs = _placement.unit_costs(mod, _costs_from.trace, names, train=train,
                                          device_map=_costs_from.device_map)  # fmt: skip
        else:
            costs = _placement.static_costs(mod, names, train=train)
            dm = _balanced_map(mod, names, costs, caps)
            if len(caps) > 1:  # a first run as placed by weights: what each module brings to its device's peak
                probe = _record_step(built, dm, caps, settings)
                recordings += 1
                costs = _placement.unit_costs(mod, probe, names, train=train, device_map=dm)
        dm = _balanced_map(mod, names, costs, caps)
    trace = _record_step(built, dm, caps, settings)
    recordings += 1
    return Plan(model=label, gpus=caps, device_map=dm, trace=trace, settings=settings, recordings=recordings,
                module=mod)  # fmt: skip


def build_for(model: Any, dtype: Any, gpus: list[Capacity]) -> _Built:
    """The fake model that every device-map point of a search (:func:`fakeviz.fit`) re-runs, built once."""
    return _build(model, _dtype(dtype), gpus=gpus)


def _check_sizes(**sizes: Any) -> None:
    """``batch`` and ``seq`` whole numbers >= 1, ``new_tokens`` >= 0: refused otherwise, never rounded."""
    for name, v in sizes.items():
        low = 0 if name == "new_tokens" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ArgumentError(name, v, f"{name} is a whole number of at least {low}",
                                f"Give e.g. {name}={max(low, 1) if name != 'seq' else 2048}.")  # fmt: skip


def _apply_all(model: torch.nn.Module, device: str) -> None:
    with _own_mode(model):
        model.to(device)


@contextlib.contextmanager
def _own_mode(model: torch.nn.Module) -> Iterator[None]:
    """The fake mode the model's tensors belong to, with fakeviz's session patches (``Module.to`` on fake
    parameters): moves between fake devices run there, outside any recording."""
    from .._engine.session import session_patches

    p = next(model.parameters(), None)
    mode = getattr(p, "fake_mode", None)
    with session_patches(), mode if mode is not None else contextlib.nullcontext():
        yield


# --------------------------------------------------------------------------------------------- sweep
_EXAMPLE = {"batch": [1, 2, 4], "seq": [2048, 8192], "dtype": ["bf16", "fp32"], "checkpointing": [False, True],
            "train": [False, True], "new_tokens": [0, 256], "quantization": [None, "nf4"], "lora": [None, 16],
            "optimizer": ["adamw", "adamw8bit"], "offload": [None, "activations"]}  # fmt: skip
_BUILT_BY = ("dtype", "quantization", "lora")  # the axes a point's model depends on: outermost, one build per value


def _build_point(model: Any, c: dict[str, Any], caps: list[Capacity]) -> _Built:
    q, lora = c.get("quantization"), c.get("lora")
    extra: dict[str, Any] = {k: v for k, v in (("quantization", q), ("lora", lora)) if v is not None}
    if q is not None:
        extra["gpus"] = caps  # torch.cuda answers as them while quantizing
    if q is not None and adapters.lora_config(lora) is not None and c.get("train"):
        extra["train"] = True  # QLoRA's preparation for training
    return _build(model, _dtype(c.get("dtype")), **extra)


def _remote_point(shared: dict[str, Any], c: dict[str, Any]) -> Plan:
    """One point of a sweep in a worker process (:mod:`.executors`): the model built once per build key."""
    model, caps = shared["model"], shared["gpus"]
    built = executors.worker_cache((repr(model), adapters.build_key(c)), lambda: _build_point(model, c, caps))
    return plan(model, gpus=caps, device_map=shared["device_map"], _built=built,
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
    None, a process pool over this machine's cores once a point is slow enough to pay for it (Note: [the default
    executor]); False, one after another in this process; or any ``concurrent.futures.Executor`` (a dask
    ``Client(...).get_executor()``). A point that fails there has ``fits`` False and its error in ``error`` and
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
    for c in combos:
        adapters.check_finetune(bool(c.get("train", False)), c.get("quantization"), c.get("lora"))
    caps = parse_gpus(gpus)
    built: dict[Any, _Built] = {}
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
        return plan(model, gpus=caps, device_map=device_map, _built=built[key],
                    **{k: v for k, v in c.items() if k != "dtype"})  # fmt: skip

    with executors.runner(model, executor) as run:
        plans = run.run(combos, local=local, remote=_remote_point, progress=bar,
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
    df.attrs["plans"] = _Plans(plans)
    df.attrs["rank_by"] = by
    df.attrs["executor"] = run.where
    return df


class _Plans(list):  # type: ignore[type-arg]
    """The plans of a sweep, on ``df.attrs["plans"]``: pandas deep-copies ``attrs`` into every frame it derives
    (a column, a filter), and a copy of each plan's model and trace would cost as much as the sweep."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _Plans:
        return self


Plans = _Plans  # :func:`fakeviz.fit`'s df.attrs["plans"] too
check_sizes = _check_sizes


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
    return plan(model, gpus=caps, _built=built, **{kw.pop("axis"): v}, **kw)


def _largest(axis: str, model: Any, gpus: Any, limit: int, executor: Any = None, **kw: Any) -> Largest:
    caps = parse_gpus(gpus)
    executors.check(executor)
    kw["optimizer"] = steps.check_optimizer(kw.get("optimizer", "adamw"))
    adapters.check_finetune(bool(kw.get("train")), kw.get("quantization"), kw.get("lora"))
    build = {"dtype": _dtype(kw.pop("dtype", None)), "quantization": kw.get("quantization"), "lora": kw.get("lora"),
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
        return plan(model, gpus=caps, _built=built, _costs_from=last[0] if alone[0] else None, **{axis: v}, **kw)

    def probe(values: list[int]) -> list[bool]:
        nonlocal recordings
        alone[0] = len(values) == 1
        shared = {"model": model, "gpus": caps, "build": build, "kw": {**kw, "axis": axis}}
        results = run.run(values, local=local, remote=_remote_probe, shared=shared, expected=limit.bit_length())
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
