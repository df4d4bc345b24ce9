"""Forward inputs (with labels) for the models of the catalog, made in the caller's (fake) context."""

from __future__ import annotations

from typing import Any

import torch

from .._core.errors import SequenceTooLongError
from .._core.limits import check_tokens, token_width

__all__ = ["check_config_step", "check_seq", "context", "inputs", "task_of"]

# position ids of these models start after the padding index (RoBERTa's create_position_ids_from_input_ids):
# max_position_embeddings - pad_token_id - 1 positions are left for the tokens
_PADDED_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "longformer"})


def task_of(model: torch.nn.Module) -> str:
    """The task a model class's forward takes inputs for (see :class:`~fakeviz.models.CatalogEntry`)."""
    return _task_of_class(type(model).__name__)


def _task_of_class(name: str) -> str:
    if name == "CLIPModel":
        return "contrastive"
    if name.startswith("Whisper") and name.endswith("ForConditionalGeneration"):
        return "speech_seq2seq"
    if name.endswith("ForImageClassification"):
        return "image_classification"
    if name.endswith("ForMaskedLM"):
        return "masked_lm"
    if name.endswith("ForConditionalGeneration"):
        return "seq2seq"
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    raise ValueError(f"no example inputs for {name}: build its inputs yourself")


def context(model: torch.nn.Module) -> tuple[int, str] | None:
    """The longest token sequence ``model``'s forward accepts for its task, and the config field that says so;
    None where nothing bounds it (relative positions: T5) or the task takes no tokens (images)."""
    try:
        task = task_of(model)
    except ValueError:
        return None
    return _context(task, model.config)


def _context(task: str, cfg: Any) -> tuple[int, str] | None:
    if task == "contrastive":
        cfg = cfg.text_config
    elif task == "speech_seq2seq":
        return int(cfg.max_target_positions), "max_target_positions"
    elif task == "image_classification":
        return None
    # T5's n_positions is a leftover: its relative positions take any length (seq2seq models: the field alone)
    for field in ("max_position_embeddings",) if task == "seq2seq" else ("max_position_embeddings", "n_positions"):
        n = getattr(cfg, field, None)
        if isinstance(n, int) and n > 0:
            if getattr(cfg, "model_type", "") in _PADDED_POSITIONS:
                return n - (getattr(cfg, "pad_token_id", None) or 1) - 1, f"{field} less the padding offset"
            return n, field
    return None


def check_seq(model: torch.nn.Module, seq: int, new_tokens: int = 0) -> None:
    """Refuse ``seq`` (plus ``new_tokens`` generated after it) past the model's :func:`context`.

    Raises:
        SequenceTooLongError: naming the context, the config field and the longest sequence to ask for.
    """
    _refuse_past(context(model), getattr(model.config, "_name_or_path", "") or type(model).__name__, seq, new_tokens)


def check_config_step(config: Any, architecture: str | None, *, batch: int, seq: int, new_tokens: int = 0) -> None:
    """Before anything is built or recorded: ``seq`` (+ ``new_tokens``) within the context of the model
    ``config`` describes (``architecture``: its class name, as ``architectures`` gives it), and a step's tokens
    within Note: [size limits] (their widest activations alone under the memory of the largest job).

    Raises:
        SequenceTooLongError: past the context. ArgumentError: too many tokens.
    """
    check_tokens(batch, seq + new_tokens, token_width(config))
    try:
        task = _task_of_class(architecture or "")
    except ValueError:
        return
    _refuse_past(_context(task, config), getattr(config, "_name_or_path", "") or str(architecture), seq, new_tokens)


def _refuse_past(bound: tuple[int, str] | None, name: str, seq: int, new_tokens: int) -> None:
    if bound is None or seq + new_tokens <= bound[0]:
        return
    limit, field = bound
    asked = f"seq={seq:,}" + (f" + new_tokens={new_tokens:,}" if new_tokens else "")
    longest = f"seq <= {limit - new_tokens:,}" if limit > new_tokens else f"new_tokens < {limit:,}"
    raise SequenceTooLongError(
        f"{asked} is past {name}'s context of {limit:,} positions (config {field}); ask for {longest}, or "
        "a model with a longer context",
        seq=seq + new_tokens,
        context=limit,
    )


def inputs(model: torch.nn.Module, *, batch: int = 1, seq: int = 128, labels: bool = True) -> dict[str, Any]:
    """Keyword arguments of one forward of ``model`` (labels included unless ``labels=False``).

    Token ids and images are made on the device of the model's parameters, floating inputs at their dtype,
    inside the caller's context: under a fake mode they are fake. A ``seq`` past the model's context is refused
    (:func:`check_seq`); an image takes the config's size, audio 30 s of mel frames.

    Raises:
        ValueError: ``batch`` or ``seq`` below 1.
        SequenceTooLongError: ``seq`` past the model's context.
    """
    for name, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"models.inputs: {name}={v!r}; give a whole number >= 1")
    check_seq(model, seq)
    check_config_step(model.config, None, batch=batch, seq=seq)  # Note: [size limits]
    p = next(model.parameters())
    dev, fdt = p.device, p.dtype if p.dtype.is_floating_point else torch.get_default_dtype()
    cfg = model.config
    task = task_of(model)

    def ids(vocab: int, n: int, low: int = 5) -> torch.Tensor:
        return torch.randint(low, vocab, (batch, n), device=dev)

    if task == "causal_lm":
        x = ids(cfg.vocab_size, seq)
        return {"input_ids": x, **({"labels": x} if labels else {})}
    if task == "masked_lm":
        x = ids(cfg.vocab_size, seq)
        out: dict[str, Any] = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        if labels:
            y = torch.full_like(x, -100)
            y[:, 1::3] = x[:, 1::3]
            out["labels"] = y
        return out
    if task == "seq2seq":
        x = ids(cfg.vocab_size, seq)
        y = ids(cfg.vocab_size, max(seq // 2, 1))
        return {"input_ids": x, **({"labels": y} if labels else {"decoder_input_ids": y})}
    if task == "speech_seq2seq":
        feats = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions, device=dev, dtype=fdt)
        y = ids(cfg.vocab_size, seq)
        return {"input_features": feats, **({"labels": y} if labels else {"decoder_input_ids": y})}
    if task == "image_classification":
        px = torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size, device=dev, dtype=fdt)
        return {
            "pixel_values": px,
            **({"labels": torch.randint(0, cfg.num_labels, (batch,), device=dev)} if labels else {}),
        }
    # contrastive (CLIP)
    tc, vc = cfg.text_config, cfg.vision_config
    x = ids(tc.vocab_size, seq, low=0)
    px = torch.randn(batch, vc.num_channels, vc.image_size, vc.image_size, device=dev, dtype=fdt)
    return {"input_ids": x, "pixel_values": px, "return_loss": labels}
