"""Adapters on a model that plans, sweeps and ``fakeviz report`` run: PEFT LoRA and DoRA applied by peft's own
``get_peft_model``, after ``prepare_model_for_kbit_training`` on a quantized model (QLoRA), as a fine-tuning script
does; and what ``quantization=`` and ``lora=`` are called in settings, labels and tables.

Note: [adapters in plans]
``lora=16`` is ``peft.LoraConfig(r=16, target_modules="all-linear")`` (every linear layer but the output head, as
peft resolves ``"all-linear"``; peft's other defaults: alpha 8, no dropout) with the task type of the model's task
(``CAUSAL_LM`` for a causal LM, so ``get_peft_model`` returns the wrapper a script gets); a ``LoraConfig`` is taken
as given (``use_dora=True``: DoRA). ``get_peft_model`` freezes the base model and makes the adapters in float32
(its ``autocast_adapter_dtype``), so gradients and optimizer state are the adapters' alone. With quantization
(QLoRA), ``prepare_model_for_kbit_training`` runs first: it freezes every parameter and casts the ones left in 16
bits (embeddings, norms, the head) to float32, as it does for a script, then LoRA wraps the quantized linears. Its
gradient checkpointing (``use_reentrant=False``, as :func:`.steps.checkpointing`) follows ``checkpointing=``.
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = [
    "Adapted", "apply", "build_key", "check_backward", "check_finetune", "check_parallel", "logical_numel",
    "lora_config", "lora_key", "lora_label", "quantize", "quantizing", "resolve_quantization",
]  # fmt: skip

_TASKS = {"causal_lm": "CAUSAL_LM", "seq2seq": "SEQ_2_SEQ_LM"}


def lora_config(lora: Any) -> Any:
    """``lora=`` as a ``peft.LoraConfig`` (a copy: ``get_peft_model`` writes into it), or None for None / 0 / False.

    Raises:
        ArgumentError: not a rank of at least 1 nor a ``LoraConfig``.
    """
    if lora is None or lora is False or (isinstance(lora, int) and not isinstance(lora, bool) and lora == 0):
        return None
    try:
        peft = _import_peft()
    except ImportError:
        raise ArgumentError("lora", lora, "LoRA needs peft, which is not installed",
                            "pip install peft (or fakeviz[quant]).") from None  # fmt: skip
    if isinstance(lora, int) and not isinstance(lora, bool):
        if lora < 0:
            raise ArgumentError("lora", lora, "a LoRA rank is a whole number of at least 1", "Give e.g. lora=16.")
        return peft.LoraConfig(r=lora, target_modules="all-linear")
    if isinstance(lora, peft.LoraConfig):
        return copy.deepcopy(lora)
    raise ArgumentError("lora", lora, "not a LoRA rank nor a peft.LoraConfig",
                        "Give a rank (lora=16) or peft.LoraConfig(r=16, use_dora=True, ...).")  # fmt: skip


def _import_peft() -> Any:
    """``import peft``, also from inside a fake GPU session (:func:`.steps.import_library`)."""
    from .steps import import_library

    return import_library("peft")


def lora_label(lora: Any) -> str | None:
    """``"LoRA r=16"`` / ``"DoRA r=8"`` (``+ targets`` when not all-linear) for ``lora=``; None without adapters."""
    cfg = lora_config(lora)
    if cfg is None:
        return None
    kind = "DoRA" if getattr(cfg, "use_dora", False) else "LoRA"
    targets = cfg.target_modules
    where = (
        "" if targets == "all-linear" else f" on {targets if isinstance(targets, str) else ','.join(sorted(targets))}"
    )
    return f"{kind} r={cfg.r}{where}"


def lora_key(lora: Any) -> str:
    """What tells two ``lora=`` values apart (a build is reused for the same key)."""
    cfg = lora_config(lora)
    return "" if cfg is None else repr(sorted((k, repr(v)) for k, v in cfg.to_dict().items()))


def check_finetune(train: bool, quantization: Any, lora: Any) -> None:
    """A quantized model trains adapters only: ``train=True`` with ``quantization`` needs ``lora``."""
    if train and quantization is not None and lora_config(lora) is None:
        raise ArgumentError("quantization", quantization, "quantized weights do not train (they hold no gradients)",
                            "Train adapters on them (QLoRA): give lora=16 too, or drop quantization= for full "
                            "fine-tuning.")  # fmt: skip


def check_parallel(**given: Any) -> None:
    """``plan(parallel=...)`` runs torchtitan's recipe: full-precision weights, no adapters, AdamW; anything else
    given (``quantization``, ``lora``, ``optimizer``) is refused."""
    for name, default in (("quantization", None), ("lora", None), ("optimizer", "adamw")):
        v = given.get(name, default)
        if v != default and not (name == "lora" and lora_config(v) is None):
            raise ArgumentError(name, v, "a parallel plan runs torchtitan's recipe of full-precision weights and "
                                "AdamW", f"Plan {name}= on a device map (no parallel=), or write the parallel step "
                                "yourself and call fakeviz.simulate.")  # fmt: skip


def check_backward(exc: BaseException, settings: dict[str, Any], *, written: str | None = None) -> None:
    """An ArgumentError in place of autograd's "derivative for OP is not implemented" when adapters train over
    quantized weights whose matmul kernel has no backward (torchao's int4 ``_weight_int4pack_mm``, fp8
    ``_scaled_mm``): a real run stops at the same place, as no gradient can flow below those layers."""
    found = re.search(r"derivative for (\S+) is not implemented", str(exc))
    q = settings.get("quantization")
    if found is None or q is None or not settings.get("train"):
        return
    raise ArgumentError("quantization", q, f"adapters cannot train over these weights: their matmul ({found[1]}) has "
                        "no backward in torch, so no gradient flows below them (a real run stops there too)",
                        "Train LoRA over bitsandbytes weights (quantization='nf4', 'fp4' or 'int8'), or plan "
                        "inference (train=False).", written=written) from exc  # fmt: skip


def build_key(point: dict[str, Any]) -> tuple[str, ...]:
    """What a point of a sweep builds its model from (``dtype``, ``quantization``, ``lora``; with both of the last
    two, ``train``: QLoRA prepares a model for training only): points with the same key share one build."""
    q, lora = point.get("quantization"), point.get("lora")
    qlora = q is not None and lora_config(lora) is not None
    return (str(point.get("dtype")), repr(q), lora_key(lora), str(bool(point.get("train"))) if qlora else "")


def resolve_quantization(quantization: Any) -> Any:
    """``quantization=`` resolved by :func:`fakeviz.models._quant.resolve` (None stays None)."""
    if quantization is None:
        return None
    from ..models import _quant

    return _quant.resolve(quantization)


def quantize(model: torch.nn.Module, q: Any) -> None:
    """Quantize a module in place by its library's own code (``q``: :func:`resolve_quantization`'s answer)."""
    from ..models import _quant

    _quant.apply(model, q)


@contextlib.contextmanager
def quantizing(q: Any, gpu: str | None) -> Iterator[None]:
    """A library's refusal of the GPU while it quantizes (torchao's ``assert`` that fp8 needs compute capability
    8.9) as an ArgumentError naming ``quantization=`` and the GPU; nothing else is caught."""
    try:
        yield
    except AssertionError as exc:
        if q is None:
            raise
        on = f" on {gpu}" if gpu else ""
        raise ArgumentError("quantization", str(q.label), f"{q.library} refuses it{on}: {exc}",
                            "Plan it on a GPU that has the kernels it needs (fp8: H100, H200, L4, L40S, RTX 4090), "
                            "or give another quantization ('nf4', 'int8').") from exc  # fmt: skip


def logical_numel(p: torch.Tensor) -> int:
    """The elements a parameter stands for: a bitsandbytes 4-bit weight packs two in a byte (its ``quant_state``
    keeps the shape it was quantized from); any other its ``numel()``."""
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    return int(torch.Size(shape).numel()) if shape is not None else p.numel()


@dataclass
class Adapted:
    """A model with its adapters: ``model`` the transformers model (LoRA layers inside it), ``runner`` what a
    script calls (``get_peft_model``'s wrapper, else the model), ``lora`` / ``quantization`` their labels."""

    model: torch.nn.Module
    runner: torch.nn.Module
    lora: str | None = None
    quantization: str | None = None

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.runner.parameters() if p.requires_grad]


