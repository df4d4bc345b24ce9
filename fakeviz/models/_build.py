"""From a name, a folder, a ``config.json``, a dict or a transformers config to a fake model."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .._core.errors import CheckpointError, FakeVizError
from .._engine.checkpoint import MAX_INDEX_BYTES
from .._engine.session import fake_mode
from ._catalog import CatalogEntry, resolve

__all__ = ["Spec", "as_dtype", "building", "config", "instantiate", "spec_of"]

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "f32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "f16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
    "fp8": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}  # fmt: skip
_DROP = ("_comment", "transformers_version", "_name_or_path", "torch_dtype", "dtype")


def as_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A torch dtype from a dtype or a name (``"bf16"``, ``"bfloat16"``, ``"torch.float16"``); None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not known; use one of {', '.join(sorted(_DTYPES))} or a torch.dtype")
    return _DTYPES[key]


class Spec:
    """What to build: a transformers config, its model class name, the catalog entry if any, the published dtype."""

    def __init__(self, config: Any, architecture: str | None, entry: CatalogEntry | None, dtype: torch.dtype | None):
        self.config = config
        self.architecture = architecture
        self.entry = entry
        self.dtype = dtype


def _config_from_dict(raw: dict[str, Any], overrides: dict[str, Any], where: str) -> tuple[Any, torch.dtype | None]:
    import transformers

    raw = dict(raw)
    published = raw.get("torch_dtype") or raw.get("dtype")
    for k in _DROP:
        raw.pop(k, None)
    raw.update(overrides)
    model_type = raw.pop("model_type", None)
    if not model_type:
        raise CheckpointError(f"{where}: no 'model_type' in the config; transformers cannot tell which model it is")
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **raw)
    except ValueError as e:
        raise CheckpointError(
            f"{where}: model_type {model_type!r} is not known to transformers {transformers.__version__}\n"
            "Upgrade transformers, or build the model yourself under fv.fake_mode()."
        ) from e
    try:
        pdtype = as_dtype(published) if published not in (None, "auto") else None
    except ValueError:
        pdtype = None
    if pdtype is not None:  # kept on the config: build(config(name)) builds at the published dtype, as build(name)
        cfg.dtype = pdtype
    return cfg, pdtype


def spec_of(spec: Any, overrides: dict[str, Any]) -> Spec:
    """Resolve a catalog name, folder, ``config.json``, dict or transformers config (overrides applied)."""
    import transformers

    if isinstance(spec, transformers.PretrainedConfig):
        cfg = copy.deepcopy(spec)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        archs = getattr(cfg, "architectures", None) or [None]
        pdtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
        return Spec(cfg, archs[0], None, pdtype if isinstance(pdtype, torch.dtype) else None)
    if isinstance(spec, dict):
        cfg, pdtype = _config_from_dict(spec, overrides, "config dict")
        return Spec(cfg, (spec.get("architectures") or [None])[0], None, pdtype)
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            f"expected a model name, a folder, a config.json or a transformers config, got {type(spec).__name__}"
        )
    path = Path(spec).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"{path}: no config.json in this folder\nPoint at a folder that holds config.json.")
        try:
            with open(file, "rb") as f:  # bounded: a config is a few KB; the index limit is generous
                data = f.read(MAX_INDEX_BYTES + 1)
        except OSError as e:
            raise CheckpointError(f"{file}: not readable ({e.strerror or e})") from e
        if len(data) > MAX_INDEX_BYTES:
            raise CheckpointError(f"{file}: over {MAX_INDEX_BYTES // 2**20} MiB, not a model config")
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise CheckpointError(f"{file}: not readable as JSON ({e})") from e
        if not isinstance(raw, dict):
            raise CheckpointError(f"{file}: not a config (a JSON object)")
        cfg, pdtype = _config_from_dict(raw, overrides, str(file))
        cfg.name_or_path = str(path)  # as transformers' from_pretrained names it (errors say which model)
        return Spec(cfg, (raw.get("architectures") or [None])[0], None, pdtype)
    entry = resolve(str(spec))
    cfg, pdtype = _config_from_dict(entry.config, overrides, entry.name)
    cfg.name_or_path = entry.name
    return Spec(cfg, entry.architecture, entry, pdtype)


def config(name_or_path: Any, **overrides: Any) -> Any:
    """The transformers config of a catalog name, folder or ``config.json``; ``overrides`` replace fields."""
    return spec_of(name_or_path, overrides).config


def _model_class(spec: Spec) -> Any:
    import transformers

    if spec.architecture and hasattr(transformers, spec.architecture):
        return getattr(transformers, spec.architecture)
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        with contextlib.suppress(ValueError, KeyError):
            return auto._model_mapping[type(spec.config)]
    raise FakeVizError(f"transformers has no model class for {type(spec.config).__name__} ({spec.architecture!r})")


@contextlib.contextmanager
def building(device: str | torch.device | None) -> Iterator[None]:
    """The context a model is built in: the caller's (fake) mode if one is active, else a new ``fake_mode()``.

    Note: [build in the caller's mode] - a fake tensor belongs to the FakeTensorMode that made it, so a
    model built for a ``fv.record``/``fv.fake_mode`` block must be built under that block's mode (any
    dispatch mode on the stack, a real-run recording included, is the caller's choice); only with no mode
    active does ``build`` open its own ``fake_mode()``, whose fake tensors a later ``fv.record`` adopts.
    """
    if _get_current_dispatch_mode_stack():
        with torch.device(device) if device is not None else contextlib.nullcontext():
            yield
    else:
        with fake_mode(device=device):
            yield


def instantiate(spec: Spec, dtype: torch.dtype | None) -> torch.nn.Module:
    """Build ``spec``'s model class at ``dtype`` (else the published dtype, else the default) in the current context."""
    cls = _model_class(spec)
    dtype = dtype or spec.dtype or torch.get_default_dtype()
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point and dtype.itemsize >= 2 else saved)
    try:
        model = cls._from_config(spec.config, dtype=dtype)
    finally:
        torch.set_default_dtype(saved)
    if spec.entry is not None and spec.entry.loss_type and getattr(model, "loss_type", None) is None:
        model.loss_type = spec.entry.loss_type
    return model
