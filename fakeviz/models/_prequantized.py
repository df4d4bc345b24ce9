"""Pre-quantized checkpoints: the layers a ``quantization_config`` describes, their tensors as the headers store them.

Note: [pre-quantized checkpoints]
A checkpoint saved quantized (``config.json`` carries a ``quantization_config``) holds, for each quantized linear
layer, packed tensors in place of its ``weight``. :func:`build` makes the model the config describes and swaps each
such layer (found by its tensors' names in the headers: ``<layer>.qweight``, ``<layer>.weight_scale_inv``, ...)
for a layer that holds exactly those tensors (the headers' names, dtypes and shapes; no byte of them is read):

* bitsandbytes 4-bit (``weight`` uint8 packed, ``weight.absmax``, ``weight.quant_map``, ``weight.nested_*``,
  ``weight.quant_state.bitsandbytes__nf4|fp4``) and 8-bit (``weight`` int8 + ``SCB``): bitsandbytes' own
  ``Linear4bit`` / ``Linear8bitLt`` (see :mod:`fakeviz.models._prequantized_bnb`);
* GPTQ (``quant_method: gptq``): :class:`GPTQLinear`, gptqmodel's buffers (``qweight`` int32
  ``[in * bits / 32, out]``, ``qzeros``, ``scales``, ``g_idx``, ``bias``);
* AWQ (``quant_method: awq``, GEMM layout): :class:`AWQLinear` (``qweight`` int32 ``[in, out * bits / 32]``,
  ``qzeros``, ``scales``, ``bias``);
* fp8 (``quant_method: fp8``, transformers' FineGrainedFP8): transformers' own ``FP8Linear``, built by its
  constructor (:class:`FineGrainedFP8Linear` only replaces the Triton kernel call of its ``forward``);
* compressed-tensors fp8 / int8 (``float-quantized``, ``int-quantized``, ``naive-quantized``):
  :class:`CompressedLinear` (``weight`` 8-bit ``[out, in]``, ``weight_scale``, ``input_scale``, ...).

GPTQ, AWQ, fp8 and compressed-tensors layers call kernels that cannot run here; they record the ops of
:mod:`fakeviz._engine.quant_kernels` (Note: [quantized kernels through fake rules]), which ``fidelity()`` names.
As the libraries do, GPTQ and AWQ tensors are buffers (a record counts them as ``Buffer``), fp8 and
compressed-tensors ones frozen parameters. The layers are ``nn.Linear`` subclasses without a dense weight, so peft
wraps them with LoRA as it wraps the libraries' layers, and the model is marked ``quantization_method`` as
transformers marks it (``prepare_model_for_kbit_training`` reads it). ``models.build`` of a config alone builds
the layers the config describes (Note: [pre-quantized layers from a config]).

The model is first built as the config describes and its quantized layers then replaced, as ``from_pretrained``
builds any model: inside a ``fv.record`` block that build is recorded too (the dense layers made and dropped);
call ``from_pretrained`` before the block to record only what runs.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from .._core.errors import CheckpointError, FakeVizWarning
from .._engine.checkpoint import Checkpoint, TensorInfo
from .._engine.quant_kernels import AWQ_DEQUANT_ROWS, awq_dequantize, awq_gemm, gptq_gemm, scaled_matmul
from ._build import Spec, instantiate
from ._prequantized_config import layers_from_config

__all__ = [
    "SUPPORTED",
    "AWQLinear",
    "CompressedLinear",
    "FineGrainedFP8Linear",
    "GPTQLinear",
    "PrequantizedLinear",
    "build",
    "build_layer",
    "quant_config",
]

#: The ``quant_method`` values :func:`build` reads.
SUPPORTED = ("bitsandbytes", "gptq", "awq", "fp8", "compressed-tensors")
_CT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")


class PrequantizedLinear(nn.Linear):
    """A linear layer holding a pre-quantized checkpoint's tensors as stored (buffers, or frozen parameters).

    An ``nn.Linear`` (as bitsandbytes' and transformers' quantized layers are) without a float ``weight``, so that
    code that finds linear layers by type finds it: peft wraps it with LoRA as it wraps gptqmodel's layers (the
    layer's output plus the adapter's), reading ``in_features`` / ``out_features`` and the packed weight's device.
    """

    quant_method = ""

    def __init__(self, in_features: int, out_features: int, tensors: dict[str, TensorInfo], device: torch.device,
                 parameters: bool = False) -> None:  # fmt: skip
        nn.Module.__init__(self)  # not nn.Linear's: no dense weight is made
        self.in_features, self.out_features = in_features, out_features
        if "bias" not in tensors:
            (self.register_parameter if parameters else self.register_buffer)("bias", None)
        for name, info in tensors.items():
            t = torch.empty(info.shape, dtype=info.dtype, device=device)
            if parameters:
                self.register_parameter(name, nn.Parameter(t, requires_grad=False))
            else:
                self.register_buffer(name, t)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _PackedWeight:
    @property
    def weight(self) -> torch.Tensor:
        """The packed ``qweight``: what code reading a linear layer's weight for its device gets (peft's LoRA, as
        for gptqmodel's layers); its integer dtype tells such code not to cast to it."""
        return self.qweight  # type: ignore[attr-defined]


