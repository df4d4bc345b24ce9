"""The tensors a pre-quantized checkpoint holds for each quantized layer, from its ``quantization_config`` alone.

Note: [pre-quantized layers from a config]
``models.build`` reads ``config.json`` only (a hub id's too), so a pre-quantized repo's layers are not in any header
it has read. Each format's layout is fixed by its config, the same for every layer: which linear layers are quantized
(all but what the config's skip list names and the output head, as transformers' quantizers decide with
``should_convert_module``) and each layer's tensors from its ``in`` / ``out`` features:

* GPTQ (bits ``b``, group ``g``; -1: one group): ``qweight`` int32 ``[in * b / 32, out]``, ``qzeros`` int32
  ``[ceil(in / g), out * b / 32]``, ``scales`` float16 ``[ceil(in / g), out]``, ``g_idx`` int32 ``[in]``;
* AWQ (GEMM): ``qweight`` int32 ``[in, out * b / 32]``, ``qzeros`` int32 ``[in / g, out * b / 32]``, ``scales``
  float16 ``[in / g, out]``;
* fp8 (FineGrainedFP8): ``weight`` float8_e4m3fn ``[out, in]``, ``weight_scale_inv`` float32 per block
  ``[ceil(out / bn), ceil(in / bk)]`` (a scalar per tensor without blocks), ``activation_scale`` for static;
* compressed-tensors 8-bit: ``weight`` ``[out, in]``, ``weight_scale`` per its strategy (``channel`` ``[out, 1]``,
  ``tensor`` ``[1]``, ``group`` ``[out, in / group]``, ``block``), ``weight_zero_point`` when asymmetric,
  ``input_scale`` ``[1]`` for static activations;
* bitsandbytes 4-bit (blocks of 64): ``weight`` uint8 ``[ceil(n / 2), 1]``, ``weight.absmax`` (uint8 with double
  quantization, then ``weight.nested_absmax`` float32 per 256 blocks and ``weight.nested_quant_map`` ``[256]``;
  float32 without), ``weight.quant_map`` ``[16]`` and the packed quant state; 8-bit: ``weight`` int8 ``[out, in]``,
  ``SCB`` float32 ``[out]``, ``weight_format``;

and the bias where the layer has one (in the model's dtype; GPTQ's and AWQ's float16). What a config cannot say: a
checkpoint that stores some layers otherwise (from_pretrained reads the headers and builds what they hold), the
nested offset's printed length in bitsandbytes' packed quant state (a state dict's length, never held), and
gptqmodel's padding of odd sizes for some kernels.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from torch import nn

from .._engine.checkpoint import TensorInfo

__all__ = ["layers_from_config"]

_F = "config.json"


def _t(dtype: torch.dtype, *shape: int) -> TensorInfo:
    return TensorInfo(dtype, tuple(shape), _F)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _skips(model: nn.Module, method: str, qc: dict[str, Any]) -> list[str]:
    """The module names (patterns) the quantizer leaves alone: its config's list plus the output head."""
    key = {"bitsandbytes": "llm_int8_skip_modules", "compressed-tensors": "ignore"}.get(
        method, "modules_to_not_convert"
    )
    skips = [str(p).removeprefix("re:") for p in (qc.get(key) or [])]
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skips += [name for name, mod in model.named_modules() if out is not None and mod is out]
    if method == "gptq" and qc.get("lm_head"):  # GPTQ's own flag: the head quantized too
        skips = [s for s in skips if s != "lm_head"]
    return skips


