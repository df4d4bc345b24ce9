"""``quantization=`` of ``models.build`` / ``models.from_pretrained``: what it names (:func:`resolve`) and the model
quantized by its library's own code (:func:`apply`).

Note: [quantizing a built model]
bitsandbytes (``"nf4"``, ``"fp4"``, ``"int8"``, a ``transformers.BitsAndBytesConfig``) is applied as transformers'
bnb loader does it: ``replace_with_bnb_linear`` with the quantizer's modules-not-to-convert rule
(``HfQuantizer.get_modules_to_not_convert``: the output head and tied weights stay, plus
``llm_int8_skip_modules`` and the model's ``_keep_in_fp32_modules``), then each weight quantized as
``Bnb4bitQuantize`` / ``Bnb8bitQuantize`` do: ``Params4bit(value, requires_grad=False, **meta_weight.__dict__)
.to(device)`` (quant type, block size, double quantization, storage dtype from the config), ``Int8Params(
value.to("cpu"), ...).to(device)`` for LLM.int8 (its detour through host memory included), one layer after the
other, each high-precision weight freed once its layer holds the quantized one. Biases stay in the model's dtype.
Under a fake mode all of it runs on fake tensors (Note: [bitsandbytes under fake tensors] in
``fakeviz/_engine/quant/bnb.py``). transformers' loader never holds the model's high-precision linear weights
together: it makes the model on meta and reads one tensor at a time. ``build(..., quantization=...)`` does the same
for them (:func:`deferring`, a parameter-registration hook while the model is built): each ``nn.Linear`` weight
is made where the model is built and at once replaced by a meta twin (its initialisation runs on meta), and
:func:`apply` makes it on that device just before quantizing it, as the loader reads it; the weights of the
layers left unquantized (the head, unless tied to the embeddings) are made after. So a record that includes the
build peaks at the quantized model plus one high-precision weight, not at the high-precision model. A model given
to :func:`apply` already built (``from_pretrained``, a module of the caller's) is quantized layer by layer from the
weights it holds.
torchao (``"int4"``, ``"fp8"``, a torchao config) is ``models._quant_torchao.apply`` (torchao's ``quantize_``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = ["SHORT", "Deferred", "Quantization", "apply", "deferring", "resolve"]

#: The short strings ``quantization=`` takes, with what each means.
SHORT = {
    "nf4": "bitsandbytes 4-bit NF4 (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4'), bf16 compute)",
    "fp4": "bitsandbytes 4-bit FP4 (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='fp4'), bf16 compute)",
    "int8": "bitsandbytes LLM.int8 (BitsAndBytesConfig(load_in_8bit=True))",
    "int4": "torchao int4 weight-only (Int4WeightOnlyConfig)",
    "fp8": "torchao fp8 (Float8DynamicActivationFloat8WeightConfig)",
    "int8-wo": "torchao int8 weight-only (Int8WeightOnlyConfig)",
    "int8-dyn": "torchao int8 dynamic activations, int8 weights (Int8DynamicActivationInt8WeightConfig)",
    "int4-cpu": "torchao int4 weight-only in the layout it runs on a CPU (IntxWeightOnlyConfig(int4, PerGroup(32)))",
}
_TORCHAO_SHORT = ("int4", "fp8", "int8-wo", "int8-dyn", "int4-cpu")  # models._quant_torchao.SHORT
_ACCEPTED = ("the strings " + ", ".join(map(repr, SHORT)) + "; a transformers.BitsAndBytesConfig (4-bit or 8-bit); "
             "a torchao config (Int4WeightOnlyConfig, Int8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig, "
             "Float8DynamicActivationFloat8WeightConfig)")  # fmt: skip


@dataclass(frozen=True)
class Quantization:
    """A resolved ``quantization=``: the library that quantizes (``"bitsandbytes"`` | ``"torchao"``), a short label
    (``"nf4"``, ``"nf4+dq"`` with double quantization, ``"fp4"``, ``"int8"``, ``"int4"``, ``"fp8"``, or torchao's
    label of its config) and the config object the library takes."""

    library: str
    label: str
    config: Any

    def __str__(self) -> str:
        return self.label


def _refuse(value: Any, problem: str) -> ArgumentError:
    return ArgumentError("quantization", value, problem, f"Give one of {_ACCEPTED}.",
                         suggestions=tuple(SHORT))  # fmt: skip


def _bnb_config(**kwargs: Any) -> Any:
    try:
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise ArgumentError("quantization", kwargs, "bitsandbytes quantization needs transformers",
                            "pip install transformers bitsandbytes (or fakeviz[hf,quant]).") from None  # fmt: skip
    return BitsAndBytesConfig(**kwargs)


def _bnb_label(cfg: Any) -> str:
    if cfg.load_in_8bit:
        return "int8"
    return str(cfg.bnb_4bit_quant_type) + ("+dq" if cfg.bnb_4bit_use_double_quant else "")


def _is_bnb_config(obj: Any) -> bool:
    return type(obj).__name__ == "BitsAndBytesConfig" and hasattr(obj, "load_in_4bit")


def resolve(quantization: Any) -> Quantization:
    """What ``quantization=`` names: a short string (:data:`SHORT`), a ``transformers.BitsAndBytesConfig``, a torchao
    config (or transformers' ``TorchAoConfig``), or a :class:`Quantization` (as it is).

    Raises:
        ArgumentError: (a ``ValueError``) anything else, a ``BitsAndBytesConfig`` that quantizes nothing, or a
            library that is not installed; the message lists what is accepted.
    """
    if isinstance(quantization, Quantization):
        return quantization
    if isinstance(quantization, str):
        key = quantization.strip().lower()
        if key in ("nf4", "fp4"):
            cfg = _bnb_config(load_in_4bit=True, bnb_4bit_quant_type=key, bnb_4bit_compute_dtype=torch.bfloat16)
            return Quantization("bitsandbytes", key, cfg)
        if key == "int8":
            return Quantization("bitsandbytes", key, _bnb_config(load_in_8bit=True))
        if key in _TORCHAO_SHORT:
            from . import _quant_torchao

            return Quantization("torchao", key, _quant_torchao.config_for(key))
        raise _refuse(quantization, "not a quantization fakeviz knows")
    if _is_bnb_config(quantization):
        if not (quantization.load_in_4bit or quantization.load_in_8bit):
            raise _refuse(quantization, "this BitsAndBytesConfig quantizes nothing (neither load_in_4bit nor "
                                        "load_in_8bit)")  # fmt: skip
        return Quantization("bitsandbytes", _bnb_label(quantization), quantization)
    from . import _quant_torchao

    if _quant_torchao.is_torchao_config(quantization):
        return Quantization("torchao", _quant_torchao.label(quantization), quantization)
    raise _refuse(quantization, f"a {type(quantization).__name__} is not a quantization config")


def apply(model: torch.nn.Module, q: Any, deferred: Deferred | None = None) -> None:
    """Quantize ``model`` in place with ``q`` (anything :func:`resolve` takes) by its library's own code, under
    whatever (fake) mode is current (Note: [quantizing a built model])."""
    q = resolve(q)
    if q.library == "torchao":
        from . import _quant_torchao

        _quant_torchao.apply(model, q.config)
        return
    where: dict[int, Any] = {}
    if deferred is not None:
        deferred.on = False  # the layers made from here on are the quantized ones, as they are
        where = deferred.where
    _apply_bnb(model, q.config, where)


class Deferred:
    """The ``nn.Linear`` weights :func:`deferring` kept on meta: meta weight id -> the device it was made on."""

    def __init__(self) -> None:
        self.where: dict[int, Any] = {}
        self.on = False


@contextlib.contextmanager
def deferring(q: Any) -> Iterator[Deferred]:
    """While a model is built for bitsandbytes quantization (``q`` resolves to it; None or another library: nothing
    is deferred), keep each ``nn.Linear`` weight on meta (Note: [quantizing a built model]); :func:`apply` takes what
    it yields, and ends the deferral."""
    out = Deferred()
    if q is None or resolve(q).library != "bitsandbytes":
        yield out
        return
    from torch.nn.modules.module import register_module_parameter_registration_hook

    from .._engine import patches as _patches

    owner = threading.get_ident()
    others: set[int] = set()  # parameters of other modules (an embedding a head is tied to): never deferred

    def hook(module: torch.nn.Module, name: str, param: Any) -> Any:
        if not out.on or param is None or threading.get_ident() != owner:
            return None
        if type(module) is not torch.nn.Linear or name != "weight":
            others.add(id(param))
            return None
        if id(param) in others or param.device.type == "meta":
            return None
        meta = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                  requires_grad=param.requires_grad)  # fmt: skip
        out.where[id(meta)] = param.device
        return meta

    handle: list[Any] = []
    token = _patches.push_call(lambda: handle.append(register_module_parameter_registration_hook(hook)),
                               lambda: handle.pop().remove(), entry="quant-deferred-linears")  # fmt: skip
    out.on = True
    try:
        yield out
    finally:
        out.on = False
        _patches.pop(token)


def _device(where: dict[int, Any]) -> Any:
    """Where the deferred weights were made (a weight ``from_pretrained`` gave its checkpoint's dtype is a new meta
    tensor, not in the map: the model's device)."""
    return next(iter(where.values()))


def _materialize(model: torch.nn.Module, where: dict[int, Any]) -> None:
    """Deferred weights left on meta (the layers not quantized: the head) made on their device, as loaded."""
    if not where:
        return
    for mod in model.modules():
        if type(mod) is not torch.nn.Linear:
            continue
        for name, p in list(mod._parameters.items()):
            if p is not None and p.device.type == "meta":
                new = torch.empty(p.shape, dtype=p.dtype, device=where.get(id(p), _device(where)))
                setattr(mod, name, torch.nn.Parameter(new, requires_grad=p.requires_grad))


def _apply_bnb(model: torch.nn.Module, cfg: Any, where: dict[int, Any]) -> None:
    from .._engine.quant.bnb import import_bitsandbytes

    bnb = import_bitsandbytes()
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - every transformers fakeviz supports has it
        Conv1D = ()  # noqa: N806
    skip = HfQuantizer.get_modules_to_not_convert(model, cfg.llm_int8_skip_modules,
                                                  getattr(model, "_keep_in_fp32_modules", None))  # fmt: skip
    old: dict[str, tuple[Any, Any]] = {}
    for name, mod in model.named_modules():
        if (isinstance(mod, Conv1D) or type(mod) is torch.nn.Linear) and should_convert_module(name, skip):
            old[name] = (mod.weight, mod.bias)
    with _disable_current_modes():  # its layers are made on meta, as transformers' loader makes them: no memory, no op
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=cfg, pre_quantized=False)
    eight = cfg.quantization_method() == "llm_int8"
    for name in list(old):
        weight, bias = old.pop(name)
        module = model.get_submodule(name)
        if not isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            continue
        if weight.device.type == "meta" and where:  # deferred while the model was built: read it as a loader does
            value = torch.empty(weight.shape, dtype=weight.dtype, device=where.get(id(weight), _device(where)))
        else:
            value = weight.data
        del weight
        if isinstance(getattr(module, "source_cls", None), type) and Conv1D and issubclass(module.source_cls, Conv1D):
            value = value.T
        meta = module.weight.__dict__
        if eight:
            kwargs = {k: v for k, v in meta.items() if k != "SCB"}
            new = bnb.nn.Int8Params(value.to("cpu"), requires_grad=False, **kwargs).to(value.device)
        else:
            new = bnb.nn.Params4bit(value, requires_grad=False, **meta).to(value.device)
        del value
        module.weight = new
        if bias is not None:
            module.bias = torch.nn.Parameter(bias.data, requires_grad=False)
        del new, bias
    _materialize(model, where)
    model.is_loaded_in_4bit = not eight
    model.is_loaded_in_8bit = eight
    model.quantization_method = cfg.quant_method
    if getattr(model, "config", None) is not None:
        model.config.quantization_config = cfg