class GPTQLinear(_PackedWeight, PrequantizedLinear):
    """A GPTQ layer: gptqmodel's buffers; ``forward`` as its ExLlamaV2 layer (float16 matmul, ``fakeviz::gptq_gemm``)."""

    quant_method = "gptq"

    def __init__(self, tensors: dict[str, TensorInfo], bits: int, group_size: int, device: torch.device) -> None:
        qweight = tensors["qweight"]
        super().__init__(qweight.shape[0] * 32 // bits, qweight.shape[1], tensors, device)
        self.bits, self.group_size = bits, group_size
        if "g_idx" not in tensors:  # gptqmodel makes it from the group size when a checkpoint has none
            group = group_size if group_size > 0 else self.in_features
            self.register_buffer("g_idx", torch.arange(self.in_features, device=device, dtype=torch.int32) // group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, shape = x.dtype, (*x.shape[:-1], self.out_features)
        if dtype != torch.float16:
            x = x.to(dtype=torch.float16)
        out = gptq_gemm(x.reshape(-1, x.shape[-1]), self.qweight, self.qzeros, self.scales, self.g_idx, self.bits)[0]
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(shape).to(dtype=dtype)


class AWQLinear(_PackedWeight, PrequantizedLinear):
    """An AWQ GEMM layer: autoawq's buffers; ``forward`` as gptqmodel's ``AwqGemmFn`` (``fakeviz::awq_gemm``)."""

    quant_method = "awq"

    def __init__(self, tensors: dict[str, TensorInfo], bits: int, group_size: int, device: torch.device) -> None:
        qweight = tensors["qweight"]
        super().__init__(qweight.shape[0], qweight.shape[1] * 32 // bits, tensors, device)
        self.bits, self.group_size = bits, group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, shape = x.dtype, (*x.shape[:-1], self.out_features)
        compute = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
        x = x.to(compute).reshape(-1, x.shape[-1])
        if x.shape[0] > AWQ_DEQUANT_ROWS:
            out = torch.matmul(x, awq_dequantize(self.qweight, self.qzeros, self.scales).to(dtype=compute))
        else:
            out = awq_gemm(x, self.qweight, self.qzeros, self.scales)[0]  # the partial sums dropped at once
        out = out + self.bias if self.bias is not None else out
        return out.reshape(shape).to(dtype=dtype)


class CompressedLinear(PrequantizedLinear):
    """A compressed-tensors 8-bit layer (fp8 or int8 ``weight [out, in]`` and its scales, frozen parameters);
    ``forward`` quantizes the activation when the config has ``input_activations`` (``fakeviz::scaled_matmul``)."""

    quant_method = "compressed-tensors"

    def __init__(self, tensors: dict[str, TensorInfo], block: list[int] | None, quantize_input: bool,
                 device: torch.device) -> None:  # fmt: skip
        weight = tensors["weight"]
        super().__init__(weight.shape[1], weight.shape[0], tensors, device, parameters=True)
        self.block_size, self.quantize_input = block, quantize_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = scaled_matmul(x, self.weight, self.weight_scale, self.block_size, getattr(self, "input_scale", None),
                            self.quantize_input)[0]  # fmt: skip
        return out + self.bias if self.bias is not None else out


def _fp8_class() -> type[nn.Module]:
    from transformers.integrations.finegrained_fp8 import FP8Linear

    class FineGrainedFP8Linear(FP8Linear):
        """transformers' ``FP8Linear``; its ``forward`` records ``fakeviz::scaled_matmul`` where transformers calls
        the finegrained-fp8 Triton kernel (activation quantized per 1 x block_k group, then the block matmul)."""

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if self.weight.element_size() > 1:
                return nn.functional.linear(input, self.weight, self.bias)
            block = list(self.block_size) if self.block_size else None
            out = scaled_matmul(input, self.weight, self.weight_scale_inv, block, self.activation_scale, True)[0]
            if self.bias is not None:
                out.add_(self.bias)
            return out

    return FineGrainedFP8Linear


FineGrainedFP8Linear: Any = None  # made on first use (imports transformers' fp8 integration)


def quant_config(spec: Spec) -> dict[str, Any] | None:
    """The ``quantization_config`` of ``spec``'s config as a dict, or None."""
    qc = getattr(spec.config, "quantization_config", None)
    if qc is None:
        return None
    where = getattr(spec.config, "name_or_path", "") or "the config"
    if not isinstance(qc, dict) and not hasattr(qc, "to_dict"):
        raise CheckpointError(f"{where}: quantization_config is {qc!r}, not an object\nA pre-quantized config holds "
                              "an object: {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}.")  # fmt: skip
    qc = dict(qc) if isinstance(qc, dict) else qc.to_dict()
    for key, ok, what in _NUMBERS if str(qc.get("quant_method", "")).lower() in ("gptq", "awq") else ():
        v = qc.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not ok(v)):
            raise CheckpointError(f"{where}: quantization_config.{key}={v!r} is not {what}\nGive {key} as the "
                                  "checkpoint's quantizer wrote it.")  # fmt: skip
    return qc


# the numbers of a quantization_config that size tensors: refused before a layer is made with them
_NUMBERS = (("bits", lambda v: v in (2, 3, 4, 8), "2, 3, 4 or 8"), ("w_bit", lambda v: v in (2, 3, 4, 8), "2, 3, 4 or 8"),
            ("group_size", lambda v: v == -1 or 1 <= v <= 2**20, "-1 (one group) or a whole number from 1 to 2**20"),
            ("q_group_size", lambda v: v == -1 or 1 <= v <= 2**20, "-1 (one group) or a whole number from 1 to 2**20"))  # fmt: skip


def _method(qc: dict[str, Any], where: str) -> str:
    method = str(qc.get("quant_method", "")).lower()
    if method not in SUPPORTED:
        raise CheckpointError(
            f"{where}: quantization_config.quant_method {qc.get('quant_method')!r} is not supported\n"
            f"fakeviz reads pre-quantized {', '.join(SUPPORTED)} checkpoints; build the unquantized model with "
            "fakeviz.models.build(name), or quantize it with build(name, quantization=...)."
        )
    return method


# Names of the tensors that mark a quantized layer in the checkpoint, per quant_method (the layer's prefix before).
_MARKERS = {
    "gptq": (".qweight",), "awq": (".qweight",), "fp8": (".weight_scale_inv",),
    "compressed-tensors": (".weight_scale",), "bitsandbytes": (".weight.absmax", ".SCB"),
}  # fmt: skip


def _layers(ckpt: Checkpoint, method: str) -> dict[str, dict[str, TensorInfo]]:
    """Checkpoint layer prefix -> its tensors (name after the prefix -> info), for each quantized layer."""
    prefixes = [k[: -len(m)] for k in ckpt.tensors for m in _MARKERS[method] if k.endswith(m)]
    layers: dict[str, dict[str, TensorInfo]] = {p: {} for p in prefixes}
    for key, info in ckpt.tensors.items():
        head, _, tail = key.rpartition(".")
        while head and head not in layers:  # bitsandbytes' names nest: weight.quant_state.bitsandbytes__nf4
            head, _, more = head.rpartition(".")
            tail = f"{more}.{tail}"
        if head in layers:
            layers[head][tail] = info
    return layers


def _module_path(model: nn.Module, prefix: str) -> str | None:
    """The model's module that a checkpoint prefix names (with or without the base model prefix), or None."""
    base = getattr(model, "base_model_prefix", "") or ""
    names = dict(model.named_modules())
    for cand in (prefix, f"{base}.{prefix}", prefix.removeprefix(f"{base}.")):
        if cand in names and isinstance(names[cand], nn.Linear):
            return cand
    return None


def _base_dtype(ckpt: Checkpoint, layers: dict[str, dict[str, TensorInfo]], spec: Spec) -> torch.dtype | None:
    """The floating dtype most unquantized tensors have (the model's compute dtype), else the config's."""
    quantized = {f"{prefix}.{name}" for prefix, tensors in layers.items() for name in tensors}
    counts: dict[torch.dtype, int] = {}
    for key, t in ckpt.tensors.items():
        if t.dtype.is_floating_point and t.dtype.itemsize > 1 and key not in quantized:
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel
    return max(counts, key=counts.__getitem__) if counts else spec.dtype


def build(spec: Spec, ckpt: Checkpoint | None, dtype: torch.dtype | None, where: str = "") -> nn.Module | None:
    """The model of a pre-quantized checkpoint (Note: [pre-quantized checkpoints]), or None when ``spec`` has no
    ``quantization_config``; built in the current context (``building(device)``). Without ``ckpt`` (``models.build``
    of a config alone) the quantized layers are those the config describes (Note: [pre-quantized layers from a
    config]).

    Raises:
        CheckpointError: a ``quant_method`` (or format) fakeviz does not read, naming what it reads, or a quantized
            layer the model has no linear layer for.
    """
    qc = quant_config(spec)
    if qc is None:
        return None
    where = where or "config.json"
    method = _method(qc, where)
    make = _maker(method, qc, where)  # an unsupported format is refused first
    if ckpt is None:
        model = instantiate(spec, dtype or spec.dtype)
        layers = layers_from_config(model, method, qc)
        experts = [n for n, m in model.named_modules() if n.endswith(".experts") and not isinstance(m, nn.Linear)]
        if experts:
            warnings.warn(f"{where}: the {len(experts)} mixture-of-experts blocks ({experts[0]}, ...) stay unquantized "
                          f"at {next(model.parameters()).dtype}: fakeviz does not rebuild fused experts {method}-"
                          "quantized, so their memory is overstated", FakeVizWarning, stacklevel=3)  # fmt: skip
    else:
        layers = _layers(ckpt, method)
        if not layers:
            marks = " or ".join(f"*{m}" for m in _MARKERS[method])
            raise CheckpointError(f"{where}: the quantization_config says {method}, but no tensor of the checkpoint "
                                  f"is a quantized layer's ({marks})\nRemove the quantization_config from config.json "
                                  "for an unquantized checkpoint.")  # fmt: skip
        model = instantiate(spec, dtype or _base_dtype(ckpt, layers, spec))
    device = next(model.parameters()).device
    for prefix, tensors in layers.items():
        path = _module_path(model, prefix)
        if path is None:
            raise CheckpointError(f"{where}: quantized tensors {prefix}.* ({method}) name no linear layer of "
                                  f"{type(model).__name__}\nfakeviz builds quantized linear layers; per-expert "
                                  "weights that transformers fuses (mixture of experts) are not rebuilt "
                                  "quantized.")  # fmt: skip
        model.set_submodule(path, make(model.get_submodule(path), tensors, device))
    model.config.quantization_config = qc
    model.quantization_method = method  # as transformers marks a quantized model (peft reads it)
    if method == "bitsandbytes":
        model.is_loaded_in_4bit = any("weight.absmax" in tensors for tensors in layers.values())
        model.is_loaded_in_8bit = not model.is_loaded_in_4bit
    return model


def build_layer(method: str, qc: dict[str, Any], linear: nn.Linear, tensors: dict[str, TensorInfo],
                device: torch.device) -> nn.Module:  # fmt: skip
    """The quantized layer of ``method`` (a ``quant_method``) that replaces ``linear``, holding ``tensors``."""
    return _maker(method, qc, "quantization_config")(linear, tensors, device)


def _maker(method: str, qc: dict[str, Any], where: str) -> Any:
    """``(linear, tensors, device) -> the quantized layer`` for ``method``."""
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"{where}: GPTQ checkpoint_format {fmt!r} is not supported\nfakeviz reads GPTQ "
                                  "checkpoints stored as 'gptq' or 'gptq_v2' (qweight [in * bits / 32, out]).")  # fmt: skip
        bits, group = int(qc.get("bits", 4)), int(qc.get("group_size", 128))
        return lambda lin, t, dev: GPTQLinear(t, bits, group, dev)
    if method == "awq":
        version = str(qc.get("version") or qc.get("format") or "gemm").lower()
        if version != "gemm":
            raise CheckpointError(f"{where}: AWQ version {version!r} is not supported\nfakeviz reads AWQ "
                                  "checkpoints of the GEMM layout (version 'gemm').")  # fmt: skip
        bits = int(qc.get("bits", qc.get("w_bit", 4)))
        group = int(qc.get("group_size", qc.get("q_group_size", 128)))
        return lambda lin, t, dev: AWQLinear(t, bits, group, dev)
    if method == "fp8":
        return _fp8_maker(qc)
    if method == "compressed-tensors":
        return _compressed_maker(qc, where)
    from ._prequantized_bnb import maker

    return maker(qc, where)


def _fp8_maker(qc: dict[str, Any]) -> Any:
    global FineGrainedFP8Linear
    if FineGrainedFP8Linear is None:
        FineGrainedFP8Linear = _fp8_class()
    block = qc.get("weight_block_size")

    def make(lin: nn.Linear, tensors: dict[str, TensorInfo], device: torch.device) -> nn.Module:
        with torch.device("meta"):  # as transformers builds it: no dense weight made
            new = FineGrainedFP8Linear(lin.in_features, lin.out_features, block_size=tuple(block) if block else None,
                                       activation_scheme=qc.get("activation_scheme", "dynamic"),
                                       scale_fmt=qc.get("scale_fmt", "float"), has_bias="bias" in tensors)  # fmt: skip
        _materialize(new, tensors, device)
        return new

    return make


def _materialize(module: nn.Module, tensors: dict[str, TensorInfo], device: torch.device) -> None:
    """Give ``module`` each of ``tensors`` as stored (what loading the checkpoint does), frozen."""
    for name, info in tensors.items():
        t = torch.empty(info.shape, dtype=info.dtype, device=device)
        if name in module._parameters or name not in module._buffers:
            module._parameters[name] = nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[name] = t
    for table in (module._parameters, module._buffers):  # what the checkpoint has none of (a bias it lacks)
        for name, t in list(table.items()):
            if t is not None and t.device.type == "meta" and name not in tensors:
                new = torch.empty(t.shape, dtype=t.dtype, device=device)
                table[name] = nn.Parameter(new, requires_grad=t.requires_grad) if table is module._parameters else new


def _compressed_maker(qc: dict[str, Any], where: str) -> Any:
    fmt = str(qc.get("format", "")).lower()
    groups = list((qc.get("config_groups") or {}).values())
    if fmt not in _CT_FORMATS or not groups:
        raise CheckpointError(f"{where}: compressed-tensors format {qc.get('format')!r} is not supported\nfakeviz "
                              f"reads the 8-bit formats {', '.join(_CT_FORMATS)} (fp8 / int8 weights).")  # fmt: skip
    weights = groups[0].get("weights") or {}
    block = weights.get("block_structure") if weights.get("strategy") == "block" else None
    quantize_input = bool(groups[0].get("input_activations"))
    return lambda lin, t, dev: CompressedLinear(t, list(block) if block else None, quantize_input, dev)
