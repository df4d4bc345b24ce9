"""Published models by name, and checkpoints without their data (shapes only, never weights).

``build("meta-llama/Llama-3.1-70B")`` builds the fake model of a published config shipped with fakeviz
(``catalog()`` lists them; hub ids, their last part and short aliases all work, any case), of a local
folder or ``config.json``, or of a transformers config. ``from_pretrained(folder)`` builds the fake model
a checkpoint folder describes, reading only its safetensors headers. Requires the ``hf`` extra
(transformers).
"""

from __future__ import annotations

from typing import Any

import torch

from .._core.errors import ArgumentError
from .._core.notices import quiet_import_notices
from .._engine.arguments import DEFAULT_DTYPES
from . import _prequantized, _quant
from ._build import as_dtype, building, config, instantiate, spec_of
from ._catalog import CatalogEntry, catalog, entries, resolve
from ._inputs import check_config_step, check_seq, context, inputs, task_of
from ._pretrained import from_pretrained

__all__ = ["CatalogEntry", "available", "build", "catalog", "check_seq", "check_step", "config", "context", "from_pretrained", "inputs",
           "resolve", "task_of"]  # fmt: skip


def available() -> list[str]:
    """The hub ids of the catalog, sorted."""
    return sorted(e.name for e in entries())


def build(
    name_or_path_or_config: Any,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    quantization: Any = None,
    **config_overrides: Any,
) -> torch.nn.Module:
    """The fake model of a published model name, a folder / ``config.json``, a dict, or a transformers config.

    Args:
        name_or_path_or_config: a catalog name (``"meta-llama/Llama-3.1-70B"``, ``"Llama-3.1-70B"``,
            ``"llama3.1-70b"``), a folder holding ``config.json``, a ``config.json`` path, a dict of its
            values, or a ``transformers.PretrainedConfig``. Local paths win over catalog names; a name written
            ``owner/name`` that is not in the catalog is a hub id: its ``config.json`` is fetched with
            ``huggingface_hub`` (its cache, ``HF_TOKEN``, ``HF_HUB_OFFLINE``, ``HF_ENDPOINT``).
        device: where the parameters live (``"cuda:0"`` works on a CPU-only build); default: the caller's
            context (``fv.record(device=...)``), else cpu.
        dtype: parameter dtype (``torch.bfloat16`` or ``"bf16"``); default: the published weights' dtype
            (the config's ``torch_dtype``), else torch's default dtype.
        revision: a hub id's branch, tag or commit (default ``main``); given with a catalog name, the hub's
            ``config.json`` at that revision is used instead of the catalog's copy.
        trust_remote_code: run a hub repo's own code where its config's ``auto_map`` needs it (as transformers
            does); refused (``HubError``) otherwise.
        quantization: quantize the weights by their library's own code, as transformers' loader does: ``"nf4"``,
            ``"fp4"`` (bitsandbytes 4-bit, bf16 compute), ``"int8"`` (bitsandbytes LLM.int8), ``"int4"``, ``"fp8"``
            (torchao), a ``transformers.BitsAndBytesConfig`` or a torchao config (Note: [quantizing a built model]
            in ``fakeviz/models/_quant.py``); the output head stays unquantized.
        **config_overrides: config fields to replace (``num_hidden_layers=2``).

    Returns:
        The model, built under the caller's fake mode or recording if one is active (Note: [build in the
        caller's mode]), else inside a new ``fv.fake_mode()``: its parameters are fake and take no memory.

    Raises:
        UnknownModelError: (a ``ValueError``) an unknown name (not in the catalog, nor on the hub for ``owner/name``);
            the message suggests near names.
        HubError: (a ``CheckpointError``) a hub id offline and not cached, an unreachable endpoint, a gated repo
            without access, or remote code without ``trust_remote_code=True``.
        CheckpointError: a folder without ``config.json``, or a config transformers does not know.
    """
    with quiet_import_notices():  # Note: [import notices]: transformers' first model imports torchao's quantizers
        return _build(name_or_path_or_config, dtype, device, quantization, revision, trust_remote_code, config_overrides)


def check_step(model: Any, *, batch: int, seq: int, new_tokens: int = 0, revision: str | None = None) -> None:
    """Refuse, before anything is built or recorded, a step past ``model``'s context or of more tokens than the
    largest job holds (Note: [size limits]); ``model``: a module, or what :func:`build` takes.

    Raises:
        SequenceTooLongError: ``seq + new_tokens`` past the context. ArgumentError: too many tokens.
    """
    if isinstance(model, torch.nn.Module):
        cfg = getattr(model, "config", None)
        if cfg is not None:
            check_config_step(cfg, type(model).__name__, batch=batch, seq=seq, new_tokens=new_tokens)
        return
    spec = spec_of(model, {}, revision=revision)
    check_config_step(spec.config, spec.architecture, batch=batch, seq=seq, new_tokens=new_tokens)


def _build(name_or_path_or_config: Any, dtype: Any, device: Any, quantization: Any, revision: str | None,
           trust_remote_code: bool, config_overrides: dict[str, Any]) -> Any:  # fmt: skip
    given, dtype = dtype, as_dtype(dtype)
    if dtype is not None and dtype not in DEFAULT_DTYPES:  # torch makes no module at fp8 or int8
        raise ArgumentError("dtype", given, f"{str(dtype).removeprefix('torch.')} cannot be a model's parameter dtype",
                            "Give bf16, fp16, fp32 or fp64; for 8-bit or 4-bit weights, quantization='fp8', 'int8', "
                            "'int4' or 'nf4'.")  # fmt: skip
    spec = spec_of(name_or_path_or_config, config_overrides, revision=revision, trust_remote_code=trust_remote_code)
    q = None if quantization is None else _quant.resolve(quantization)
    with building(device), _quant.deferring(q) as deferred:  # Note: [quantizing a built model]
        model = _prequantized.build(spec, None, as_dtype(dtype))  # a pre-quantized config's layers; None: not one
        if model is not None and q is not None:
            raise ArgumentError("quantization", q.label, "the model's config is already quantized (it has a "
                                "quantization_config)", "Leave quantization= out for a pre-quantized model.")  # fmt: skip
        model = model if model is not None else instantiate(spec, as_dtype(dtype))
        if q is not None:
            _quant.apply(model, q, deferred)
        return model
