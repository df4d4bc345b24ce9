"""The runs the front ends record: a training step, a forward, ``generate`` (the CLI's ``report`` and
``fakeviz.plan`` both run these, so a plan and a report of the same settings record the same ops), and how long
such a recorded step takes on a GPU kind (:func:`speed`: step time, tokens/s, MFU; Note: [model FLOPs])."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._analysis.timing import MATRIX_CLASSES, matmul_peak, step_start
from .._core.schema import PHASES

__all__ = [
    "CHECKPOINTING_FORMS", "OPTIMIZERS", "PolicyLabel", "Speed", "base_of", "check_checkpointing", "check_optimizer",
    "checkpointing", "checkpointing_tag", "forward", "generate", "gpu_kind",
    "import_library", "init_state", "make_optimizer", "model_dtype", "paged_bytes", "run", "MATRIX_CLASSES",
    "selective_policy", "speed",
    "step_flops", "step_start", "tokens_per_step", "train", "window_time",
]  # fmt: skip


# Note: [optimizer names]
# The optimizers fine-tuners pick, by the names ``fv.plan(optimizer=)`` and ``fakeviz report --optim`` take, each made
# by its library's public class over the parameters that train (``requires_grad``: with LoRA, the adapters only), with
# the settings transformers' Trainer gives the same ``optim=`` (Adafactor without relative steps or parameter scaling,
# as ``optim="adafactor"``; fused AdamW as ``"adamw_torch_fused"``). Their state is what each class makes at its first
# step, by its own code (:func:`init_state`): torch's AdamW two moments in the parameter's dtype; bitsandbytes' 8-bit
# AdamW one byte per element per moment plus a float32 absmax per block of 256 and two 256-entry float32 code maps,
# but 32-bit moments for a tensor under 4,096 elements (``min_8bit_size``); torchao's 8-bit / 4-bit AdamW blockwise
# subclasses (blocks of 256 / 128) for tensors of at least 4,096 elements whose size the block divides, plain
# moments otherwise; Adafactor a row and a column second moment for a matrix, a full one for a vector.
OPTIMIZERS: dict[str, str] = {
    "adamw": "torch.optim.AdamW (lr 1e-4)",
    "adamw_fused": "torch.optim.AdamW(fused=True)",
    "adam": "torch.optim.Adam",
    "adafactor": "transformers' Adafactor (no relative step, no parameter scaling: Trainer's optim='adafactor')",
    "adamw8bit": "bitsandbytes.optim.AdamW8bit",
    "paged_adamw8bit": "bitsandbytes.optim.PagedAdamW8bit (state in paged memory)",
    "adamw8bit_ao": "torchao.optim.AdamW8bit",
    "adamw4bit_ao": "torchao.optim.AdamW4bit",
    "sgd": "torch.optim.SGD (momentum 0.9)",
    "none": "no optimizer step",
}


def check_optimizer(name: Any, *, written: str | None = None) -> str:
    """``name`` as one of :data:`OPTIMIZERS` (any case); an ArgumentError naming the near names otherwise."""
    import difflib

    from .._core.errors import ArgumentError

    if isinstance(name, str) and name.strip().lower() in OPTIMIZERS:
        return name.strip().lower()
    near = tuple(difflib.get_close_matches(str(name).strip().lower(), list(OPTIMIZERS), n=3, cutoff=0.5))
    raise ArgumentError("optimizer", name, "not an optimizer fakeviz knows",
                        (f"Did you mean {near[0]!r}? " if near else "") + f"Give one of {', '.join(OPTIMIZERS)}.",
                        written=written, suggestions=near)  # fmt: skip


def import_library(module: str) -> Any:
    """``importlib.import_module(module)``, also from inside a fake GPU session: bitsandbytes (which peft, and
    transformers' trainer utilities through peft, import where it is installed) is imported first as a script's import
    does (:func:`fakeviz._engine.quant.bnb.import_bitsandbytes`: on a fake GPU it would load its CUDA backend, which a
    CPU-only torch lacks)."""
    import importlib
    import importlib.util
    import sys

    if "bitsandbytes" not in sys.modules and importlib.util.find_spec("bitsandbytes") is not None:
        from .._engine.quant.bnb import import_bitsandbytes

        import_bitsandbytes()
    return importlib.import_module(module)


def make_optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer | None:
    """The optimizer ``name`` (:data:`OPTIMIZERS`, Note: [optimizer names]) over the trainable parameters, lr 1e-4
    (SGD: 1e-3, momentum 0.9), or None for ``"none"``."""
    name = check_optimizer(name)
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "none":
        return None
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name in ("adamw", "adamw_fused"):
        return torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if name == "adamw_fused" else {}))
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adafactor":
        adafactor = import_library("transformers.optimization").Adafactor
        return adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False)
    if name in ("adamw8bit", "paged_adamw8bit"):
        bnb = import_library("bitsandbytes.optim")
        return (bnb.PagedAdamW8bit if name.startswith("paged") else bnb.AdamW8bit)(params, lr=1e-4)
    ao = import_library("torchao.optim")
    return (ao.AdamW8bit if name == "adamw8bit_ao" else ao.AdamW4bit)(params, lr=1e-4)


def paged_bytes(opt: torch.optim.Optimizer | None) -> int:
    """Bytes of ``opt``'s state in paged memory (bitsandbytes' paged optimizers mark such tensors ``is_paged``)."""
    if opt is None:
        return 0
    seen = {id(v): v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
            if isinstance(v, torch.Tensor) and getattr(v, "is_paged", False)}  # fmt: skip
    return int(sum(seen.values()))


def init_state(opt: torch.optim.Optimizer) -> None:
    """Give ``opt`` the state it holds from its first step on (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``), by
    its own code: a step on zero gradients, which are then dropped. A training step recorded after this is a
    steady-state step: the optimizer state is alive through forward and backward, as from step 2 of a real run."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def train(
    model: torch.nn.Module,
    kwargs: dict[str, Any],
    *,
    optimizer: str | torch.optim.Optimizer | None = "adamw",
    steps: int = 1,
) -> None:
    """``steps`` training steps on ``kwargs`` (which hold the labels): forward, backward, optimizer step.
    ``optimizer`` is a name (:func:`make_optimizer`, made here) or an optimizer over the model's parameters."""
    model.train()
    opt = (
        optimizer
        if optimizer is None or isinstance(optimizer, torch.optim.Optimizer)
        else make_optimizer(optimizer, model)
    )
    for _ in range(steps):
        out = model(**kwargs)
        loss = out["loss"] if isinstance(out, dict) else out[0]
        loss.backward()
        del out, loss
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)


