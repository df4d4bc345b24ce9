"""Forward inputs (with labels) for the models of the catalog, made in the caller's (fake) context."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["inputs", "task_of"]


def task_of(model: torch.nn.Module) -> str:
    """The task a model class's forward takes inputs for (see :class:`~fakeviz.models.CatalogEntry`)."""
    name = type(model).__name__
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


def inputs(model: torch.nn.Module, *, batch: int = 1, seq: int = 128, labels: bool = True) -> dict[str, Any]:
    """Keyword arguments of one forward of ``model`` (labels included unless ``labels=False``).

    Token ids and images are made on the device of the model's parameters, floating inputs at their dtype,
    inside the caller's context: under a fake mode they are fake. ``seq`` is capped at the model's
    context; an image takes the config's size, audio 30 s of mel frames.
    """
    p = next(model.parameters())
    dev, fdt = p.device, p.dtype if p.dtype.is_floating_point else torch.get_default_dtype()
    cfg = model.config
    task = task_of(model)

    def ids(vocab: int, n: int, low: int = 5) -> torch.Tensor:
        return torch.randint(low, vocab, (batch, n), device=dev)

    if task == "causal_lm":
        n = min(seq, getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or seq)
        x = ids(cfg.vocab_size, n)
        return {"input_ids": x, **({"labels": x} if labels else {})}
    if task == "masked_lm":
        n = min(seq, cfg.max_position_embeddings - 2)
        x = ids(cfg.vocab_size, n)
        out: dict[str, Any] = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        if labels:
            y = torch.full_like(x, -100)
            y[:, 1::3] = x[:, 1::3]
            out["labels"] = y
        return out
    if task == "seq2seq":
        limit = getattr(cfg, "max_position_embeddings", None) or seq
        x = ids(cfg.vocab_size, min(seq, limit))
        y = ids(cfg.vocab_size, min(max(seq // 2, 1), limit))
        return {"input_ids": x, **({"labels": y} if labels else {"decoder_input_ids": y})}
    if task == "speech_seq2seq":
        feats = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions, device=dev, dtype=fdt)
        y = ids(cfg.vocab_size, min(seq, cfg.max_target_positions))
        return {"input_features": feats, **({"labels": y} if labels else {"decoder_input_ids": y})}
    if task == "image_classification":
        px = torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size, device=dev, dtype=fdt)
        return {
            "pixel_values": px,
            **({"labels": torch.randint(0, cfg.num_labels, (batch,), device=dev)} if labels else {}),
        }
    # contrastive (CLIP)
    tc, vc = cfg.text_config, cfg.vision_config
    x = ids(tc.vocab_size, min(seq, tc.max_position_embeddings), low=0)
    px = torch.randn(batch, vc.num_channels, vc.image_size, vc.image_size, device=dev, dtype=fdt)
    return {"input_ids": x, "pixel_values": px, "return_loss": labels}
