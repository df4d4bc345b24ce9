"""The bounds on every number a user or a file gives, checked before any work starts (Note: [size limits])."""

from __future__ import annotations

from typing import Any

from .errors import ArgumentError
from .gpus import MAX_JOB_BYTES, MAX_RANKS, PUBLISHED_GB

__all__ = ["MAX_JOB_BYTES", "MAX_REPEATS", "check_config", "check_repeats", "check_tokens", "config_bytes", "divisors", "token_width"]

# Note: [size limits]
# Two rules, defined here once, bound every number a user types or a config file holds, before work starts:
# * Bytes: nothing fakeviz models is larger than the memory of the largest job it plans: MAX_RANKS GPUs (Note:
#   [GPU counts]) of the catalog's largest GPU, MAX_JOB_BYTES (65,536 x 192 GB, about 12.6 PB). A config's weights,
#   estimated from its sizes at one byte per parameter (embeddings, positions, and per layer four hidden x hidden
#   attention matrices and three hidden x intermediate MLP matrices per expert), and a step's tokens (batch x seq,
#   each holding at least its widest activation in bf16: hidden state, MLP or logits) stay under it. Every size of a real model is far below (Llama
#   3.1 405B: about 0.4 TB at one byte); the bound also keeps every element count far from int64's end.
# * Work: fakeviz answers in minutes, and a count that repeats work (the layers it builds, about 12 ms each, and
#   records; the training steps the command line records) is at most MAX_REPEATS, 1,024: 8x the deepest published
#   model in the catalog (Llama 3.1 405B's 126 layers). Searches over divisors cost O(sqrt n) (:func:`divisors`).

#: The most layers built, or steps recorded, for one answer (Note: [size limits]).
MAX_REPEATS = 1024