train_steps = train  # for run(), whose ``train`` flag hides the function


def forward(model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """One inference forward, without autograd."""
    model.eval()
    with torch.no_grad():
        model(**kwargs)


def generate(model: torch.nn.Module, kwargs: dict[str, Any], new_tokens: int, *, cache: str | None = None) -> None:
    """Greedy ``generate`` of exactly ``new_tokens`` tokens after the prompt in ``kwargs`` (prefill, then one decode
    step per token, with a KV cache: transformers' default or ``cache``)."""
    model.eval()
    kwargs = {k: v for k, v in kwargs.items() if k != "decoder_input_ids"}
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.generation_config, "eos_token_id", None) or 0
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    extra = {"cache_implementation": cache} if cache is not None else {}
    with torch.no_grad():
        model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                       pad_token_id=pad, **extra)  # fmt: skip


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT model (``get_peft_model``'s result), else ``model`` itself."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) and hasattr(model, "peft_config") else model


# Note: [selective checkpointing]
# ``checkpointing=`` takes the forms torchtitan's trainer offers (``activation_checkpoint.py``), each applied to the
# model's repeated blocks (the layers transformers' switch checkpoints, else the numbered units):
#
# * ``False`` / ``"none"``: nothing; ``True`` / ``"full"``: every block's forward recomputed in backward (unchanged:
#   transformers' own switch, ``use_reentrant=False``);
# * ``"selective"``: torchtitan's op-level SAC, its ``SelectiveAC`` as of torchtitan b5bcd76 (2026-08-21): each block
#   runs under ``torch.utils.checkpoint.checkpoint(..., context_fn=create_selective_checkpoint_contexts(policy))``
#   with a policy made once per block: save (``MUST_SAVE``) the outputs of torch's compute-intensive ops
#   (``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops``: mm, addmm, bmm, SDPA flash /
#   efficient, convolution, ...), of SDPA's cuDNN / math / overrideable kernels, ``max``, ``linear``, ``topk``,
#   flex attention, and of the collectives ``reduce_scatter_tensor`` and ``all_to_all_single``, and of a cuda->cpu
#   ``_to_copy``; recompute everything else, and recompute every second ``mm`` / ``linear`` of a block (the policy
#   counts them, forward and recompute separately: the 1st, 3rd, ... are saved). torchtitan force-recomputes the mm
#   shapes of Linear modules whose name contains ``"moe.router.gate"`` (its own MoE's router); transformers' MoE
#   models name their routers otherwise (``mlp.gate``), so, as torchtitan's code would, nothing is forced there.
#   The counters live as long as the block's policy, which torchtitan makes once per block at wrap time: here once per
#   recorded step, so a recording is torchtitan's first step (a later step of a block with an odd number of mms
#   saves the other half: the counter carries over).
# * an int ``n``: torchtitan's layer SAC (``selective_ac_option=n``, removed from torchtitan in c5d93d1, 2026-06-15:
#   the rule as it was before): blocks counted from 1, a block whose count ``% n == 0`` is fully checkpointed, the
#   others run as they are (``n=1``: every block, as ``True``; ``n=2``: the 2nd, 4th, ...);
# * a function ``(ctx, op, *args, **kwargs) -> torch.utils.checkpoint.CheckpointPolicy``: the user's SAC policy,
#   given to ``create_selective_checkpoint_contexts`` for every block (one function shared by all blocks).
#
# ``settings["checkpointing"]`` holds the label: ``False``, ``True``, ``"selective"``, ``n``, or ``"policy <name>"``
# (a ``str`` that carries the function: :class:`PolicyLabel`). The recomputed ops are recorded again in the
# backward phase (the op log shows them twice); the saved ones are not.
CHECKPOINTING_FORMS = ("False, True / 'full', 'selective' (torchtitan's op-level SAC), an int n >= 1 (every n-th "
                       "block), or a policy function (ctx, op, *args, **kwargs) -> CheckpointPolicy")  # fmt: skip


class PolicyLabel(str):
    """The label of a user's checkpoint policy (``"policy my_policy"``), carrying the function (``.fn``)."""

    fn: Any

    def __new__(cls, fn: Any) -> PolicyLabel:
        label = super().__new__(cls, f"policy {getattr(fn, '__name__', type(fn).__name__)}")
        label.fn = fn
        return label


def check_checkpointing(value: Any, *, written: str | None = None) -> Any:
    """The label of ``checkpointing=`` (Note: [selective checkpointing]): ``False``, ``True``, ``"selective"``, an
    int ``n >= 1`` or a :class:`PolicyLabel`; an ArgumentError listing the forms for anything else.

    Args:
        value: ``False`` / ``None`` / ``"none"``, ``True`` / ``"full"``, ``"selective"``, an int (or its digits, as the
            command line gives it), or a policy function.
        written: how the argument was written (the command line's ``--checkpointing``).

    Returns:
        The label that ``settings["checkpointing"]`` holds and :func:`checkpointing` takes.
    """
    from .._core.errors import ArgumentError

    if value is None or value is False or value is True or isinstance(value, PolicyLabel):
        return bool(value) if not isinstance(value, PolicyLabel) else value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("none", "full", "selective"):
            return {"none": False, "full": True}.get(word, "selective")
        if word.isdigit() and int(word) >= 1:
            return int(word)
    elif isinstance(value, int) and value >= 1:
        return int(value)
    elif callable(value):
        return PolicyLabel(value)
    raise ArgumentError("checkpointing", value, f"not a checkpointing form: give {CHECKPOINTING_FORMS}",
                        written=written)  # fmt: skip


def checkpointing_tag(label: Any) -> str:
    """A short tag for plan labels: ``""``, ``"ckpt"``, ``"sac"``, ``"ckpt/2"`` (every 2nd block), ``"policy fn"``."""
    if label is False or label is None:
        return ""
    if label is True:
        return "ckpt"
    return "sac" if label == "selective" else f"ckpt/{label}" if isinstance(label, int) else str(label)


def _save_ops() -> set[Any]:
    """torchtitan's ``_get_default_save_ops()`` (Note: [selective checkpointing]): the ops whose outputs are saved,
    each looked up on this torch (one it lacks is never dispatched, so it is left out)."""
    from .._engine import torch_compat

    ops: set[Any] = set()
    default = torch_compat.lookup("torch._functorch.partitioners.get_default_op_list")
    if default is not None:
        ops |= {op.default for op in default().compute_intensive_ops}
    names = ("aten._scaled_dot_product_cudnn_attention.default", "aten._scaled_dot_product_attention_math.default",
             "aten._scaled_dot_product_fused_attention_overrideable.default", "aten.max.default",
             "aten.linear.default", "aten.topk.default", "torch._higher_order_ops.flex_attention",
             "torch._higher_order_ops.inductor_compiled_code",
             "torch.ops._c10d_functional.reduce_scatter_tensor.default",
             "torch.ops._c10d_functional.all_to_all_single.default")  # fmt: skip
    ops |= {op for op in map(torch_compat.lookup, names) if op is not None}
    return ops


def selective_policy(block: torch.nn.Module | None = None, force: tuple[str, ...] = ("moe.router.gate",)) -> Any:
    """A fresh torchtitan op-level SAC policy for one block (``SelectiveAC._get_custom_policy``; Note: [selective
    checkpointing]): ``(ctx, op, *args, **kwargs) -> CheckpointPolicy``.

    Args:
        block: the block it checkpoints (its Linear modules named by ``force`` have their mm shapes recomputed).
        force: torchtitan's ``force_recompute_mm_shapes_by_fqns``.

    Returns:
        The policy function, with its own mm counters.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    save = _save_ops()
    aten = torch.ops.aten
    mm_ops = (aten.mm.default, aten.linear.default)
    shapes = set()
    for name, sub in block.named_modules() if block is not None else ():
        if any(f in name for f in force) and isinstance(sub, torch.nn.Linear):
            out_f, in_f = sub.weight.shape
            shapes.add((in_f, out_f))
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if (func == aten._to_copy.default and "cuda" in str(args[0].device) and "device" in kwargs
                and str(kwargs["device"]) == "cpu"):  # fmt: skip
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            w = tuple(args[1].shape)
            if (w[::-1] if func == aten.linear.default else w) in shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            counts[mode] += 1
        if func in save:
            if func in mm_ops and counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _block_checkpoint(label: Any, index: int, block: torch.nn.Module) -> Any:
    """The checkpoint function of the ``index``-th block (from 0) under ``label``, or None: the block runs as is."""
    from torch.utils.checkpoint import checkpoint

    if label is True:
        return functools.partial(checkpoint, use_reentrant=False)
    if isinstance(label, int):
        return functools.partial(checkpoint, use_reentrant=False) if (index + 1) % label == 0 else None
    policy = label.fn if isinstance(label, PolicyLabel) else selective_policy(block)
    from .._engine import torch_compat

    return functools.partial(checkpoint, use_reentrant=False, context_fn=lambda: _sac_contexts(policy),
                             **torch_compat.sac_keeps_out_of_hooks())  # fmt: skip


def _sac_contexts(policy: Any) -> tuple[Any, Any]:
    """``create_selective_checkpoint_contexts(policy)``, the forward's outputs it saves marked as saved activations
    in a recording.

    Note: [selective checkpointing in a record]
    SAC keeps the outputs its policy saves in its own storage, not through autograd's saved-tensor hooks, so a
    recording (which learns what is saved from its pack hook) would count them as temporaries. When the innermost
    saved-tensor hooks at the block's start are a recording's (its ``pack_saved``; the checkpoint pushes its own only
    after this), a dispatch mode above SAC's caching mode hands each output SAC saves to that pack hook, which only
    marks its storage (an unrecorded alias is made and dropped): the bytes and the ops are unchanged, the category is
    right. Under other hooks (``offload="activations"``'s host copies) nothing is marked: torch's ``save_on_cpu``
    does not offload SAC's outputs either, and they stay temporaries on the GPU.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from .._engine import torch_compat

    decided: list[Any] = [None]

    def deciding(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        decided[0] = policy(ctx, func, *args, **kwargs)
        return decided[0]

    forward_ctx, recompute_ctx = create_selective_checkpoint_contexts(deciding)
    for k, v in torch_compat.sac_keeps_out_of_hooks().items():  # checkpoint sets it only on a bare caching mode
        setattr(forward_ctx, k, v)
    top = torch_compat.lookup("torch._C._autograd._top_saved_tensors_default_hooks")
    hooks = top(False) if top is not None else None
    if hooks is None or getattr(hooks[0], "__name__", "") != "pack_saved":
        return forward_ctx, recompute_ctx
    pack, saving = hooks[0], (True, CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)

    class MarkSaved(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            decided[0] = None  # ops SAC ignores never reach the policy
            out = func(*args, **(kwargs or {}))
            if decided[0] in saving:
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        pack(t)
            return out

    @contextlib.contextmanager
    def forward() -> Iterator[None]:
        with forward_ctx, MarkSaved():
            yield

    return forward(), recompute_ctx


def _numbered_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    from .._analysis import placement

    return [model.get_submodule(n) for n in placement.units(model) if n.rsplit(".", 1)[-1].isdigit()]


@contextlib.contextmanager
def checkpointing(model: torch.nn.Module, on: Any) -> Iterator[None]:
    """Activation checkpointing of the model's repeated blocks for the block (Note: [selective checkpointing]):
    ``on`` is any form :func:`check_checkpointing` takes. Transformers' own switch where the model has one (for
    selective forms, each layer then gets its own checkpoint function, or none), else each block's forward through
    ``torch.utils.checkpoint``."""
    label = check_checkpointing(on)
    if label is False:
        yield
        return
    if getattr(model, "supports_gradient_checkpointing", False) and hasattr(model, "gradient_checkpointing_enable"):
        # transformers 5 renamed the switch (the old name warns)
        new = hasattr(model, "activation_checkpointing_enable")
        enable = model.activation_checkpointing_enable if new else model.gradient_checkpointing_enable
        disable = model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable
        key = "activation_checkpointing_kwargs" if new else "gradient_checkpointing_kwargs"
        enable(**{key: {"use_reentrant": False}})
        try:
            if label is not True:
                from transformers.modeling_layers import GradientCheckpointingLayer

                layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
                for i, layer in enumerate(layers):
                    fn = _block_checkpoint(label, i, layer)
                    if fn is None:
                        layer.gradient_checkpointing = False
                    else:
                        layer._gradient_checkpointing_func = fn
            yield
        finally:
            disable()
        return
    saved = []
    for i, block in enumerate(_numbered_blocks(model)):
        fn = _block_checkpoint(label, i, block)
        if fn is None:
            continue
        saved.append((block, block.forward))
        block.forward = functools.partial(fn, block.forward)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for block, fwd in saved:
            block.forward = fwd  # type: ignore[method-assign]


def run(model: torch.nn.Module, *, batch: int, seq: int, train: bool, new_tokens: int,
          optimizer: torch.optim.Optimizer | str = "adamw") -> None:  # fmt: skip
    """A plan's run: one training step (AdamW by default), or ``generate`` of ``new_tokens``, or a forward. ``model``
    may be a PEFT model (its base model says what inputs it takes)."""
    from .. import models

    base = base_of(model)
    models.check_seq(base, seq, 0 if train else new_tokens)  # the prompt and what is generated after it
    kwargs = models.inputs(base, batch=batch, seq=seq, labels=train)
    if train:
        train_steps(model, kwargs, optimizer=optimizer, steps=1)
    elif new_tokens:
        generate(model, kwargs, new_tokens)
    else:
        forward(model, kwargs)


# ------------------------------------------------------------------------------------------- how long
# Note: [model FLOPs]
# MFU counts the FLOPs the model needs, not the FLOPs the GPUs ran. They are the record's FLOPs (fakeviz's per-op
# formulas) of the matrix ops (GEMMs, attention, convolutions: the tensor-core work the dense peak is the peak of;
# elementwise ops and the optimizer count none, as in the 6·N·T convention), and for a training step 3 x the forward
# phase's: the backward of a matmul is two matmuls of the forward's size, so 6·N·T (PaLM's appendix B, Megatron-LM,
# torchtitan) is 3 x the forward's 2·N·T. Inference (a forward, or ``generate``) counts the forward's once.
# Activation checkpointing recomputes blocks' forwards *during backward*: the recorder puts those ops in the backward
# phase, so they never reach the forward's FLOPs and MFU is the same with and without it; HFU (hardware FLOPs
# utilization) counts every matrix FLOP the step ran, recomputation included. Ops a tensor-parallel group runs
# whole on every rank (modules whose parameters are replicated across ``tp``: the head in fakeviz's recipe) count
# once per group in the model FLOPs (each rank's copy / tp) and on every rank in HFU. Attention counts its full,
# unmasked product (torch's formula; torchtitan's 12·L·H·Q·T counts the same).
# ``mfu = model FLOPs / (step_s x GPUs x the GPU's dense peak in the dtype the matrix ops ran in)``
# (fakeviz._core.gpu_specs, float32 without TF32): the dtype of each GEMM's inputs as recorded, so a float32 model
# under FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` or autocast is divided by the bf16 peak, and a
# step whose matrix ops ran in several dtypes by their FLOP-weighted peak (``timing.matmul_peak``); the step is the
# slowest rank's (Note: [one step] in fakeviz._analysis.timing); ``hfu`` the same with the hardware FLOPs.


@dataclass(frozen=True)
class Speed:
    """How long a recorded step takes on a GPU kind, over the whole job (all its GPUs).

    ``step`` the slowest rank's :class:`~fakeviz._analysis.timing.StepTime` (None: no estimate, ``note`` says
    why); ``tokens`` per step over all GPUs (None: unknown); ``model_flops`` and ``flops`` per step over all GPUs
    (Note: [model FLOPs]); ``peak_flops`` one GPU's dense peak in ``dtype``, the dtype the step's matrix ops ran in
    (``"torch.bfloat16"``; several: ``"torch.bfloat16 98%, torch.float32 2%"`` by FLOPs, and the FLOP-weighted peak).
    """

    gpu: str | None
    gpus: int
    tokens: int | None
    step: Any
    model_flops: float
    flops: float
    peak_flops: float
    dtype: str
    note: str = ""

    @property
    def step_s(self) -> float | None:
        return float(self.step.step_s) if self.step is not None else None

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second over the whole job (all GPUs)."""
        s = self.step_s
        return self.tokens / s if s and self.tokens is not None else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: model FLOPs / (step_s x GPUs x dense peak)."""
        s = self.step_s
        return self.model_flops / (s * self.gpus * self.peak_flops) if s and self.peak_flops else None

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization: every matrix FLOP the step ran (recomputation included) / (step_s x GPUs x
        peak)."""
        s = self.step_s
        return self.flops / (s * self.gpus * self.peak_flops) if s and self.peak_flops else None

    def text(self) -> str:
        from .._views.text import speed_text

        return speed_text(self.step_s, self.tokens_per_s, self.mfu, gpus=self.gpus, gpu=self.gpu, note=self.note)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the CLI's ``--json``): the figures, None where unknown, and the note."""
        st = self.step
        return {
            "gpu": self.gpu, "gpus": self.gpus, "dtype": self.dtype, "step_s": self.step_s, "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "hfu": self.hfu, "model_flops": self.model_flops,
            "flops": self.flops, "peak_flops": self.peak_flops, "bound": st.bound if st is not None else None,
            "gpu_s": st.gpu_s if st is not None else None, "host_s": st.host_s if st is not None else None,
            "exposed_comm_s": st.exposed_comm_s if st is not None else None, "note": self.note,
            "timed": st.timed if st is not None else None,
        }  # fmt: skip


def tokens_per_step(settings: dict[str, Any], replicas: int = 1) -> int:
    """Tokens one step of ``settings`` processes on ``replicas`` data-parallel replicas: ``batch x seq``, or for a
    generation the tokens it generates, ``batch x new_tokens``."""
    s = settings
    per = s["batch"] * (s["new_tokens"] if s["new_tokens"] and not s["train"] else s["seq"])
    return int(per * replicas)


def gpu_kind(caps: list[Any], *, written: str = "gpus") -> tuple[str | None, str]:
    """The one GPU kind of a machine's :class:`~fakeviz._core.gpus.Capacity` list, or None and why there is none."""
    kinds = {c.gpu for c in caps}
    if None in kinds:
        bare = next(c for c in caps if c.gpu is None)
        return None, (f"{written}: {bare.spec!r} is a capacity, not a GPU kind, so there is no speed to estimate "
                      "with; name the GPU (e.g. 'H100') for step time, tokens/s and MFU")  # fmt: skip
    if len(kinds) > 1:
        return None, f"{written}: GPUs of different kinds ({', '.join(sorted(kinds))}): the time model takes one kind"
    return next(iter(kinds)), ""


# the OpFeatures fields that hold op indices (shifted by a window; one before it waits for nothing in the window)
_INDEX_FIELDS = ("waits_on", "coll_after")


def window_time(trace: Any, gpu: Any, start: int = 0, *, tf32: bool = False, host_scale: float = 1.0,
                **links: Any) -> Any:  # fmt: skip
    """:func:`fakeviz._analysis.timing.step_time` of the ops from ``start`` on (``start=0``: the whole record)."""
    from .._analysis import timing

    return timing.step_time(trace, gpu, start=start, tf32=tf32, host_scale=host_scale, **links)


def step_flops(trace: Any, start: int = 0, *, replicated: Any = (), tp: int = 1) -> tuple[float, float]:
    """``(model FLOPs, hardware FLOPs)`` of the step from ``start`` on (Note: [model FLOPs]): matrix FLOPs only;
    the model's are 3 x (training) or 1 x the forward's, ops in a module of ``replicated`` (paths below the root:
    ``"lm_head"``) counted ``1 / tp``; the hardware's every one the step ran."""
    from .._analysis import timing

    f = timing.features(trace)
    matrix = np.isin(f.cls[start:], [timing.CLASSES.index(c) for c in MATRIX_CLASSES])
    flops = np.where(matrix, np.maximum(f.flops[start:], 0), 0).astype(np.float64)
    phase = np.asarray(trace.col("phase"))[start:]
    weight = np.ones(len(flops))
    if tp > 1 and replicated:
        names = tuple(replicated)
        below = tuple(f"{r}." for r in names)
        codes = [i for i, m in enumerate(trace.strings("modules"))
                 if (tail := m.partition(".")[2]) in names or tail.startswith(below)]  # fmt: skip
        weight[np.isin(np.asarray(trace.col("module"))[start:], codes)] = 1.0 / tp
    fwd = float((flops * weight)[phase == PHASES.index("forward")].sum())
    training = bool((phase == PHASES.index("backward")).any())
    return (3.0 if training else 1.0) * fwd, float(flops.sum())


def model_dtype(trace: Any) -> str:
    """The parameters' dtype that holds the most bytes (``"torch.bfloat16"``); float32 when none was seen."""
    c = trace.columns()
    codes, nbytes = c["p_dtype"].astype(np.int64), np.maximum(c["p_nbytes"].astype(np.int64), 0)
    if not len(codes):
        return "torch.float32"
    dtypes = trace.strings("dtypes")
    total = np.bincount(codes[codes >= 0], weights=nbytes[codes >= 0], minlength=len(dtypes))
    return dtypes[int(total.argmax())] if total.any() else "torch.float32"


def speed(runs: list[tuple[Any, float]], *, gpu: str | None, gpus: int, tokens: int | None, note: str = "",
          replicated: Any = (), tp: int = 1, times: list[Any] | None = None, **links: Any) -> Speed:  # fmt: skip
    """The :class:`Speed` of a job of ``gpus`` GPUs that runs ``runs`` (``(trace, how many times the job runs it)``:
    a plan's one record of the whole model, or each recorded rank with the ranks it stands for): the slowest run's
    step (``times``: their :func:`window_time` if already made), the FLOPs summed. MFU divides by the peak of the
    dtype the first run's matrix ops ran in (:func:`fakeviz._analysis.timing.matmul_peak`; a quantized model's
    dequantized matmuls run in its compute dtype); a step without matrix ops by its parameters' dtype's."""
    from .._core.gpu_specs import gpu_spec

    first = runs[0][0] if runs else None
    dtype = model_dtype(first) if first is not None else "torch.float32"
    failed = next((t for t, _ in runs if t.error), None)
    if failed is not None and not note:
        note = f"the step stopped at {failed.error.get('op')} ({failed.error.get('type')}): no time for part of a step"
    model = hw = 0.0
    for t, count in runs:
        start = step_start(t)
        m, a = step_flops(t, start, replicated=replicated, tp=tp)
        model, hw = model + m * count, hw + a * count
    if gpu is None or note or not runs:
        return Speed(gpu, gpus, tokens, None, model, hw, 0.0, dtype, note or "nothing was recorded")
    if times is None:
        times = [window_time(t, gpu, step_start(t), **links) for t, _ in runs]
    slowest = max(times, key=lambda st: st.step_s)
    peak, ran_in = matmul_peak(first, gpu, step_start(first))
    if not peak:  # no matrix op: MFU is 0 of the parameters' dtype's peak
        peak, ran_in = gpu_spec(gpu).peak_flops(dtype), dtype
    return Speed(gpu, gpus, tokens, slowest, model, hw, peak, ran_in)
