"""The precision of a module's weights as users say it: ``"bf16"``, ``"nf4+dq"``, ``"int8 weight-only"``, ``"gptq int4"``.

Duck-typed: nothing here imports bitsandbytes, torchao, peft or transformers; a tensor or module is read by its
type's name and its attributes, so a library that is not installed costs nothing and a fake tensor of a
library's type (fakeviz's fake quantization) reads as the real one.

Note: [weight precision]
A module's precision is its own weights' (``recurse=False``): a ``Linear4bit`` is ``"nf4"`` whatever its bias is,
a decoder layer has none of its own (the layer tree says ``"mixed"`` or the one its children share). What each
kind of weight reads as:

* a plain tensor: its dtype, ``"bf16"`` / ``"fp16"`` / ``"fp32"`` / ``"fp8"`` (any float8), ``"int8"``, ...;
* bitsandbytes ``Params4bit`` (its ``quant_type``, ``"nf4"`` / ``"fp4"``): ``"+dq"`` when its absmax is itself
  quantized (``compress_statistics``, ``quant_state.nested``: double quantization), whatever dtype stores the
  packed data (``uint8``, or ``bnb_4bit_quant_storage=bfloat16`` for FSDP); before it is quantized (a
  ``Params4bit`` still holding its float data, until ``.cuda()``: ``bnb_quantized`` False), its dtype, since that
  is what memory holds;
* bitsandbytes ``Int8Params`` holding int8 data (LLM.int8, ``has_fp16_weights=False``): ``"int8"``;
* torchao tensor subclasses (``Int8Tensor``, ``Int4*Tensor``, ``Float8Tensor``, ``IntxUnpackedToInt8Tensor``,
  the older ``AffineQuantizedTensor`` and ``LinearActivationQuantizedTensor``): the weight's kind and, when
  activations are quantized at run time, theirs, as :func:`fakeviz.models._quant_torchao.label` names configs:
  ``"int8 weight-only"``, ``"int8 dynamic activation, int8 weight"``, ``"fp8 dynamic activation, fp8 weight"``;
* a module with ``bits`` (GPTQ: gptqmodel's ``QuantLinear``, fakeviz's pre-quantized layers) or ``w_bit``
  (AWQ's ``WQLinear``) and a ``quant_method`` or a telling class name: ``"gptq int4"``, ``"awq int4"``;
* LoRA: peft's adapters (``lora_A.default``, ``lora_B.default``) are plain modules of their own dtype; the
  layer they wrap (``base_layer``) keeps its own. The layer tree puts them together (``"nf4 + LoRA bf16"``).

Reading a label never runs an op: only types, dtypes and attributes are read.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["dtype_label", "module_precision", "tensor_precision"]

# torch dtype names (without "torch.") -> what users call them
_DTYPE_LABELS = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int8": "int8", "uint8": "uint8",
    "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool", "complex64": "c64", "complex128": "c128",
    "float4_e2m1fn_x2": "fp4",
}  # fmt: skip


def dtype_label(dtype: Any) -> str:
    """``torch.bfloat16`` or ``"torch.bfloat16"`` -> ``"bf16"``; any float8 -> ``"fp8"``; others their name."""
    text = str(dtype).removeprefix("torch.")
    if text.startswith("float8"):
        return "fp8"
    return _DTYPE_LABELS.get(text, text)


def _torchao(t: Any, name: str) -> str | None:
    """A torchao quantized tensor's label, or None: not one of torchao's (Note: [weight precision])."""
    if name == "LinearActivationQuantizedTensor":  # the older API: an activation quantizer around a weight
        inner = getattr(t, "original_weight_tensor", None)
        w = _torchao_weight(inner, type(inner).__name__) if inner is not None else None
        act = "int8" if w in ("int8", "int4") else (w or "?")
        return f"{act} dynamic activation, {w or '?'} weight"
    w = _torchao_weight(t, name)
    if w is None:
        return None
    act = None
    if getattr(t, "act_quant_kwargs", None) is not None:  # Int8Tensor, Float8Tensor, Int4*Tensor (0.13+)
        act = "fp8" if w == "fp8" else "int8"
    aq = getattr(t, "activation_quantization", None)  # IntxUnpackedToInt8Tensor: "int8_asym_per_token"
    if isinstance(aq, str) and aq:
        act = aq.split("_", 1)[0]
    return f"{act} dynamic activation, {w} weight" if act else f"{w} weight-only"


def _torchao_weight(t: Any, name: str) -> str | None:
    """The weight's kind of a torchao tensor: ``"int8"``, ``"int4"``, ``"fp8"``, ... (None: not torchao's)."""
    if name == "AffineQuantizedTensor":  # the older API: the range of its integers says the width
        lo, hi = getattr(t, "quant_min", None), getattr(t, "quant_max", None)
        if isinstance(lo, int) and isinstance(hi, int) and hi > lo:
            return f"int{(hi - lo).bit_length()}"
        return "int?"
    if name.startswith("Intx"):  # IntxUnpackedToInt8Tensor, IntxOpaqueTensor: target_dtype torch.int1 .. int8
        return dtype_label(getattr(t, "target_dtype", "intx"))
    m = re.fullmatch(r"(Int|Float|UInt)(\d+)\w*Tensor", name)
    if m is None:
        return None
    return ("fp" if m.group(1) == "Float" else m.group(1).lower()) + m.group(2)


def tensor_precision(t: Any) -> str:
    """One weight tensor's precision (Note: [weight precision]); a plain tensor's is its dtype's label."""
    cls = type(t)
    name = cls.__name__
    dtype = getattr(t, "dtype", None)
    if name == "Params4bit" or (hasattr(t, "quant_type") and hasattr(t, "compress_statistics")):
        quantized = getattr(t, "bnb_quantized", None)  # packed data may be stored as bf16 (quant_storage, FSDP)
        if quantized is None:
            quantized = getattr(t, "quant_state", None) is not None or str(dtype) == "torch.uint8"
        if not quantized and dtype is not None:  # not quantized yet: the float data is what memory holds
            return dtype_label(dtype)
        kind = str(getattr(t, "quant_type", "4bit"))
        state = getattr(t, "quant_state", None)
        nested = bool(getattr(state, "nested", False)) if state is not None else bool(
            getattr(t, "compress_statistics", False))  # fmt: skip
        return kind + ("+dq" if nested else "")
    if name == "Int8Params" or (hasattr(t, "SCB") and hasattr(t, "has_fp16_weights")):
        return "int8" if str(dtype) == "torch.int8" else dtype_label(dtype)
    if "torchao" in (cls.__module__ or "") or (name.endswith("Tensor") and name not in ("Tensor", "FakeTensor")):
        label = _torchao(t, name)
        if label is not None:
            return label
        if name not in ("Parameter", "FakeTensor", "FunctionalTensor") and "torchao" in (cls.__module__ or ""):
            return name.removesuffix("Tensor").lower()  # a torchao format this table does not know: its type name
    return dtype_label(dtype) if dtype is not None else "?"