_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers")
_HIDDEN = ("hidden_size", "d_model", "n_embd", "dim")
_INTER = ("intermediate_size", "d_ff", "n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "moe_intermediate_size")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_WIDE = ("vocab_size", "max_position_embeddings", "n_positions", "max_target_positions", "max_source_positions")


def _int(cfg: Any, name: str) -> int | None:
    try:
        v = getattr(cfg, name, None)
    except Exception:  # noqa: BLE001 - a config property that cannot answer is not a size
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _sizes(cfg: Any, names: tuple[str, ...]) -> list[tuple[str, int]]:
    return [(n, v) for n in names if (v := _int(cfg, n)) is not None]


def _parts(cfg: Any) -> list[Any]:
    """The config and the configs it holds (a multimodal model's text and vision parts, an encoder's decoder)."""
    out = [cfg]
    for name in ("text_config", "vision_config", "audio_config", "encoder", "decoder"):
        sub = getattr(cfg, name, None)
        if sub is not None and hasattr(sub, "to_dict") and sub is not cfg:
            out.append(sub)
    return out


def config_bytes(cfg: Any) -> int:
    """A config's weights at one byte per parameter, estimated from its sizes (Note: [size limits])."""
    total = 0
    for part in _parts(cfg):
        hidden = max((v for _, v in _sizes(part, _HIDDEN)), default=0)
        inter = max((v for _, v in _sizes(part, _INTER)), default=0) or 4 * hidden
        layers = sum(v for _, v in _sizes(part, _LAYERS[:4])) or sum(v for _, v in _sizes(part, _LAYERS[4:]))
        experts = max((v for _, v in _sizes(part, _EXPERTS)), default=0) or 1
        wide = sum(max(v, 0) for _, v in _sizes(part, _WIDE))
        total += max(wide, 0) * max(hidden, 0) + max(layers, 0) * max(hidden, 0) * (4 * max(hidden, 0) + 3 * max(inter, 0) * experts)
    return total


def _advice(field: str, value: int, limit: int) -> str:
    return f"Give {field} <= {limit:,} (Note: [size limits] in fakeviz._core.limits; docs/limitations.md)."


def check_config(cfg: Any, where: str = "") -> None:
    """Refuse a config with more than :data:`MAX_REPEATS` layers, or weights past :data:`MAX_JOB_BYTES` at one byte
    per parameter, before anything is built (Note: [size limits]). ``where``: the model, for the error.

    Raises:
        ArgumentError: (a ``ValueError``) naming the field, its value and the bound.
    """
    at = f"{where}: " if where else ""
    for part in _parts(cfg):
        for field, v in _sizes(part, _LAYERS):
            if v > MAX_REPEATS:
                raise ArgumentError(
                    field, v, f"{v:,} layers; fakeviz builds at most {MAX_REPEATS:,} (8x the deepest published "
                    "model's 126), each about 12 ms to build and more to record", _advice(field, v, MAX_REPEATS),
                    written=f"{at}{field}={v:,}",
                )  # fmt: skip
    est = config_bytes(cfg)
    if est > MAX_JOB_BYTES:
        fields = [(f, v) for part in _parts(cfg) for f, v in _sizes(part, _HIDDEN + _INTER + _WIDE + _EXPERTS)]
        field, v = max(fields, key=lambda fv: fv[1]) if fields else ("hidden_size", 0)
        raise ArgumentError(
            field, v, f"weights of about {est:.3g} bytes at one byte per parameter, more than the "
            f"{MAX_JOB_BYTES / 1e15:.1f} PB of the largest job fakeviz plans ({MAX_RANKS:,} GPUs of "
            f"{max(PUBLISHED_GB.values())} GB)", "Give the sizes of a model a job could hold: a smaller "
            f"{field} (Note: [size limits] in fakeviz._core.limits; docs/limitations.md).",
            written=f"{at}{field}={v:,}",
        )  # fmt: skip


def token_width(cfg: Any) -> int:
    """A token's widest activation in ``cfg``'s model: its hidden state, MLP or logits (Note: [size limits])."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return max((v for _, v in _sizes(text, _HIDDEN + _INTER + ("vocab_size",))), default=1) or 1


def check_tokens(batch: int, seq: int, hidden: int, *, written: str | None = None, argument: str = "batch") -> None:
    """Refuse a step of ``batch x seq`` tokens whose widest activations alone (bf16) pass :data:`MAX_JOB_BYTES`;
    ``argument``: the one the error names (``batch``; ``max_num_batched_tokens`` with ``batch`` 1)."""
    need = batch * seq * max(hidden, 1) * 2
    if need > MAX_JOB_BYTES:
        most = max(MAX_JOB_BYTES // (seq * max(hidden, 1) * 2), 0)
        if argument != "batch":
            raise ArgumentError(
                argument, seq, f"{seq:,} tokens hold {need:.3g} bytes of activations (width {hidden:,}, bf16) "
                f"alone, more than the {MAX_JOB_BYTES / 1e15:.1f} PB of the largest job fakeviz plans",
                f"Give {argument} <= {MAX_JOB_BYTES // (max(hidden, 1) * 2):,} (Note: [size limits] in "
                "fakeviz._core.limits).", written=written,
            )  # fmt: skip
        raise ArgumentError(
            "batch", batch, f"{batch:,} x {seq:,} tokens hold {need:.3g} bytes of activations (width "
            f"{hidden:,}, bf16) alone, more than the {MAX_JOB_BYTES / 1e15:.1f} PB of the largest job fakeviz plans",
            f"Give batch <= {most:,} at this seq (Note: [size limits] in fakeviz._core.limits).",
            written=written or f"batch={batch:,}, seq={seq:,}",
        )  # fmt: skip


def check_repeats(name: str, value: int, *, written: str | None = None) -> int:
    """``value`` within 1..:data:`MAX_REPEATS` (steps to record, layers to build: Note: [size limits])."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEATS:
        raise ArgumentError(
            name, value, f"a whole number from 1 to {MAX_REPEATS:,}: each one is recorded",
            f"Give e.g. {name}=2 (Note: [size limits] in fakeviz._core.limits).", written=written,
        )  # fmt: skip
    return value


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, ascending, in O(sqrt n)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]
