"""``from_pretrained``: the fake model a checkpoint folder or hub repo describes, its tensors read from headers only."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._core.errors import ArgumentError, CheckpointError, CheckpointMismatchError, FakeVizWarning, UnknownModelError
from .._engine.checkpoint import Checkpoint, TensorInfo, checkpoint_file, read_checkpoint
from . import _quant
from ._build import Spec, as_dtype, building, hub_spec, instantiate, spec_of
from ._catalog import resolve
from ._hub import fetch_config, is_hub_id, read_hub_checkpoint
from ._prequantized import build as prequantized

__all__ = ["Match", "from_pretrained", "match"]


@dataclass
class Match:
    """How a checkpoint's tensors line up with a model's state dict.

    Attributes:
        names: model state-dict name -> the checkpoint tensor that fills it (the first source of a
            merged tensor, such as transformers' fused MoE experts).
        missing: model tensors no checkpoint tensor fills (tied copies excepted).
        unexpected: checkpoint tensors that fill no model tensor.
        shapes: model name -> (checkpoint shape, model shape) where they differ (merged tensors unchecked).
        merged: model names filled by several checkpoint tensors (a transformers conversion).
    """

    names: dict[str, TensorInfo] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    merged: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        """No tensor missing, unexpected or of another shape."""
        return not (self.missing or self.unexpected or self.shapes)

    def describe(self, limit: int = 8) -> str:
        """A short report naming the tensors that disagree."""
        lines = []
        for what, names in (("missing from the checkpoint", self.missing), ("not in the model", self.unexpected)):
            if names:
                shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
                lines.append(f"{len(names)} tensor(s) {what}: {shown}")
        if self.shapes:
            items = list(self.shapes.items())
            lines.append(f"{len(items)} tensor(s) of another shape: " + ", ".join(
                f"{n} (checkpoint {list(c)}, model {list(m)})" for n, (c, m) in items[:limit]
            ) + (f" and {len(items) - limit} more" if len(items) > limit else ""))  # fmt: skip
        return "\n".join(lines)


def _renamer(model: torch.nn.Module, sd: dict[str, Any]) -> Any:
    """transformers' own checkpoint-key renaming for this model (legacy names, fused MoE experts), if available."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key

        transforms = get_model_conversion_mapping(model)
    except Exception:  # noqa: BLE001 - an older or newer transformers: fall back to the names as they are
        transforms = None
    prefix = getattr(model, "base_model_prefix", None) or None
    if transforms is None:
        return lambda key: (key, None)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    return lambda key: rename_source_key(key, renamings, converters, prefix, sd)


def match(model: torch.nn.Module, ckpt: Checkpoint) -> Match:
    """Line up ``ckpt``'s tensors with ``model``'s state dict (tied weights once, transformers' renames applied)."""
    sd = model.state_dict(keep_vars=True)
    rename = _renamer(model, sd)
    out = Match()
    sources: dict[str, list[str]] = {}
    for key, info in ckpt.tensors.items():
        target, converter = rename(key)
        if target not in sd:
            out.unexpected.append(key)
            continue
        sources.setdefault(target, []).append(key)
        out.names.setdefault(target, info)
        if converter is not None:
            out.merged.add(target)
    filled = {id(sd[n]) for n in out.names}
    out.missing = [n for n, t in sd.items() if n not in out.names and id(t) not in filled]
    for name, info in out.names.items():
        if name not in out.merged and len(sources[name]) == 1 and tuple(sd[name].shape) != info.shape:
            out.shapes[name] = (info.shape, tuple(sd[name].shape))
    return out


def _swap_dtypes(model: torch.nn.Module, m: Match) -> int:
    """Give each parameter/buffer the dtype its checkpoint tensor has (ties kept); returns how many changed."""
    sd = model.state_dict(keep_vars=True)
    want = {id(sd[n]): info.dtype for n, info in m.names.items() if sd[n].dtype != info.dtype and n not in m.shapes}
    made: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is None or id(t) not in want:
                    continue
                if id(t) not in made:
                    new = torch.empty(t.shape, dtype=want[id(t)], device=t.device)
                    grad = is_param and t.requires_grad and (new.is_floating_point() or new.is_complex())
                    made[id(t)] = torch.nn.Parameter(new, requires_grad=grad) if is_param else new
                table[name] = made[id(t)]
    return len(made)


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    strict: bool = False,
    revision: str | None = None,
    trust_remote_code: bool = False,
    quantization: Any = None,
) -> torch.nn.Module:
    """The fake model a checkpoint folder or hub repo describes: ``config.json`` + weights, read without their data.

    Safetensors weights (one file or a sharded ``model.safetensors.index.json``) are read from their
    headers only, ``.bin``/``.pt`` files as meta tensors (:mod:`fakeviz._engine.checkpoint`); no tensor
    data is read, so a 140 GB checkpoint opens in about the time its config takes to build. A hub id
    (``owner/name``, or a catalog name: its hub id) that is not a local folder is read the same way over HTTP:
    ``config.json`` through the hub cache, then two range requests per safetensors file for its header, never a
    weight byte (:mod:`fakeviz.models._hub`; offline, a complete cached copy of the weights is read instead).

    Args:
        path: the checkpoint folder (or its ``config.json``), or a hub id.
        device: where the fake parameters live (``"cuda:0"`` works on a CPU-only build); default: the
            caller's context.
        dtype: build every floating tensor at this dtype. None: each tensor takes its checkpoint dtype
            (mixed checkpoints stay mixed; the model is built at the dtype most elements have).
        strict: raise :class:`~fakeviz.CheckpointMismatchError` instead of warning when names or shapes of
            the checkpoint disagree with the config's model.
        revision: a hub id's branch, tag or commit (default ``main``); every file is read at the commit it names.
        trust_remote_code: run a hub repo's own code where its config's ``auto_map`` needs it (as transformers
            does); refused (``HubError``) otherwise.
        quantization: quantize the weights as loaded, by their library's own code: ``"nf4"``, ``"fp4"``,
            ``"int8"`` (bitsandbytes), ``"int4"``, ``"fp8"`` (torchao), a ``transformers.BitsAndBytesConfig`` or a
            torchao config (:func:`fakeviz.models._quant.resolve`); refused for a pre-quantized checkpoint.

    Returns:
        The fake model (built under the caller's fake mode or recording if one is active, else in a new
        ``fv.fake_mode()``), in training mode as transformers builds it.

    Raises:
        CheckpointError: no ``config.json``, no weights, a malformed/truncated weight file, or a file that
            resolves outside the folder (Note: [hostile checkpoints] in :mod:`fakeviz._engine.checkpoint`).
        CheckpointMismatchError: ``strict=True`` and the checkpoint disagrees with the model.
        HubError: (a ``CheckpointError``) a hub id offline without its weights cached, an unreachable endpoint,
            a gated repo without access, or remote code without ``trust_remote_code=True``.
        UnknownModelError: a hub id the hub does not know.
    """
    q = None if quantization is None else _quant.resolve(quantization)  # refused before anything is read
    folder = Path(path).expanduser()
    if folder.is_file() and folder.name == "config.json":
        folder = folder.parent
    if not (folder / "config.json").is_file():
        repo = None if folder.exists() else _hub_id(str(path))
        if repo is None:
            raise CheckpointError(f"{folder}: no config.json here\nfrom_pretrained needs a checkpoint folder "
                                  "(config.json + weights) or a hub id; fakeviz.models.build() takes a config "
                                  "alone.")  # fmt: skip
        hub = fetch_config(repo, revision)
        spec = hub_spec(hub, {}, trust_remote_code)
        return _fake_model(spec, read_hub_checkpoint(hub), repo, device, dtype, strict, q)
    config = checkpoint_file(folder, "config.json", what="config")  # Note: [hostile checkpoints]
    ckpt = read_checkpoint(folder)
    return _fake_model(spec_of(config, {}, revision=revision), ckpt, str(folder), device, dtype, strict, q)


