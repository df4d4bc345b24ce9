"""The catalog of published model configs shipped in ``fakeviz/models/configs/*.json`` (no hub access).

Each JSON file is one entry: the hub id (``name``), short ``aliases``, ``family``, ``task`` (which inputs
a forward takes, see :mod:`fakeviz.models._inputs`), ``license`` and ``gated`` (whether the hub asks
users to accept terms before downloading), ``trainable``, the published parameter total with its source
(``parameters``: ``total``, ``exact``, ``unit`` (the rounding of a rounded figure), ``source``), and
``config``: the values of the published ``config.json`` (``architectures[0]`` is the class built).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from .._core.errors import UnknownModelError

__all__ = ["CatalogEntry", "catalog", "entries", "resolve", "suggest"]


@dataclass(frozen=True)
class CatalogEntry:
    """One published model of the catalog.

    Attributes:
        name: the hub id (``"meta-llama/Llama-3.1-70B"``).
        aliases: short names (``"llama-3.1-70b"``); lookups ignore case.
        family: the architecture family (``"llama"``, ``"mixtral"``, ...).
        task: the inputs a forward takes (``"causal_lm"``, ``"masked_lm"``, ``"seq2seq"``,
            ``"speech_seq2seq"``, ``"image_classification"``, ``"contrastive"``).
        architecture: the transformers class built (``config["architectures"][0]``).
        license: the license id on the hub.
        gated: the hub asks users to accept terms before downloading the weights.
        trainable: the built class computes a training loss from labels (fwd+bwd is meaningful).
        parameters: the published parameter total (tied weights once).
        parameters_exact: ``parameters`` is exact (else rounded to ``parameters_unit``).
        parameters_unit: the rounding of a rounded figure (1 when exact).
        parameters_source: where the figure comes from.
        config: the published ``config.json`` values (``architectures`` and ``model_type`` included).
        loss_type: set on the built model where its class leaves it unset (GPT-2).
        notes: anything a user should know (published dtype, what transformers leaves out).
    """

    name: str
    aliases: tuple[str, ...]
    family: str
    task: str
    architecture: str
    license: str
    gated: bool
    trainable: bool
    parameters: int
    parameters_exact: bool
    parameters_unit: int
    parameters_source: str
    config: dict[str, Any] = field(repr=False)
    loss_type: str | None = None
    notes: str = ""

    @property
    def layers(self) -> int:
        """Transformer blocks (encoder + decoder, text + vision)."""
        return _layers(self.config)

    @property
    def context_length(self) -> int | None:
        """Longest input the model's positions cover (tokens; patches + 1 for a ViT; None if unbounded)."""
        return _context(self.config)

    @property
    def dtype(self) -> str:
        """The dtype of the published weights (``torch_dtype`` of the config)."""
        return str(self.config.get("torch_dtype") or self.config.get("dtype") or "float32")


def _layers(c: dict[str, Any]) -> int:
    for key in ("num_hidden_layers", "n_layer"):
        if key in c:
            return int(c[key])
    if "num_layers" in c:
        return int(c["num_layers"]) + int(c.get("num_decoder_layers") or c["num_layers"])
    if "encoder_layers" in c:
        return int(c["encoder_layers"]) + int(c["decoder_layers"])
    return sum(_layers(c[k]) for k in ("text_config", "vision_config") if k in c)


def _context(c: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_target_positions"):
        if c.get(key):
            return int(c[key])
    if "image_size" in c and "patch_size" in c:
        return (int(c["image_size"]) // int(c["patch_size"])) ** 2 + 1
    if "text_config" in c:
        return _context(c["text_config"])
    return None


def _key(name: str) -> str:
    return name.strip().lower()


@cache
def entries() -> tuple[CatalogEntry, ...]:
    """Every catalog entry, read once from the package's JSON files, sorted by family then name."""
    out = []
    for f in resources.files("fakeviz.models").joinpath("configs").iterdir():
        if not f.name.endswith(".json"):
            continue
        raw = json.loads(f.read_text())
        p = raw["parameters"]
        out.append(
            CatalogEntry(
                name=raw["name"], aliases=tuple(raw.get("aliases", ())), family=raw["family"], task=raw["task"],
                architecture=raw["config"]["architectures"][0], license=raw["license"], gated=bool(raw["gated"]),
                trainable=bool(raw.get("trainable", True)), parameters=int(p["total"]),
                parameters_exact=bool(p["exact"]), parameters_unit=int(p.get("unit", 1)),
                parameters_source=p["source"], config=raw["config"], loss_type=raw.get("loss_type"),
                notes=raw.get("notes", ""),
            )
        )  # fmt: skip
    return tuple(sorted(out, key=lambda e: (e.family, e.name)))


@cache
def _index() -> dict[str, CatalogEntry]:
    idx: dict[str, CatalogEntry] = {}
    for e in entries():
        for n in (e.name, e.name.split("/")[-1], *e.aliases):
            k = _key(n)
            if k in idx and idx[k] is not e:
                raise RuntimeError(f"catalog name {n!r} names both {idx[k].name} and {e.name}")
            idx[k] = e
    return idx


def resolve(name: str) -> CatalogEntry:
    """The catalog entry of a hub id (``"meta-llama/Llama-3.1-70B"``), its last part or an alias (any case).

    Raises:
        UnknownModelError: (a ``ValueError``) the name is not in the catalog; the message suggests near names.
    """
    entry = _index().get(_key(name))
    if entry is not None:
        return entry
    near = suggest(name)
    hint = f"Did you mean {' or '.join(repr(n) for n in near)}?\n" if near else ""
    raise UnknownModelError(
        f"unknown model {name!r}: not in fakeviz's catalog of {len(entries())} published configs.\n{hint}"
        "See fakeviz.models.catalog() for the names, or pass a folder / config.json / transformers config.",
        name=name,
        suggestions=near,
    )


def suggest(name: str, n: int = 3) -> tuple[str, ...]:
    """The catalog names nearest ``name`` (or its last part), best first, at most ``n``."""
    idx = _index()
    key = _key(name)
    keys = list(idx)
    picked = difflib.get_close_matches(key, keys, n=n * 2, cutoff=0.6)
    tail = re.split(r"[/\\]", key)[-1]
    if tail != key:
        picked += difflib.get_close_matches(tail, keys, n=n, cutoff=0.6)
    out: list[str] = []
    for k in picked:
        if idx[k].name not in out:
            out.append(idx[k].name)
    return tuple(out[:n])


def catalog() -> Any:
    """The catalog as a pandas DataFrame, one row per published model.

    Columns: ``name`` (hub id), ``aliases``, ``family``, ``architecture``, ``task``, ``parameters``
    (published total), ``parameters_exact``, ``layers``, ``context_length``, ``dtype`` (of the published
    weights), ``license``, ``gated`` (the license gate: the hub asks to accept terms), ``trainable``.
    """
    import pandas as pd

    rows = [
        {
            "name": e.name, "aliases": ", ".join(e.aliases), "family": e.family, "architecture": e.architecture,
            "task": e.task, "parameters": e.parameters, "parameters_exact": e.parameters_exact, "layers": e.layers,
            "context_length": e.context_length, "dtype": e.dtype, "license": e.license, "gated": e.gated,
            "trainable": e.trainable,
        }
        for e in entries()
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    df["context_length"] = df["context_length"].astype("Int64")
    return df
