"""The stages of a device-map plan (Note: [planning's pipeline] in :mod:`fakeviz._frontends.planning`), each a
function with plain data in and out:

1. :func:`resolve_model`: the model (a name, folder, config or module) -> :class:`Built`, the fake model a plan,
   a sweep or a search runs, built once;
2. :func:`measure_costs`: what each placed unit brings to its device's peak, for ``"balanced"`` (a probe
   recording placed by weights, or the last probe's record);
3. :func:`choose_placement`: the device map, from the kind asked for and those costs (``"balanced"``: a pure
   function of the costs, :func:`fakeviz._analysis.placement.balanced_map`);
4. :func:`record_step`: the step recorded as placed -> its trace;
5. :class:`Plan`: the answers (peaks, verdict, transfers, speed), read from that trace when asked.

:func:`run_plan` runs them in that order; :func:`fakeviz._frontends.planning.plan_point` checks the arguments
and calls it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .. import models
from .._analysis import placement
from .._core.errors import ArgumentError
from .._core.fmt import format_bytes
from .._core.gpus import Capacity
from . import adapters, steps
from . import offload as offloading

__all__ = [
    "Built", "Plan", "accelerate_map", "choose_placement", "machine", "measure_costs", "own_mode", "record_step",
    "resolve_model", "run_plan",
]  # fmt: skip

MAPS = ("balanced", "auto", "sequential")


# ------------------------------------------------------------------------------ 1. resolve the model
@dataclass
class Built:
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
    placed: dict[str, str] | None = None  # the device map the model was last moved by (:func:`apply_map`)
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
        with own_mode(self.model), machine(len(gpus or [0]), gpus):
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


def resolve_model(model: Any, dtype: torch.dtype | None, *, quantization: Any = None, lora: Any = None,
                  train: bool = False, gpus: list[Capacity] | None = None) -> Built:  # fmt: skip
    """``model`` built (a name, folder or config) or copied (a module) into a new fake session's mode, on cuda:0,
    quantized and with adapters when asked (:mod:`.adapters`; ``train``: QLoRA's preparation for training). A
    quantization library asks ``torch.cuda`` what the GPU can do (torchao's fp8 needs compute capability 8.9):
    ``torch.cuda`` answers as the plan's ``gpus`` while it quantizes."""
    from .._api import FakeSession
    from .._engine.session import fakeify, session_patches

    q = adapters.resolve_quantization(quantization)
    session = FakeSession()
    kind = gpus[0].gpu if gpus and all(c.gpu == gpus[0].gpu for c in gpus) else None
    gpu_session = machine(len(gpus or [0]), gpus) if q is not None else contextlib.nullcontext()
    with session_patches(), session.mode, gpu_session, adapters.quantizing(q, kind):
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
    return Built(mod, label, session, runner=ad.runner, dtype=compute, lora=ad.lora, quantization=ad.quantization)


@contextlib.contextmanager
def machine(n: int, gpus: list[Capacity] | None = None) -> Iterator[None]:
    """``torch.cuda`` answering as ``n`` fake GPUs (for transformers' device-map code), of the kind of ``gpus``."""
    from .._engine import cuda_api

    kind = gpus[0].gpu if gpus and all(c.gpu == gpus[0].gpu for c in gpus) else None
    with cuda_api.gpu_session(on=True, gpu=kind, count=n):
        yield


@contextlib.contextmanager
def own_mode(model: torch.nn.Module) -> Iterator[None]:
    """The fake mode the model's tensors belong to, with fakeviz's session patches (``Module.to`` on fake
    parameters): moves between fake devices run there, outside any recording."""
    from .._engine.session import session_patches

    p = next(model.parameters(), None)
    mode = getattr(p, "fake_mode", None)
    with session_patches(), mode if mode is not None else contextlib.nullcontext():
        yield


# --------------------------------------------------------------------------------- 2. measure costs
def measure_costs(built: Built, device_map: Any, gpus: list[Capacity], settings: dict[str, Any],
                  costs_from: Plan | None = None) -> tuple[dict[str, float] | None, int]:  # fmt: skip
    """``(costs, recordings)``: the bytes each unit of ``built.model`` (:func:`fakeviz._analysis.placement.units`)
    brings to its device's peak, for a ``"balanced"`` map (None for any other: accelerate's maps place by weights,
    a dict is given), and the recordings made to measure them.

    Where they come from: ``costs_from``, an earlier plan of the same model and step kind (a search's last probe),
    read as recorded (:func:`fakeviz._analysis.placement.unit_costs`, no recording); else, on one GPU, the weights
    alone (:func:`~fakeviz._analysis.placement.static_costs`: every unit goes there whatever it costs); else a
    probe: the step recorded as placed by weights, then what each unit's ops kept live at its device's peak
    (Note: [balanced placement])."""
    if device_map != "balanced":
        return None, 0
    mod = built.model
    names = placement.units(mod)
    train = settings["train"]
    if costs_from is not None:
        return placement.unit_costs(mod, costs_from.trace, names, train=train, device_map=costs_from.device_map), 0
    costs = placement.static_costs(mod, names, train=train)
    if len(gpus) == 1:
        return costs, 0
    by_weights = choose_placement("balanced", mod, gpus, costs)
    probe = record_step(built, by_weights, gpus, settings)
    return placement.unit_costs(mod, probe, names, train=train, device_map=by_weights), 1


# ---------------------------------------------------------------------------- 3. choose the placement
def choose_placement(device_map: Any, model: torch.nn.Module, gpus: list[Capacity],
                     costs: dict[str, float] | None = None) -> dict[str, str]:  # fmt: skip
    """The device map (module name -> ``"cuda:N"``, ``"cpu"``, ``"disk"``) for ``device_map``: a dict as given
    (ints read as ``cuda:N``); ``"auto"`` / ``"sequential"``: :func:`accelerate_map` (the model is moved to the
    cpu first, where transformers computes it); ``"balanced"``: the units cut by ``costs`` (a pure function of
    the costs, the capacities and which units share parameters:
    :func:`fakeviz._analysis.placement.balanced_map`; ``costs`` holds every unit, in model order, as
    :func:`measure_costs` gives them)."""
    if isinstance(device_map, dict):
        return {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in device_map.items()}
    if device_map in ("auto", "sequential"):
        with own_mode(model):
            model.to("cpu")
        return accelerate_map(model, device_map, gpus)
    if costs is None:
        raise ValueError("choose_placement: a balanced map needs the units' costs (measure_costs)")
    names = list(costs)
    return placement.balanced_map(names, costs, [c.bytes for c in gpus], placement.tied_groups(model, names))


def accelerate_map(model: torch.nn.Module, kind: str, gpus: list[Capacity]) -> dict[str, str]:
    """transformers' ``device_map=kind`` for these GPUs (``"auto"`` / ``"sequential"``), computed by its own code
    with the capacities as ``max_memory``; devices as ``"cuda:N"``, ``"cpu"``, ``"disk"``."""
    from transformers.integrations.accelerate import _get_device_map

    max_memory = {i: c.bytes for i, c in enumerate(gpus)}
    with machine(len(gpus)):
        dm = _get_device_map(model, kind, max_memory, None)
    return {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in dm.items()}


# ----------------------------------------------------------------------------------- 4. record the step
def _placed_device(device: str) -> str:
    return "cpu" if device == "disk" else device


def apply_map(model: torch.nn.Module, device_map: dict[str, str], placed: dict[str, str] | None = None) -> list[Any]:
    """Move each mapped module to its device (shallower names first; no moves when ``placed``, the map the model
    was last moved by, is the same) and hook it so its inputs follow; returns the hook handles."""
    from torch.utils._pytree import tree_map

    names = {n for n, _ in model.named_modules()}
    for name in device_map:
        if name not in names:  # a name the model lacks: refused with the near ones, before anything moves
            import difflib

            near = difflib.get_close_matches(name, sorted(names), 3)
            raise ArgumentError("device_map", device_map, f"{type(model).__name__} has no module {name!r}",
                                (f"Did you mean {' or '.join(map(repr, near))}? " if near else "") +
                                "Name modules as model.named_modules() does ('' is the whole model).",
                                suggestions=tuple(near))  # fmt: skip
    if placed != device_map:
        with own_mode(model):
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


def record_step(built: Built, device_map: dict[str, str], gpus: list[Capacity], settings: dict[str, Any]) -> Any:
    """The step of ``settings`` (batch, seq, train, new_tokens, checkpointing, optimizer, offload) recorded on
    ``built``'s model as ``device_map`` places it: the trace (a failed step: its partial trace, whose error says
    where). Sets ``settings["paged_bytes"]``, the optimizer state a paged optimizer keeps in unified memory."""
    from .._api import record
    from .._core.errors import RecordError

    model = built.model
    placed, built.placed = built.placed, None  # None until the moves are done
    handles = apply_map(model, device_map, placed)
    built.placed = dict(device_map)
    trace = None
    gpu = gpus[0].gpu if all(c.gpu == gpus[0].gpu for c in gpus) else None
    s = settings
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
        for p in model.parameters():
            p.grad = None
        built.session.records.clear()  # each plan keeps its own trace; the session only carries storages
    trace.meta["capacity"] = min(gpus, key=lambda c: c.bytes).spec
    return trace


# -------------------------------------------------------------------------------- 5. read the answers
@dataclass
class Plan:
    """A model placed on GPUs and run as placed (see :func:`fakeviz.plan`).

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
        return offloading.with_host_row(placement.peaks_table(self.trace, self.capacities), self.trace, self.settings)

    @property
    def transfers(self) -> pd.DataFrame:
        return placement.transfers(self.trace)

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
                           note=note)  # fmt: skip

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
        ``step_s x GPUs x`` the GPU's dense peak in the dtype the matrix ops ran in; recomputation not counted."""
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


# ----------------------------------------------------------------------------------------- the stages
def run_plan(built: Built, device_map: Any, gpus: list[Capacity], settings: dict[str, Any],
             costs_from: Plan | None = None) -> Plan:  # fmt: skip
    """Stages 2 to 5 on a resolved model: measure costs, choose the placement, record the step, the answers.
    ``settings``: the checked step (:func:`fakeviz._frontends.planning.plan_point` makes it)."""
    costs, probes = measure_costs(built, device_map, gpus, settings, costs_from)
    if device_map in ("auto", "sequential"):
        built.placed = None  # choose_placement moves the model to the cpu: the recording moves every module back
    dm = choose_placement(device_map, built.model, gpus, costs)
    trace = record_step(built, dm, gpus, settings)
    return Plan(model=built.label, gpus=gpus, device_map=dm, trace=trace, settings=settings, recordings=probes + 1,
                module=built.model)  # fmt: skip