def apply(model: torch.nn.Module, *, lora: Any = None, quantized: bool = False, train: bool = True,
          checkpointing: bool = False, quantization: str | None = None) -> Adapted:  # fmt: skip
    """Adapters on ``model`` (already quantized when ``quantized``) in the current mode (Note: [adapters in plans]):
    ``prepare_model_for_kbit_training`` first when quantized and training, then ``get_peft_model``."""
    cfg = lora_config(lora)
    if cfg is None:
        return Adapted(model, model, None, quantization)
    peft = _import_peft()

    if cfg.task_type is None:
        from .. import models

        try:
            cfg.task_type = _TASKS.get(models.task_of(model))
        except ValueError:
            pass
    label = lora_label(cfg)  # before get_peft_model writes the modules "all-linear" stands for into cfg
    with _model_mode(model), warnings.catch_warnings():
        # peft asks transformers 5 the old name of a switch (its FutureWarning is noise to a plan's user)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        if quantized and train:
            peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                 gradient_checkpointing_kwargs={"use_reentrant": False})  # fmt: skip
        runner = peft.get_peft_model(model, cfg)
    return Adapted(model, runner, label, quantization)


@contextlib.contextmanager
def _model_mode(model: torch.nn.Module) -> Iterator[None]:
    """With no mode active, the fake mode ``model`` was built in (with fakeviz's session patches), so the adapters
    are fake tensors of the same mode, on the model's fake device (Note: [build in the caller's mode])."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .._engine.session import session_patches

    mode = getattr(next(model.parameters(), None), "fake_mode", None)
    if _get_current_dispatch_mode_stack() or mode is None:
        yield
        return
    with session_patches(), mode:
        yield
