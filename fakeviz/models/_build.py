"""From a name, a folder, a ``config.json``, a dict or a transformers config to a fake model."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import inspect
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .._core.errors import ArgumentError, CheckpointError, FakeVizError, UnknownModelError
from .._core.limits import check_config
from .._engine.arguments import as_dtype, fake_device
from .._engine.checkpoint import MAX_INDEX_BYTES
from .._engine.default_dtype import default_dtype
from .._engine.session import fake_mode
from ._catalog import CatalogEntry, resolve
from ._hub import HubConfig, fetch_config, is_hub_id, remote_code

__all__ = ["Spec", "as_dtype", "building", "check_overrides", "config", "hub_spec", "instantiate", "spec_of"]

_DROP = ("_comment", "transformers_version", "_name_or_path", "torch_dtype", "dtype")


class Spec:
    """What to build: a transformers config, its model class name, the catalog entry if any, the published dtype,
    and the model class itself where a hub repo's own code defines it (``trust_remote_code=True``)."""

    def __init__(
        self, config: Any, architecture: str | None, entry: CatalogEntry | None, dtype: torch.dtype | None,
        model_class: type | None = None,
    ):  # fmt: skip
        check_config(config, getattr(config, "name_or_path", "") or "")  # Note: [size limits], before any build
        self.config = config
        self.architecture = architecture
        self.entry = entry
        self.dtype = dtype
        self.model_class = model_class


def _config_from_dict(raw: dict[str, Any], overrides: dict[str, Any], where: str) -> tuple[Any, torch.dtype | None]:
    import transformers

    raw = dict(raw)
    published = raw.get("torch_dtype") or raw.get("dtype")
    for k in _DROP:
        raw.pop(k, None)
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
    if overrides:  # checked against the config as published, then built with them (its __init__ derives fields)
        check_overrides(cfg, overrides, where)
        fields = {k: v for k, v in overrides.items() if k != "model_type"}
        try:
            cfg = transformers.AutoConfig.for_model(overrides.get("model_type", model_type), **{**raw, **fields})
        except Exception as e:  # noqa: BLE001 - its validators' errors (huggingface_hub's are no ValueError)
            lines = [x.strip() for x in str(e).splitlines() if x.strip()]
            why = re.sub(r"^\w+(Error|Exception): ", "", lines[-1]) if lines else type(e).__name__  # its own words
            written = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
            raise ArgumentError(
                next(iter(overrides)), next(iter(overrides.values())), f"transformers refuses the config: {why}",
                f"Change the overrides so that {type(cfg).__name__} accepts them.", written=written,
            ) from e  # fmt: skip
    try:
        pdtype = as_dtype(published) if published not in (None, "auto") else None
    except ValueError:
        pdtype = None
    if pdtype is not None:  # kept on the config: build(config(name)) builds at the published dtype, as build(name)
        cfg.dtype = pdtype
    return cfg, pdtype


# Fields that set a size (layers, widths, heads, vocabulary, positions, experts): an override must be a whole
# number >= 1 where the config has one (a count of -1 layers built none, silently); _ZERO_OK may be 0 (none).
_SIZE = re.compile(
    r"^(num|n)_|_(size|layers?|heads|dim|positions|embeddings|experts|channels|ctx|embd|inner)$|^(d_model|d_ff|d_kv)$"
)
_ZERO_OK = frozenset({"max_window_layers", "num_nextn_predict_layers", "n_shared_experts", "num_shared_experts"})
# Keyword arguments every transformers config takes that it keeps under another name (or not at all in to_dict)
_INIT_KWARGS = ("attn_implementation", "experts_implementation", "output_attentions", "torch_dtype", "dtype",
                "rope_scaling", "rope_theta", "num_labels", "name_or_path")  # fmt: skip


def _field_names(cfg: Any) -> set[str]:
    """The fields an override may replace: the config's values, its aliases (``attribute_map``), its class's
    fields and ``__init__`` parameters, and the keyword arguments every config takes."""
    names = set(cfg.to_dict()) | set(getattr(cfg, "attribute_map", {}) or {}) | set(_INIT_KWARGS)
    if dataclasses.is_dataclass(cfg):
        names |= {f.name for f in dataclasses.fields(cfg)}
    with contextlib.suppress(TypeError, ValueError):
        names |= {p for p, v in inspect.signature(type(cfg).__init__).parameters.items() if v.kind == v.KEYWORD_ONLY
                  or v.kind == v.POSITIONAL_OR_KEYWORD}  # fmt: skip
    names |= {k for k, v in vars(type(cfg)).items() if isinstance(v, property)}
    return {n for n in names if not n.startswith("_") and n != "self"}


def _default_is_none(cfg: Any, key: str) -> bool:
    """True when the config class's own default for ``key`` is None (Llama's ``num_key_value_heads``: then
    derived from another field), so ``key=None`` asks for that."""
    name = (getattr(cfg, "attribute_map", {}) or {}).get(key, key)
    if dataclasses.is_dataclass(cfg):
        for f in dataclasses.fields(cfg):
            if f.name == name:
                return f.default is None
    with contextlib.suppress(TypeError, ValueError):
        p = inspect.signature(type(cfg).__init__).parameters.get(name)
        return p is not None and p.default is None
    return False


