"""torchao quantization of a (fake) model: torchao's own ``quantize_`` with the module filter transformers'
``TorchAoHfQuantizer`` uses, so a fake model holds torchao's own tensor subclasses (``Int8Tensor``,
``Int4TilePackedTo4dTensor``, ``Float8Tensor``) whose inner tensors are fake: the recorder counts their real
storages (int8 data and scales; packed int4 and scales/zeros; fp8 data and scales), and forward/backward record
torchao's own ops (Note: [tensor subclasses under the values layer] in ``fakeviz/_engine/values.py``).

The contract with ``models/_quant.py``: :func:`is_torchao_config`, :func:`config_for`, :func:`apply`, :func:`label`.
torchao is imported only when one of them needs it (fakeviz does not require torchao).
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.errors import ArgumentError

__all__ = ["SHORT", "apply", "config_for", "is_torchao_config", "label"]

#: The short spellings :func:`config_for` knows, with what each means.
SHORT = {
    "int4": "Int4WeightOnlyConfig(group_size=128, int4_packing_format='tile_packed_to_4d'): tinygemm's int4 layout",
    "int4-cpu": "IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)): int4 values one per int8 "
    "byte (unpacked_to_int8), the int4 weight-only format torchao 0.18 runs on a CPU",
    "int8-wo": "Int8WeightOnlyConfig()",
    "int8-dyn": "Int8DynamicActivationInt8WeightConfig()",
    "fp8": "Float8DynamicActivationFloat8WeightConfig(): fp8 e4m3 weights and activations, one scale per row",
}

_LABELS = {
    "Int4WeightOnlyConfig": "int4 weight-only",
    "Int8WeightOnlyConfig": "int8 weight-only",
    "Int8DynamicActivationInt8WeightConfig": "int8 dynamic activation, int8 weight",
    "Float8DynamicActivationFloat8WeightConfig": "fp8 dynamic activation, fp8 weight",
    "Float8WeightOnlyConfig": "fp8 weight-only",
}


def _base_config_type() -> type | None:
    try:
        from torchao.core.config import AOBaseConfig
    except ImportError:
        return None
    return AOBaseConfig


def _is_hf_config(obj: Any) -> bool:
    """transformers' ``TorchAoConfig`` (it carries a torchao config in ``quant_type``), checked by name so that
    transformers is not imported for it."""
    return type(obj).__name__ == "TorchAoConfig" and hasattr(obj, "quant_type")


def is_torchao_config(obj: Any) -> bool:
    """Whether ``obj`` is a torchao quantization config (``torchao.core.config.AOBaseConfig``) or transformers'
    ``TorchAoConfig`` wrapping one."""
    if _is_hf_config(obj):
        return True
    base = _base_config_type()
    return base is not None and isinstance(obj, base)


def _require_torchao(what: str) -> None:
    if _base_config_type() is None:
        raise ArgumentError("quantization", what, "needs torchao, which is not installed", "pip install torchao")


def config_for(short: str) -> Any:
    """The torchao config for a short spelling: ``"int4"``, ``"fp8"``, ``"int8-wo"``, ``"int8-dyn"``, ``"int4-cpu"``.

    ``"int4"`` is torchao's tinygemm layout (``int4_packing_format="tile_packed_to_4d"``, group size 128), the
    int4 weight-only format torchao runs on A100/H100 with PyTorch's own kernels (``_weight_int4pack_mm``);
    torchao 0.18's default ``"plain"`` needs the separate ``mslk`` package.
    """
    key = str(short).strip().lower().replace("_", "-")
    if key not in SHORT:
        raise ArgumentError(
            "quantization", short, "not a torchao short name",
            f"give one of {', '.join(map(repr, SHORT))} or a torchao config object",
            suggestions=tuple(k for k in SHORT if k.split("-")[0] in key or key in k),
        )  # fmt: skip
    _require_torchao(short)
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    if key == "int4":
        return Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
    if key == "int4-cpu":
        from torchao.quantization import IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerGroup

        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    if key == "int8-wo":
        return Int8WeightOnlyConfig()
    if key == "int8-dyn":
        return Int8DynamicActivationInt8WeightConfig()
    return Float8DynamicActivationFloat8WeightConfig()


def _unwrap(config: Any) -> tuple[Any, list[str] | None, bool]:
    """(torchao config, modules_to_not_convert given by the user or None, include_input_output_embeddings)."""
    if _is_hf_config(config):
        return (
            config.quant_type,
            getattr(config, "modules_to_not_convert", None),
            bool(getattr(config, "include_input_output_embeddings", False)),
        )
    return config, None, False


def label(config: Any) -> str:
    """A short human name of a torchao config, e.g. ``"int8 weight-only"``."""
    inner, _, _ = _unwrap(config)
    name = type(inner).__name__
    text = _LABELS.get(name, name)
    if name == "IntxWeightOnlyConfig":
        bits = str(getattr(inner, "weight_dtype", "")).replace("torch.", "")
        fmt = getattr(inner, "intx_packing_format", None)
        text = f"{bits} weight-only (intx, {getattr(fmt, 'value', fmt)})"
    if name == "Int4WeightOnlyConfig":
        fmt = getattr(inner, "int4_packing_format", None)
        fmt = getattr(fmt, "value", fmt)
        text += f" (group {getattr(inner, 'group_size', '?')}, {fmt})"
    return text


def _skipped(model: torch.nn.Module, user_skip: list[str] | None, embeddings: bool) -> list[str]:
    """The modules transformers' ``TorchAoHfQuantizer`` leaves unquantized (``get_modules_to_not_convert``):
    without a user list, the tied weights, the last parameter's module and the output embeddings (``lm_head``),
    plus ``_keep_in_fp32_modules``; a plain ``nn.Module`` (no transformers API) skips its last module."""
    skip: list[str] = []
    if user_skip is None:
        if hasattr(model, "all_tied_weights_keys") and hasattr(model, "get_output_embeddings"):
            from transformers.quantizers.base import get_keys_to_not_convert

            skip = list(get_keys_to_not_convert(model))
        else:
            names = [n for n, _ in model.named_parameters()]
            if names:
                skip = [names[-1].rsplit(".", 1)[0] if "." in names[-1] else names[-1]]
    else:
        skip = list(user_skip)
    skip.extend(getattr(model, "_keep_in_fp32_modules", None) or [])
    if embeddings and hasattr(model, "get_output_embeddings"):
        keep = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
        emb = {n for n, m in model.named_modules() if id(m) in keep}
        skip = [s for s in skip if s not in emb]
    return sorted(set(skip))


def _should_convert(name: str, patterns: list[str]) -> bool:
    try:
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:  # the same rule: a pattern matching at a module boundary, or as a suffix
        return not any(name == p or name.startswith(p + ".") or name.endswith(p) for p in patterns)
    return should_convert_module(name, patterns)


def apply(model: torch.nn.Module, config: Any) -> None:
    """Quantize ``model`` in place with torchao's own ``quantize_`` under whatever (fake) mode is current, skipping
    what transformers' ``TorchAoHfQuantizer`` skips (``lm_head``, tied weights, ``modules_to_not_convert``) and
    quantizing ``nn.Linear`` weights only (``nn.Embedding`` too with ``include_input_output_embeddings``)."""
    if not is_torchao_config(config):
        raise ArgumentError(
            "quantization", config, "not a torchao config", "give a torchao config object (Int8WeightOnlyConfig(), ...)"
        )
    _require_torchao(config)
    from torchao.quantization import quantize_

    inner, user_skip, embeddings = _unwrap(config)
    skip = _skipped(model, user_skip, embeddings)
    kinds: tuple[type, ...] = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)

    def filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        return isinstance(module, kinds) and _should_convert(f"{fqn}.weight" if fqn else "weight", skip)

    try:
        quantize_(model, inner, filter_fn=filter_fn)
    except ImportError as exc:
        raise ArgumentError(
            "quantization",
            config,
            f"{label(config)}: torchao needs a package that is not installed here ({exc})",
            "for int4 give Int4WeightOnlyConfig(int4_packing_format='tile_packed_to_4d') (PyTorch's own kernels) or "
            "the short name 'int4'",
        ) from exc