def _converts(name: str, skips: list[str]) -> bool:
    """transformers' ``should_convert_module``: a pattern from the start to a module boundary, as a regex, or a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{key}){boundary}", name) or name.endswith(key) for key in skips)


def layers_from_config(model: nn.Module, method: str, qc: dict[str, Any]) -> dict[str, dict[str, TensorInfo]]:
    """Layer name -> its tensors (Note: [pre-quantized layers from a config]) for every linear layer ``method``'s
    quantizer converts."""
    skips = _skips(model, method, qc)
    tensors = _LAYOUTS[method]
    return {
        name: tensors(mod, qc)
        for name, mod in model.named_modules()
        if type(mod) is nn.Linear and _converts(name, skips)
    }


def _bias(lin: nn.Linear, dtype: torch.dtype | None = None) -> dict[str, TensorInfo]:
    return {"bias": _t(dtype or lin.bias.dtype, lin.out_features)} if lin.bias is not None else {}


def _gptq(lin: nn.Linear, qc: dict[str, Any]) -> dict[str, TensorInfo]:
    i, o, b = lin.in_features, lin.out_features, int(qc.get("bits", 4))
    g = int(qc.get("group_size", 128))
    groups = _cdiv(i, g if g > 0 else i)
    return {"qweight": _t(torch.int32, i * b // 32, o), "qzeros": _t(torch.int32, groups, o * b // 32),
            "scales": _t(torch.float16, groups, o), "g_idx": _t(torch.int32, i), **_bias(lin, torch.float16)}  # fmt: skip


def _awq(lin: nn.Linear, qc: dict[str, Any]) -> dict[str, TensorInfo]:
    i, o, b = lin.in_features, lin.out_features, int(qc.get("bits", qc.get("w_bit", 4)))
    g = int(qc.get("group_size", qc.get("q_group_size", 128)))
    groups = i // (g if g > 0 else i)
    return {"qweight": _t(torch.int32, i, o * b // 32), "qzeros": _t(torch.int32, groups, o * b // 32),
            "scales": _t(torch.float16, groups, o), **_bias(lin, torch.float16)}  # fmt: skip


def _fp8(lin: nn.Linear, qc: dict[str, Any]) -> dict[str, TensorInfo]:
    i, o = lin.in_features, lin.out_features
    block = qc.get("weight_block_size")
    scale = _t(torch.float32, _cdiv(o, block[0]), _cdiv(i, block[1])) if block else _t(torch.float32)
    out = {"weight": _t(torch.float8_e4m3fn, o, i), "weight_scale_inv": scale}
    if qc.get("activation_scheme", "dynamic") == "static":
        out["activation_scale"] = _t(torch.float32)
    return {**out, **_bias(lin)}


def _compressed(lin: nn.Linear, qc: dict[str, Any]) -> dict[str, TensorInfo]:
    i, o = lin.in_features, lin.out_features
    group = next(iter((qc.get("config_groups") or {}).values()), {}) or {}
    w = group.get("weights") or {}
    dtype = torch.float8_e4m3fn if w.get("type", "float") == "float" else torch.int8
    strategy, scale_dtype = w.get("strategy", "tensor"), lin.weight.dtype
    if strategy == "channel":
        shape: tuple[int, ...] = (o, 1)
    elif strategy == "group":
        shape = (o, _cdiv(i, int(w.get("group_size") or i)))
    elif strategy == "block":
        bn, bk = w.get("block_structure") or (128, 128)
        shape = (_cdiv(o, bn), _cdiv(i, bk))
    else:
        shape = (1,)
    out = {"weight": _t(dtype, o, i), "weight_scale": _t(scale_dtype, *shape)}
    if not w.get("symmetric", True):
        out["weight_zero_point"] = _t(dtype if dtype == torch.int8 else scale_dtype, *shape)
    act = group.get("input_activations") or {}
    if act and not act.get("dynamic", True):
        out["input_scale"] = _t(scale_dtype, 1)
    return {**out, **_bias(lin)}


def _bnb(lin: nn.Linear, qc: dict[str, Any]) -> dict[str, TensorInfo]:
    i, o = lin.in_features, lin.out_features
    if qc.get("load_in_8bit") or qc.get("_load_in_8bit"):
        return {"weight": _t(torch.int8, o, i), "SCB": _t(torch.float32, o), "weight_format": _t(torch.uint8),
                **_bias(lin)}  # fmt: skip
    n, quant_type = i * o, str(qc.get("bnb_4bit_quant_type", "fp4"))
    blocks, nested = _cdiv(n, 64), bool(qc.get("bnb_4bit_use_double_quant"))
    rest: dict[str, Any] = {"quant_type": quant_type, "blocksize": 64, "dtype": str(lin.weight.dtype).strip("torch."),
                            "shape": [o, i]}  # fmt: skip
    out = {"weight": _t(torch.uint8, _cdiv(n, 2), 1), "weight.absmax": _t(torch.uint8 if nested else torch.float32,
                                                                               blocks)}  # fmt: skip
    out["weight.quant_map"] = _t(torch.float32, 16)
    if nested:
        out["weight.nested_absmax"] = _t(torch.float32, _cdiv(blocks, 256))
        out["weight.nested_quant_map"] = _t(torch.float32, 256)
        rest.update(nested_blocksize=256, nested_dtype="float32", nested_offset=0.05000000074505806)
    out[f"weight.quant_state.bitsandbytes__{quant_type}"] = _t(torch.uint8, len(json.dumps(rest)))
    return {**out, **_bias(lin)}


_LAYOUTS = {"gptq": _gptq, "awq": _awq, "fp8": _fp8, "compressed-tensors": _compressed, "bitsandbytes": _bnb}