def _near(key: str, names: set[str]) -> tuple[str, ...]:
    """The names nearest ``key`` (difflib), best first: those close to the best match, at most 3."""
    scored = [
        (difflib.SequenceMatcher(None, key, n).ratio(), n)
        for n in difflib.get_close_matches(key, sorted(names), 3, 0.6)
    ]
    return tuple(n for r, n in scored if r >= scored[0][0] - 0.1) if scored else ()


def check_overrides(cfg: Any, overrides: dict[str, Any], where: str) -> None:
    """Refuse an override ``cfg`` does not have (with the near names) and a size that is not a whole number >= 1.

    Raises:
        ArgumentError: (a ``ValueError``) naming the override as written and what to give instead.
    """
    names = _field_names(cfg)
    for key, value in overrides.items():
        if key not in names:
            near = _near(key, names)
            hint = f"Did you mean {' or '.join(map(repr, near))}? " if near else ""
            raise ArgumentError(
                key, value, f"{type(cfg).__name__} of {where} has no field {key!r}",
                hint + "An override replaces a field the config has: fakeviz.models.config(name).to_dict() lists them.",
                suggestions=near,
            )  # fmt: skip
        now = getattr(cfg, key, None)
        if not _SIZE.search(key) or not isinstance(now, int) or isinstance(now, bool) or now < 1:
            continue
        low = 0 if key in _ZERO_OK else 1
        if value is None and _default_is_none(cfg, key):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ArgumentError(
                key, value, f"{key} is a size: a whole number of at least {low}",
                f"{where} has {key}={now}; a smaller whole number builds a smaller model.",
            )  # fmt: skip


def spec_of(
    spec: Any, overrides: dict[str, Any], *, revision: str | None = None, trust_remote_code: bool = False
) -> Spec:
    """Resolve a folder, ``config.json``, catalog name, hub id, dict or transformers config (overrides applied).

    Local paths win, then catalog names (offline, no request; unless ``revision`` is given), then a name written
    ``owner/name`` is fetched from the hub (``config.json`` only, :mod:`fakeviz.models._hub`).
    """
    import transformers

    local = isinstance(spec, (transformers.PretrainedConfig, dict)) or (
        isinstance(spec, (str, os.PathLike)) and _is_local(Path(spec).expanduser())
    )
    if revision is not None and local:  # refused, never ignored: a revision names files of a hub repo
        raise ArgumentError("revision", revision, "a revision names a hub repo's files, and the model given is "
                            "a local folder, config.json, dict or config", "Leave revision out, or give a hub id "
                            "(owner/name).")  # fmt: skip
    if isinstance(spec, transformers.PretrainedConfig):
        return _spec_of_config(copy.deepcopy(spec), overrides)
    if isinstance(spec, dict):
        cfg, pdtype = _config_from_dict(spec, overrides, "the config dict")
        return Spec(cfg, (spec.get("architectures") or [None])[0], None, pdtype)
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            f"expected a model name, a folder, a config.json or a transformers config, got {type(spec).__name__}"
        )
    path = Path(spec).expanduser()
    if _is_local(path):
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"{path}: no config.json in this folder\nPoint at a folder that holds config.json.")
        raw = _read_config(file)
        cfg, pdtype = _config_from_dict(raw, overrides, str(file))
        cfg.name_or_path = str(path)  # as transformers' from_pretrained names it (errors say which model)
        return Spec(cfg, (raw.get("architectures") or [None])[0], None, pdtype)
    try:
        entry = resolve(str(spec))
    except UnknownModelError:
        if not is_hub_id(str(spec)) or path.exists():
            raise
        entry = None
    if entry is None:  # outside the except block: a hub error is not raised "during" the catalog's
        return hub_spec(fetch_config(str(spec), revision), overrides, trust_remote_code)
    if revision is not None:  # a revision names the hub's files, not the catalog's copy of one config
        return hub_spec(fetch_config(entry.name, revision), overrides, trust_remote_code)
    cfg, pdtype = _config_from_dict(entry.config, overrides, entry.name)
    cfg.name_or_path = entry.name
    return Spec(cfg, entry.architecture, entry, pdtype)


def config(name_or_path: Any, *, revision: str | None = None, trust_remote_code: bool = False, **overrides: Any) -> Any:
    """The transformers config of a folder, ``config.json``, catalog name or hub id (``owner/name``: its
    ``config.json`` through ``huggingface_hub``, at ``revision``); ``overrides`` replace fields."""
    return spec_of(name_or_path, overrides, revision=revision, trust_remote_code=trust_remote_code).config


def _is_local(path: Path) -> bool:
    return path.is_dir() or (path.is_file() and path.suffix == ".json")