def _method(mod: Any) -> str | None:
    """GPTQ / AWQ from a module's ``quant_method`` or, failing that, its class name."""
    method = getattr(mod, "quant_method", None)
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    if isinstance(method, str) and method:
        return method.lower()
    cls = f"{type(mod).__module__}.{type(mod).__name__}".lower()  # gptqmodel.nn_modules.qlinear..., awq.modules...
    for key, name in (("gptq", "gptq"), ("awq", "awq"), ("wqlinear", "awq"), ("marlin", "gptq"),
                      ("exllama", "gptq")):  # fmt: skip
        if key in cls:
            return name
    return None


def module_precision(mod: Any) -> str | None:
    """The precision of a module's own weights (Note: [weight precision]), or None: it has none of its own.

    A module's own parameters are read (``_parameters``, not its children's); those whose name ends in ``weight``
    decide when there are any (a ``Linear4bit`` is ``"nf4"``, its bias bf16); parameters of different precisions
    give ``"mixed"``. A quantized layer that keeps its packed weight in buffers (GPTQ ``qweight``, AWQ) is read
    from its ``bits`` / ``w_bit`` and ``quant_method``.
    """
    bits = getattr(mod, "bits", None)
    if not isinstance(bits, int) or isinstance(bits, bool):
        bits = getattr(mod, "w_bit", None)
    if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 16:
        method = _method(mod)
        if method is not None or "qweight" in getattr(mod, "_buffers", {}) or "qweight" in getattr(
                mod, "_parameters", {}):  # fmt: skip
            return f"{method} int{bits}" if method else f"int{bits}"
    params = {k: v for k, v in (getattr(mod, "_parameters", None) or {}).items() if v is not None}
    if not params:
        return None
    weights = {k: v for k, v in params.items() if k.endswith("weight")} or params
    labels = {tensor_precision(v) for v in weights.values()}
    return labels.pop() if len(labels) == 1 else "mixed"
