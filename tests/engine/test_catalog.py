"""fakeviz.models: the catalog of published configs, names, parameter counts, and every entry run on fake cuda."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import fakeviz as fv
from fakeviz import models
from fakeviz._core.errors import CheckpointError, UnknownModelError
from fakeviz.models import CatalogEntry

pytest.importorskip("transformers")

ENTRIES: tuple[CatalogEntry, ...] = models._catalog.entries()

# the heaviest full-size fwd+bwd runs (about 4-13 s each on fake cuda): in the default run their parameter
# count is checked on the built model, the forward and backward run under -m slow
HEAVY = {
    "deepseek-ai/DeepSeek-V3", "meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3-70B",
    "mistralai/Mixtral-8x22B-v0.1", "Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B",
    "google-t5/t5-11b", "openai/whisper-large-v3",
}  # fmt: skip

REQUIRED = [
    "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B", "mistralai/Mistral-7B-v0.1", "mistralai/Mixtral-8x7B-v0.1",
    "mistralai/Mixtral-8x22B-v0.1", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-72B", "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B",
    "deepseek-ai/DeepSeek-V3", "google/gemma-2-9b", "google/gemma-2-27b", "google/gemma-3-1b-pt",
    "microsoft/Phi-3-mini-4k-instruct", "microsoft/phi-4", "openai-community/gpt2", "openai-community/gpt2-medium",
    "openai-community/gpt2-large", "openai-community/gpt2-xl", "google-bert/bert-base-uncased",
    "google-bert/bert-large-uncased", "FacebookAI/roberta-base", "google-t5/t5-base", "google-t5/t5-11b",
    "openai/whisper-large-v3", "google/vit-base-patch16-224", "openai/clip-vit-base-patch32",
    "facebook/blenderbot-400M-distill",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet():
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


# ------------------------------------------------------------------------------------------ names
def test_catalog_covers_the_published_models():
    names = {e.name for e in ENTRIES}
    assert len(ENTRIES) >= 30
    assert not [n for n in REQUIRED if n not in names]
    assert len({e.family for e in ENTRIES}) >= 15


def test_names_resolve_by_hub_id_last_part_alias_any_case():
    e = models.resolve("meta-llama/Llama-3.1-70B")
    assert e.name == "meta-llama/Llama-3.1-70B"
    assert models.resolve("Llama-3.1-70B") is e
    assert models.resolve("LLAMA3.1-70B") is e
    assert models.resolve(" llama-3.1-70b ") is e
    assert models.resolve("gpt2").name == "openai-community/gpt2"
    assert models.resolve("mistralai/Mixtral-8x7B-v0.1").family == "mixtral"
    assert models.resolve("llama3-70b").name == "meta-llama/Meta-Llama-3-70B"  # the name fakeviz shipped before


def test_unknown_name_suggests_near_names():
    with pytest.raises(UnknownModelError) as ei:
        models.resolve("meta-llama/Llama-3.1-80B")
    err = ei.value
    assert isinstance(err, ValueError)
    assert err.suggestions and err.suggestions[0].startswith("meta-llama/Llama-3.1-")
    msg = str(err)
    assert msg.startswith("unknown model 'meta-llama/Llama-3.1-80B'")
    assert "Did you mean" in msg and "catalog()" in msg and len(msg.splitlines()) <= 25
    with pytest.raises(UnknownModelError, match="Mixtral-8x7B-v0.1"):
        models.build("mixtrel-8x7b")
    with pytest.raises(UnknownModelError) as ei:
        models.resolve("zzzz-qqqq")
    assert ei.value.suggestions == () and "Did you mean" not in str(ei.value)


def test_catalog_dataframe():
    df = models.catalog()
    cols = ["name", "aliases", "family", "architecture", "task", "parameters", "parameters_exact", "layers",
            "context_length", "dtype", "license", "gated", "trainable"]  # fmt: skip
    assert list(df.columns) == cols
    assert len(df) == len(ENTRIES) and df["name"].is_unique
    row = df.set_index("name").loc["meta-llama/Llama-3.1-70B"]
    assert (row.parameters, row.layers, row.context_length, bool(row.gated)) == (70553706496, 80, 131072, True)
    assert df.set_index("name").loc["google/vit-base-patch16-224"].context_length == 197
    assert not df[["name", "family", "parameters", "layers", "license"]].isna().any().any()


def test_entries_record_their_source_and_published_config():
    for e in ENTRIES:
        assert e.parameters_source and e.parameters > 0
        assert e.parameters_exact == (e.parameters_unit == 1)
        assert e.config["architectures"] == [e.architecture] and e.config["model_type"]


# ------------------------------------------------------------------------------ every entry runs
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_parameters_and_training_step(entry: CatalogEntry):
    """Built on fake cuda:0: the parameter count is the published one, and a forward (+ backward) records."""
    with fv.record(device="cuda:0") as trace:
        model = models.build(entry.name)
        count = n_params(model)
        if entry.parameters_exact:
            assert count == entry.parameters, f"{count:,} != published {entry.parameters:,}"
        else:  # the published figure is rounded to parameters_unit
            assert abs(count - entry.parameters) <= entry.parameters_unit / 2, (count, entry.parameters)
        p = next(model.parameters())
        assert fv.is_fake(p) and p.device == torch.device("cuda:0")
        assert str(p.dtype) == f"torch.{entry.dtype}"
        if entry.name in HEAVY:
            return
        out = model(**models.inputs(model, seq=8))
        if entry.trainable:
            out.loss.backward()
    assert trace.complete if hasattr(trace, "complete") else True
    peak = trace.peak()["cuda:0"]
    assert peak.by_category["Parameter"] >= count * p.dtype.itemsize * 0.99
    if entry.trainable:
        assert peak.by_category["Gradient"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HEAVY))
def test_heavy_entry_training_step(name: str):
    with fv.record(device="cuda:0", gpu="H200") as trace:
        model = models.build(name)
        model(**models.inputs(model, seq=8)).loss.backward()
    assert trace.peak()["cuda:0"].by_category["Gradient"] > 0


# ------------------------------------------------------------------------------------ build sources
def test_build_from_folder_config_json_dict_and_config_object(tmp_path):
    entry = models.resolve("gpt2")
    small = {**entry.config, "n_layer": 2, "n_embd": 64, "n_head": 2}
    (tmp_path / "config.json").write_text(json.dumps(small))
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2)
    for spec in (tmp_path, tmp_path / "config.json", str(tmp_path), small, cfg):
        m = models.build(spec)
        assert type(m).__name__ == "GPT2LMHeadModel" and len(m.transformer.h) == 2
        assert fv.is_fake(m.transformer.wte.weight) and m.transformer.wte.weight.shape == (50257, 64)
    assert cfg.n_layer == 2  # the caller's config object is not changed by overrides
    m = models.build(cfg, n_layer=1)
    assert len(m.transformer.h) == 1 and cfg.n_layer == 2
    m = models.build("gpt2", device="cuda:0", dtype="bf16", n_layer=1)
    w = m.transformer.wte.weight
    assert (w.device, w.dtype, len(m.transformer.h)) == (torch.device("cuda:0"), torch.bfloat16, 1)


def test_build_errors_are_short(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        models.build(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not readable as JSON"):
        models.build(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(CheckpointError, match="not known to transformers"):
        models.build(tmp_path)
    with pytest.raises(ValueError, match="dtype='bf17'"):
        models.build("gpt2", dtype="bf17")
    with pytest.raises(TypeError):
        models.build(3)
    with fv.fake_mode():
        pass  # no fake mode left on the stack by the failed builds
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert not _get_current_dispatch_mode_stack()


def test_build_uses_the_callers_mode_and_a_model_built_alone_records_later():
    with fv.fake_mode() as mode:
        m = models.build("gpt2", n_layer=1)
        assert m.transformer.wte.weight.fake_mode is mode
    alone = models.build("gpt2", n_layer=1, dtype=torch.float32)  # its own fake_mode, closed on return
    assert fv.is_fake(alone.transformer.wte.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fv.record() as trace:
            x = torch.randint(0, 50257, (1, 8))
            alone(input_ids=x, labels=x).loss.backward()
    assert trace.peak()["cpu"].by_category["Gradient"] > 0


def test_real_recording_builds_real(tmp_path):
    """Under fv.record(fake=False) the caller asked for a real run: build makes real tensors."""
    with fv.record(fake=False):
        m = models.build("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    assert not fv.is_fake(m.transformer.wte.weight)
    assert m.transformer.wte.weight.shape == (64, 32)