def _spec_of_config(cfg: Any, overrides: dict[str, Any], model_class: type | None = None) -> Spec:
    check_overrides(cfg, overrides, getattr(cfg, "name_or_path", "") or "the config given")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    archs = getattr(cfg, "architectures", None) or [None]
    pdtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    return Spec(cfg, archs[0], None, pdtype if isinstance(pdtype, torch.dtype) else None, model_class)


def hub_spec(hub: HubConfig, overrides: dict[str, Any], trust_remote_code: bool = False) -> Spec:
    """What a hub repo's ``config.json`` builds: transformers' own classes, or the repo's code where its
    ``auto_map`` needs it and ``trust_remote_code`` allows it (refused otherwise: :func:`_hub.remote_code`)."""
    remote = remote_code(hub, trust_remote_code)
    if remote is not None:
        cfg, cls = remote
        cfg.name_or_path = hub.repo
        return _spec_of_config(cfg, overrides, cls)
    cfg, pdtype = _config_from_dict(hub.raw, overrides, hub.repo)
    cfg.name_or_path = hub.repo  # as transformers' from_pretrained names it (errors say which model)
    return Spec(cfg, (hub.raw.get("architectures") or [None])[0], None, pdtype)


def _read_config(file: Path) -> dict[str, Any]:
    """A local ``config.json``'s values, from one bounded read (a config is a few KB; the index limit is generous)."""
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_INDEX_BYTES + 1)
    except OSError as e:
        raise CheckpointError(f"{file}: not readable ({e.strerror or e})") from e
    if len(data) > MAX_INDEX_BYTES:
        raise CheckpointError(f"{file}: over {MAX_INDEX_BYTES // 2**20} MiB, not a model config")
    try:
        raw = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{file}: not readable as JSON ({e})") from e
    except RecursionError:  # brackets nested thousands deep: no config is
        raise CheckpointError(f"{file}: JSON nested too deep to be a model config") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: not a config (a JSON object)")
    return raw


def _model_class(spec: Spec) -> Any:
    import transformers

    if spec.model_class is not None:  # the hub repo's own code (trust_remote_code=True)
        return spec.model_class
    if spec.architecture and hasattr(transformers, spec.architecture):
        cls = getattr(transformers, spec.architecture)
        wants = getattr(cls, "config_class", None)
        if isinstance(wants, type) and not isinstance(spec.config, wants):
            _contradiction(spec, wants)
        return cls
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        with contextlib.suppress(ValueError, KeyError):
            return auto._model_mapping[type(spec.config)]
    raise FakeVizError(f"transformers has no model class for {type(spec.config).__name__} ({spec.architecture!r})")


def _contradiction(spec: Spec, wants: type) -> None:
    """A config whose ``architectures`` names a model of another ``model_type`` (a ``LlamaForCausalLM`` over a
    gpt2 config): refused, naming both, before the class reads fields the config does not have."""
    import transformers

    have = getattr(spec.config, "model_type", "") or type(spec.config).__name__
    other = getattr(wants, "model_type", "") or wants.__name__
    fits = None
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        with contextlib.suppress(ValueError, KeyError):
            fits = auto._model_mapping[type(spec.config)].__name__
            break
    where = getattr(spec.config, "name_or_path", "") or "the config"
    instead = f"[{fits!r}]" if fits else f"naming a {have!r} model class"
    raise CheckpointError(
        f"{where}: architectures names {spec.architecture} (a {other!r} model), but model_type is {have!r}\n"
        f"Make the config agree with itself: model_type {other!r}, or architectures {instead}."
    )


@contextlib.contextmanager
def building(device: str | torch.device | None) -> Iterator[None]:
    """The context a model is built in: the caller's (fake) mode if one is active, else a new ``fake_mode()``.

    Note: [build in the caller's mode] - a fake tensor belongs to the FakeTensorMode that made it, so a
    model built for a ``fv.record``/``fv.fake_mode`` block must be built under that block's mode (any
    dispatch mode on the stack, a real-run recording included, is the caller's choice); only with no mode
    active does ``build`` open its own ``fake_mode()``, whose fake tensors a later ``fv.record`` adopts.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    stack = _get_current_dispatch_mode_stack()
    fake_device(device, fake=not stack or any(isinstance(m, FakeTensorMode) for m in stack))  # mps: refused
    if stack:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            yield
    else:
        with fake_mode(device=device):
            yield


def instantiate(spec: Spec, dtype: torch.dtype | None) -> torch.nn.Module:
    """Build ``spec``'s model class at ``dtype`` (else the published dtype, else the default) in the current context."""
    cls = _model_class(spec)
    dtype = dtype or spec.dtype or torch.get_default_dtype()
    # this thread's default only, never torch's process-wide one (Note: [a thread's default dtype])
    with default_dtype(dtype if dtype.is_floating_point and dtype.itemsize >= 2 else None):
        model = cls._from_config(spec.config, dtype=dtype)
    if spec.entry is not None and spec.entry.loss_type and getattr(model, "loss_type", None) is None:
        model.loss_type = spec.entry.loss_type
    return model
