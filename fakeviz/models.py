"""Model configs shipped with fakeviz (shapes only, never weights).

``config("llama3-70b")`` returns a ``transformers.LlamaConfig``;
``build(name, dtype=torch.bfloat16)`` instantiates the model class in the
current (fake) context. Requires the ``hf`` extra (transformers).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import torch

__all__ = ["available", "build", "config"]

_FILES = {"llama3-70b": "llama3_70b.json", "llama3-405b": "llama3_405b.json"}


def available() -> list[str]:
    """Names of the shipped configs."""
    return sorted(_FILES)


def config(name: str, **overrides: Any) -> Any:
    """A transformers config for a shipped model shape; ``overrides`` replace fields."""
    if name not in _FILES:
        raise ValueError(f"unknown model {name!r}; shipped: {', '.join(available())}")
    raw = json.loads(resources.files("fakeviz.configs").joinpath(_FILES[name]).read_text())
    raw.pop("_comment", None)
    raw.update(overrides)
    import transformers

    cls = transformers.AutoConfig.for_model(raw.pop("model_type"))
    return cls.__class__(**raw) if not isinstance(cls, type) else cls(**raw)


def build(name_or_config: Any, *, dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> torch.nn.Module:
    """Instantiate a causal LM from a shipped config name or a config, with ``dtype`` weights.

    Call it under :func:`fakeviz.fake_mode` or :func:`fakeviz.record`, or it
    allocates real memory.
    """
    import transformers

    cfg = config(name_or_config, **overrides) if isinstance(name_or_config, str) else name_or_config
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    finally:
        torch.set_default_dtype(saved)