def _hub_id(name: str) -> str | None:
    """The hub id ``name`` stands for: itself written ``owner/name``, or a catalog name's; else None."""
    try:
        return resolve(name).name
    except UnknownModelError:
        return name if is_hub_id(name) else None


def _fake_model(
    spec: Spec, ckpt: Checkpoint, where: str, device: str | torch.device | None, dtype: str | torch.dtype | None,
    strict: bool, q: Any = None,
) -> torch.nn.Module:  # fmt: skip
    """The model ``spec`` builds, its tensors given the checkpoint's dtypes and checked against its names and
    shapes: the one path of a local folder and of a hub repo."""
    want = as_dtype(dtype)
    with building(device):
        model = prequantized(spec, ckpt, want, where)  # None without a quantization_config
        if model is not None and q is not None:
            raise ArgumentError(
                "quantization",
                q.label,
                f"{where} is already quantized (its config.json has a quantization_config)",
                "Leave quantization= out for a pre-quantized checkpoint.",
            )
        with _quant.deferring(q) as deferred:  # Note: [quantizing a built model]
            model = model if model is not None else instantiate(spec, want or ckpt.main_dtype())
        m = match(model, ckpt)
        if want is None:
            _swap_dtypes(model, m)
        if q is not None:  # the checkpoint's weights as loaded, then quantized (Note: [quantizing a built model])
            _quant.apply(model, q, deferred)
    if not m.ok:
        msg = f"{where}: the checkpoint disagrees with the model its config.json builds\n{m.describe()}"
        if strict:
            raise CheckpointMismatchError(msg, missing=tuple(m.missing), unexpected=tuple(m.unexpected),
                                          shapes=m.shapes)  # fmt: skip
        warnings.warn(msg + "\nThe model keeps the config's shapes (strict=True raises instead).", FakeVizWarning,
                      stacklevel=3)  # fmt: skip
    return model
