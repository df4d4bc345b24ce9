"""Pre-quantized bitsandbytes checkpoints: bitsandbytes' own ``Linear4bit`` / ``Linear8bitLt`` with the stored tensors.

Note: [pre-quantized bitsandbytes layers]
A bitsandbytes 4-bit checkpoint stores, for each layer, ``weight`` (uint8, two 4-bit values a byte, ``[n / 2, 1]``),
``weight.absmax`` (float32 per block of ``blocksize``, or uint8 when the statistics are themselves quantized),
``weight.quant_map`` (float32 ``[16]``), with double quantization ``weight.nested_absmax`` and
``weight.nested_quant_map`` (float32 ``[256]``), and ``weight.quant_state.bitsandbytes__nf4|fp4``: a uint8 tensor
holding a JSON text of the rest (quant type, block sizes, original dtype and shape, the nested offset). Loading it
(transformers: ``Params4bit.from_prequantized``) parses that JSON from the tensor's bytes, which a header-only read
does not have. So the :class:`bitsandbytes.functional.QuantState` is made from what the headers and the config say:
the quant type from the key, the block sizes from the element counts (``n / absmax``), the shape from the model's
layer, the dtype the model's (the unquantized tensors'); the nested offset (a float, the mean of the absmax values) is a value of the same
printed length as the stored JSON implies (a float32 value, as bitsandbytes' is), so the state dict bitsandbytes writes back has the stored tensor's shape.
The layers are bitsandbytes' own, built as transformers builds them (``replace_with_bnb_linear``: on meta, then the
stored tensors), so their forward is bitsandbytes' (its dequantize / matmul ops, as it runs them under fake tensors).

An 8-bit checkpoint stores ``weight`` (int8 ``[out, in]``), ``SCB`` (float32 ``[out]``, the row scales) and
``weight_format`` (uint8, 0 = row-major): ``Linear8bitLt(has_fp16_weights=False)`` with ``Int8Params`` holding
them, as after bitsandbytes' own quantization.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .._core.errors import CheckpointError
from .._engine.checkpoint import TensorInfo
from .._engine.quant.bnb import import_bitsandbytes

__all__ = ["maker"]

_QS = "weight.quant_state.bitsandbytes__"


def maker(qc: dict[str, Any], where: str) -> Any:
    """``(linear, tensors, device) -> bitsandbytes layer`` for a bitsandbytes ``quantization_config``."""
    try:
        import_bitsandbytes()  # inside the fake session too (Note: [bitsandbytes under fake tensors])
    except ImportError as e:
        raise CheckpointError(f"{where}: a bitsandbytes checkpoint needs bitsandbytes to build its layers\n"
                              "pip install bitsandbytes (or fakeviz[quant]).") from e  # fmt: skip
    compute = str(qc.get("bnb_4bit_compute_dtype") or "float32").removeprefix("torch.")  # BitsAndBytesConfig's default
    compute_dtype = getattr(torch, compute, None)
    if not isinstance(compute_dtype, torch.dtype):
        raise CheckpointError(f"{where}: quantization_config.bnb_4bit_compute_dtype {compute!r} is not a torch dtype")
    threshold = float(qc.get("llm_int8_threshold", 6.0))

    def make(lin: nn.Linear, tensors: dict[str, TensorInfo], device: torch.device) -> nn.Module:
        if "SCB" in tensors:
            return _linear8(lin, tensors, device, threshold)
        return _linear4(lin, tensors, device, compute_dtype, where)

    return make


def _empty(info: TensorInfo, device: torch.device) -> torch.Tensor:
    return torch.empty(info.shape, dtype=info.dtype, device=device)


def _blocksize(numel: int, blocks: int, usual: int) -> int:
    """The block size that cuts ``numel`` values into ``blocks`` blocks (the last one partial): ``usual`` (64 for the
    weight, 256 for the nested absmax, bitsandbytes' defaults) where it does, else the first power of two that does."""
    for size in (usual, *(2**k for k in range(5, 13))):
        if -(-numel // size) == blocks:
            return size
    return max(numel // max(blocks, 1), 1)


def _offset_of_length(n: int) -> float:
    """A float32 value near 0.05 (a float32 offset, read back with ``.item()``) whose ``json.dumps`` is ``n``
    characters; 0.0 where none is."""
    for k in range(1, 40):
        for m in (int(0.05 * 2**k) | 1, int(0.02 * 2**k) | 1, 1):  # m / 2**k: exact in float32, k decimals
            value = struct.unpack("<f", struct.pack("<f", m / 2**k))[0]
            if len(json.dumps(value)) == n:
                return value
    return 0.0


def _linear4(lin: nn.Linear, t: dict[str, TensorInfo], device: torch.device, compute: torch.dtype,
             where: str) -> nn.Module:  # fmt: skip
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    keys = [k for k in t if k.startswith(_QS)]
    if len(keys) != 1 or "weight" not in t or "weight.absmax" not in t or "weight.quant_map" not in t:
        raise CheckpointError(f"{where}: a bitsandbytes 4-bit layer needs weight, weight.absmax, weight.quant_map and "
                              f"one {_QS}nf4|fp4; found {', '.join(sorted(t))}")  # fmt: skip
    quant_type = keys[0].removeprefix(_QS)
    weight, absmax = t["weight"], t["weight.absmax"]
    numel = lin.in_features * lin.out_features
    blocksize = _blocksize(numel, absmax.numel, 64)
    nested = "weight.nested_absmax" in t
    dtype = lin.weight.dtype  # the dtype the weight had when quantized (the model's), which dequantizing gives back
    with torch.device("meta"):  # as transformers' replace_with_bnb_linear: no dense weight made
        new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias="bias" in t, compute_dtype=compute,
                                compress_statistics=nested, quant_type=quant_type,
                                quant_storage=weight.dtype)  # fmt: skip
    state2 = offset = None
    if nested:
        nab = t["weight.nested_absmax"]
        state2 = QuantState(absmax=_empty(nab, device), blocksize=_blocksize(absmax.numel, nab.numel, 256),
                            code=_empty(t["weight.nested_quant_map"], device), dtype=torch.float32)  # fmt: skip
        value = _offset(t[keys[0]], quant_type, blocksize, dtype, lin, state2)
        offset = torch.tensor(value, device=device)
        if getattr(offset, "constant", False) is None:  # a fake tensor: its value known, as a lifted constant's is
            with unset_fake_temporarily():  # (bitsandbytes' state dict reads it: QuantState.as_dict's .item())
                offset.constant = torch.tensor(value, device="cpu")
    qs = QuantState(absmax=_empty(absmax, device), shape=torch.Size([lin.out_features, lin.in_features]),
                    code=_empty(t["weight.quant_map"], device), blocksize=blocksize, quant_type=quant_type,
                    dtype=dtype, offset=offset, state2=state2)  # fmt: skip
    new.weight = bnb.nn.Params4bit(_empty(weight, device), requires_grad=False, quant_state=qs, blocksize=blocksize,
                                   compress_statistics=nested, quant_type=quant_type, quant_storage=weight.dtype,
                                   module=new, bnb_quantized=True)  # fmt: skip
    new.quant_state = qs
    if "bias" in t:
        new.bias = nn.Parameter(_empty(t["bias"], device), requires_grad=False)
    return new


def _offset(packed: TensorInfo, quant_type: str, blocksize: int, dtype: torch.dtype, lin: nn.Linear,
            state2: Any) -> float:  # fmt: skip
    """The nested offset: a float as long, printed, as the stored JSON leaves room for (Note: [pre-quantized
    bitsandbytes layers])."""
    rest = {
        "quant_type": quant_type, "blocksize": blocksize, "dtype": str(dtype).strip("torch."),
        "shape": (lin.out_features, lin.in_features), "nested_blocksize": state2.blocksize,
        "nested_dtype": str(state2.dtype).strip("torch."), "nested_offset": 0.0,
    }  # fmt: skip
    without = len(json.dumps(rest)) - len("0.0")  # bitsandbytes' pack_dict_to_tensor: json.dumps, utf-8
    return _offset_of_length(packed.numel - without)


def _linear8(lin: nn.Linear, t: dict[str, TensorInfo], device: torch.device, threshold: float) -> nn.Module:
    import bitsandbytes as bnb

    with torch.device("meta"):
        new = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias="bias" in t, has_fp16_weights=False,
                                  threshold=threshold)  # fmt: skip
    data, scb = _empty(t["weight"], device), _empty(t["SCB"], device)
    new.weight = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False, CB=data, SCB=scb)
    if "bias" in t:
        new.bias = nn.Parameter(_empty(t["bias"], device), requires_grad=False)
    return new
