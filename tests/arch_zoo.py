"""Twenty-two transformers architectures, each as a tiny config and as its published full-size config.

``ARCHS[name]`` is an :class:`Arch`: the model class, the published checkpoint the full config copies,
``tiny`` and ``full`` config kwargs, and how to build a training step's inputs. The full configs are the
values of the published checkpoints' ``config.json``, written out here (no hub access at run time); the
tiny ones keep each architecture's features (GQA, sliding windows, MoE routing, relative positions,
soft-capping, parallel residuals, ...) at hidden sizes of 32-64 and 2 layers, so a real CPU step takes
milliseconds.

Rules for the tiny configs, as in ``tests/zoo.py``: every dropout and LayerDrop probability is 0 (the
models stay in training mode), ``attn_implementation="eager"`` (a real and a fake run take the same
attention path), and inputs are drawn from fixed seeds. The full configs keep the published dropout
values and the default attention implementation (what a user who copies the config gets).

``run(name, size)`` is one training step: seed, build, inputs, forward with a loss, backward. Call it
inside ``fv.record(...)``: the full sizes only under a fake recording (``fv.record(device="cuda:0",
dtype=torch.bfloat16)``), where parameters take no memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["ARCHS", "Arch", "build", "config", "inputs", "run", "supports_sdpa"]

SEED = 0


@dataclasses.dataclass(frozen=True)
class Arch:
    """One architecture: what to build and how to feed it.

    Attributes:
        model_cls: the ``transformers`` model class (with a training head that returns ``.loss``).
        config_cls: its config class.
        checkpoint: the published checkpoint whose ``config.json`` ``full`` copies.
        full: the published config, as kwargs of ``config_cls``.
        tiny: a small config of the same architecture, as kwargs.
        make_inputs: ``(config, size) -> kwargs`` of the model's forward, labels included.
        moe: the model routes tokens to experts (``torch._grouped_mm`` on recent transformers).
        loss_type: set on the built model where its class leaves it unset.
    """

    model_cls: str
    config_cls: str
    checkpoint: str
    full: dict[str, Any]
    tiny: dict[str, Any]
    make_inputs: Callable[[Any, str], dict[str, Any]]
    moe: bool = False
    loss_type: str | None = None


# ------------------------------------------------------------------------------------------- inputs
def _ids(vocab: int, shape: tuple[int, ...], seed: int = 1, low: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(low, vocab, shape)


def _seq(size: str, tiny: int, full: int) -> int:
    return tiny if size == "tiny" else full


def _batch(size: str, tiny: int = 2, full: int = 1) -> int:
    return tiny if size == "tiny" else full


def _causal_lm(full_seq: int) -> Callable[[Any, str], dict[str, Any]]:
    def make(cfg: Any, size: str) -> dict[str, Any]:
        ids = _ids(cfg.vocab_size, (_batch(size), _seq(size, 8, full_seq)))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    return make


def _masked_lm(full_seq: int) -> Callable[[Any, str], dict[str, Any]]:
    def make(cfg: Any, size: str) -> dict[str, Any]:
        ids = _ids(cfg.vocab_size, (_batch(size), _seq(size, 8, full_seq)), low=5)  # no special token ids
        labels = torch.full(ids.shape, -100, dtype=torch.long)
        labels[:, 1::3] = ids[:, 1::3]  # a fixed mask pattern: no data-dependent shapes
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    return make


def _seq_classification(full_seq: int) -> Callable[[Any, str], dict[str, Any]]:
    def make(cfg: Any, size: str) -> dict[str, Any]:
        b = _batch(size)
        ids = _ids(cfg.vocab_size, (b, _seq(size, 8, full_seq)), low=5)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": _ids(cfg.num_labels, (b,), seed=2)}

    return make


def _seq2seq(full_src: int, full_tgt: int) -> Callable[[Any, str], dict[str, Any]]:
    def make(cfg: Any, size: str) -> dict[str, Any]:
        b = _batch(size)
        ids = _ids(cfg.vocab_size, (b, _seq(size, 8, full_src)), low=5)
        labels = _ids(cfg.vocab_size, (b, _seq(size, 6, full_tgt)), seed=2, low=5)
        # decoder ids: labels shifted right by the model
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    return make


def _whisper(cfg: Any, size: str) -> dict[str, Any]:
    b = _batch(size)
    torch.manual_seed(1)
    # the encoder takes exactly 2 * max_source_positions mel frames (30 s of audio at full size)
    feats = torch.randn(b, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    labels = _ids(cfg.vocab_size, (b, _seq(size, 6, 128)), seed=2, low=5)
    return {"input_features": feats, "labels": labels}


def _image_classification(cfg: Any, size: str) -> dict[str, Any]:
    b = _batch(size)
    torch.manual_seed(1)
    pixels = torch.randn(b, cfg.num_channels, cfg.image_size, cfg.image_size)
    return {"pixel_values": pixels, "labels": _ids(cfg.num_labels, (b,), seed=2)}


def _clip(cfg: Any, size: str) -> dict[str, Any]:
    b = _batch(size, 2, 8)  # a contrastive loss needs more than one pair
    tc, vc = cfg.text_config, cfg.vision_config
    ids = _ids(tc.vocab_size, (b, _seq(size, 8, tc.max_position_embeddings)))
    torch.manual_seed(2)
    pixels = torch.randn(b, vc.num_channels, vc.image_size, vc.image_size)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels, "return_loss": True}


def _ctc(cfg: Any, size: str) -> dict[str, Any]:
    b = _batch(size)
    torch.manual_seed(1)
    audio = torch.randn(b, _seq(size, 400, 16000 * 10))  # 10 s at 16 kHz at full size
    labels = _ids(cfg.vocab_size, (b, _seq(size, 6, 120)), seed=2, low=1)  # 0 is the CTC blank (pad)
    return {"input_values": audio, "labels": labels}


# -------------------------------------------------------------------------------------- the zoo
_NO_DROPOUT_LLM = {"attention_dropout": 0.0}

ARCHS: dict[str, Arch] = {
    "llama": Arch(
        "LlamaForCausalLM", "LlamaConfig", "meta-llama/Meta-Llama-3-8B",
        full=dict(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=8192,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=128000,
            eos_token_id=128001, attention_bias=False, mlp_bias=False,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, rope_theta=500000.0, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "mistral": Arch(
        "MistralForCausalLM", "MistralConfig", "mistralai/Mistral-7B-v0.1",
        full=dict(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=32768,
            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, sliding_window=4, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "mixtral": Arch(
        "MixtralForCausalLM", "MixtralConfig", "mistralai/Mixtral-8x7B-v0.1",
        full=dict(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=32768,
            rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None, num_local_experts=8, num_experts_per_tok=2,
            router_aux_loss_coef=0.02, output_router_logits=False, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
        moe=True,
    ),
    "qwen2": Arch(
        "Qwen2ForCausalLM", "Qwen2Config", "Qwen/Qwen2-7B",
        full=dict(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
            num_attention_heads=28, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=131072,
            rms_norm_eps=1e-6, rope_theta=1e6, use_sliding_window=False, sliding_window=131072,
            max_window_layers=28, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151643,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, rope_theta=1e6, use_sliding_window=False,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "qwen2_moe": Arch(
        "Qwen2MoeForCausalLM", "Qwen2MoeConfig", "Qwen/Qwen1.5-MoE-A2.7B",
        full=dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
            num_attention_heads=16, num_key_value_heads=16, hidden_act="silu", max_position_embeddings=8192,
            rms_norm_eps=1e-6, rope_theta=1e6, use_sliding_window=False, sliding_window=32768,
            max_window_layers=21, decoder_sparse_step=1, moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
            output_router_logits=False, router_aux_loss_coef=0.001, tie_word_embeddings=False,
            bos_token_id=151643, eos_token_id=151643,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=32, use_sliding_window=False, decoder_sparse_step=1,
            moe_intermediate_size=16, shared_expert_intermediate_size=64, num_experts=6, num_experts_per_tok=2,
            norm_topk_prob=False, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
        moe=True,
    ),
    "gemma2": Arch(
        "Gemma2ForCausalLM", "Gemma2Config", "google/gemma-2-9b",
        full=dict(
            vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
            num_attention_heads=16, num_key_value_heads=8, head_dim=256, hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, query_pre_attn_scalar=256,
            sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=32, query_pre_attn_scalar=8,
            sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True,
            pad_token_id=0, bos_token_id=2, eos_token_id=1, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "phi3": Arch(
        "Phi3ForCausalLM", "Phi3Config", "microsoft/Phi-3-mini-4k-instruct",
        full=dict(
            vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=32, hidden_act="silu", max_position_embeddings=4096,
            original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=2047,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
            embd_pdrop=0.0, resid_pdrop=0.0, attention_dropout=0.0,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=32, original_max_position_embeddings=32,
            sliding_window=4, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            embd_pdrop=0.0, resid_pdrop=0.0, **_NO_DROPOUT_LLM,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "gpt2": Arch(
        "GPT2LMHeadModel", "GPT2Config", "openai-community/gpt2",
        full=dict(
            vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.1, embd_pdrop=0.1,
            attn_pdrop=0.1, tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256,
        ),
        tiny=dict(
            vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2, activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=0,
            eos_token_id=0,
        ),
        make_inputs=_causal_lm(1024),
        loss_type="ForCausalLM",  # GPT2LMHeadModel leaves it unset (and logs a warning)
    ),
    "gpt_neox": Arch(
        "GPTNeoXForCausalLM", "GPTNeoXConfig", "EleutherAI/gpt-neox-20b",
        full=dict(
            vocab_size=50432, hidden_size=6144, intermediate_size=24576, num_hidden_layers=44,
            num_attention_heads=64, hidden_act="gelu_fast", rotary_pct=0.25, rotary_emb_base=10000,
            max_position_embeddings=2048, layer_norm_eps=1e-5, use_parallel_residual=True,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, attention_dropout=0.0, hidden_dropout=0.0,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            hidden_act="gelu_fast", rotary_pct=0.25, max_position_embeddings=32, use_parallel_residual=True,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, attention_dropout=0.0, hidden_dropout=0.0,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "falcon": Arch(
        "FalconForCausalLM", "FalconConfig", "tiiuae/falcon-7b",
        full=dict(
            vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, multi_query=True,
            parallel_attn=True, bias=False, alibi=False, new_decoder_architecture=False,
            layer_norm_epsilon=1e-5, max_position_embeddings=2048, rope_theta=10000.0, hidden_dropout=0.0,
            attention_dropout=0.0, bos_token_id=11, eos_token_id=11, tie_word_embeddings=True,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
            parallel_attn=True, bias=False, alibi=False, new_decoder_architecture=False, max_position_embeddings=32,
            hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=1, tie_word_embeddings=True,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "opt": Arch(
        "OPTForCausalLM", "OPTConfig", "facebook/opt-1.3b",
        full=dict(
            vocab_size=50272, hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
            max_position_embeddings=2048, word_embed_proj_dim=2048, do_layer_norm_before=True,
            activation_function="relu", enable_bias=True, layer_norm_elementwise_affine=True, dropout=0.1,
            attention_dropout=0.0, layerdrop=0.0, tie_word_embeddings=True, pad_token_id=1, bos_token_id=2,
            eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=32, word_embed_proj_dim=32, do_layer_norm_before=True, dropout=0.0,
            attention_dropout=0.0, layerdrop=0.0, tie_word_embeddings=True, pad_token_id=1, bos_token_id=2,
            eos_token_id=2,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "bloom": Arch(
        "BloomForCausalLM", "BloomConfig", "bigscience/bloom-560m",
        full=dict(
            vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16, layer_norm_epsilon=1e-5,
            apply_residual_connection_post_layernorm=False, hidden_dropout=0.0, attention_dropout=0.0,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0, attention_dropout=0.0,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        ),
        make_inputs=_causal_lm(2048),
    ),
    "bert": Arch(
        "BertForMaskedLM", "BertConfig", "google-bert/bert-base-uncased",
        full=dict(
            vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=0,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, type_vocab_size=2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, pad_token_id=0,
        ),
        make_inputs=_masked_lm(512),
    ),
    "roberta": Arch(
        "RobertaForMaskedLM", "RobertaConfig", "FacebookAI/roberta-base",
        full=dict(
            vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            hidden_act="gelu", max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=1, bos_token_id=0,
            eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=34, type_vocab_size=1, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        ),
        make_inputs=_masked_lm(512),
    ),
    "deberta_v2": Arch(
        "DebertaV2ForSequenceClassification", "DebertaV2Config", "microsoft/deberta-v2-xlarge",
        full=dict(
            vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
            intermediate_size=6144, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0,
            layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1, position_buckets=256,
            norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, conv_kernel_size=3, conv_act="gelu", pooler_hidden_size=1536,
            pooler_hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            pooler_dropout=0, pad_token_id=0, num_labels=2,
        ),
        tiny=dict(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, type_vocab_size=0, relative_attention=True, max_relative_positions=-1,
            position_buckets=8, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, conv_kernel_size=3, conv_act="gelu", pooler_hidden_size=32,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pooler_dropout=0, pad_token_id=0,
            num_labels=2,
        ),
        make_inputs=_seq_classification(512),
    ),
    "t5": Arch(
        "T5ForConditionalGeneration", "T5Config", "google-t5/t5-base",
        full=dict(
            vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
            relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="relu",
            layer_norm_epsilon=1e-6, dropout_rate=0.1, tie_word_embeddings=True, decoder_start_token_id=0,
            pad_token_id=0, eos_token_id=1,
        ),
        tiny=dict(
            vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
            dropout_rate=0.0, tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        ),
        make_inputs=_seq2seq(512, 128),
    ),
    "bart": Arch(
        "BartForConditionalGeneration", "BartConfig", "facebook/bart-large",
        full=dict(
            vocab_size=50265, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
            decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
            activation_function="gelu", scale_embedding=False, dropout=0.1, attention_dropout=0.0,
            activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=0, forced_eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
            decoder_layerdrop=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
            forced_eos_token_id=2,
        ),
        make_inputs=_seq2seq(1024, 128),
    ),
    "whisper": Arch(
        "WhisperForConditionalGeneration", "WhisperConfig", "openai/whisper-large-v3",
        full=dict(
            vocab_size=51866, num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=32,
            encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120,
            max_source_positions=1500, max_target_positions=448, activation_function="gelu", scale_embedding=False,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
            decoder_layerdrop=0.0, apply_spec_augment=False, pad_token_id=50256, bos_token_id=50257,
            eos_token_id=50257, decoder_start_token_id=50258, tie_word_embeddings=True,
        ),
        tiny=dict(
            vocab_size=100, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=16, max_target_positions=16, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, apply_spec_augment=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=2, tie_word_embeddings=True,
        ),
        make_inputs=_whisper,
    ),
    "vit": Arch(
        "ViTForImageClassification", "ViTConfig", "google/vit-base-patch16-224",
        full=dict(
            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            hidden_act="gelu", image_size=224, patch_size=16, num_channels=3, qkv_bias=True, layer_norm_eps=1e-12,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=1000,
        ),
        tiny=dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8, num_channels=3, qkv_bias=True, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, num_labels=10,
        ),
        make_inputs=_image_classification,
    ),
    "clip": Arch(
        "CLIPModel", "CLIPConfig", "openai/clip-vit-base-patch32",
        full=dict(
            projection_dim=512, logit_scale_init_value=2.6592,
            text_config=dict(
                vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                attention_dropout=0.0, dropout=0.0, projection_dim=512, pad_token_id=1, bos_token_id=49406,
                eos_token_id=49407,
            ),
            vision_config=dict(
                hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                image_size=224, patch_size=32, num_channels=3, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                attention_dropout=0.0, dropout=0.0, projection_dim=512,
            ),
        ),
        tiny=dict(
            projection_dim=16,
            text_config=dict(
                vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=16, attention_dropout=0.0, dropout=0.0, projection_dim=16,
                pad_token_id=1, bos_token_id=98, eos_token_id=99,
            ),
            vision_config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                patch_size=8, num_channels=3, attention_dropout=0.0, dropout=0.0, projection_dim=16,
            ),
        ),
        make_inputs=_clip,
    ),
    "wav2vec2": Arch(
        "Wav2Vec2ForCTC", "Wav2Vec2Config", "facebook/wav2vec2-base",
        full=dict(
            vocab_size=32, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            hidden_act="gelu", feat_extract_norm="group", feat_extract_activation="gelu",
            conv_dim=[512] * 7, conv_stride=[5, 2, 2, 2, 2, 2, 2], conv_kernel=[10, 3, 3, 3, 3, 2, 2],
            conv_bias=False, num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16,
            do_stable_layer_norm=False, apply_spec_augment=True, mask_time_prob=0.05, mask_time_length=10,
            mask_feature_prob=0.0, layerdrop=0.1, hidden_dropout=0.1, activation_dropout=0.0,
            attention_dropout=0.1, feat_proj_dropout=0.1, final_dropout=0.0, layer_norm_eps=1e-5,
            ctc_loss_reduction="sum", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            feat_extract_norm="group", conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3],
            conv_bias=False, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            do_stable_layer_norm=False, apply_spec_augment=True, mask_time_prob=0.05, mask_time_length=10,
            mask_feature_prob=0.0, layerdrop=0.0, hidden_dropout=0.0, activation_dropout=0.0,
            attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, pad_token_id=0, bos_token_id=1,
            eos_token_id=2,
        ),
        make_inputs=_ctc,
    ),
    "blenderbot": Arch(
        "BlenderbotForConditionalGeneration", "BlenderbotConfig", "facebook/blenderbot-400M-distill",
        full=dict(
            vocab_size=8008, d_model=1280, encoder_layers=2, decoder_layers=12, encoder_attention_heads=32,
            decoder_attention_heads=32, encoder_ffn_dim=5120, decoder_ffn_dim=5120, max_position_embeddings=128,
            activation_function="gelu", scale_embedding=True, dropout=0.1, attention_dropout=0.0,
            activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=2,
        ),
        tiny=dict(
            vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
            scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1, forced_eos_token_id=2,
        ),
        make_inputs=_seq2seq(128, 64),
    ),
}  # fmt: skip


# ----------------------------------------------------------------------------------------- steps
def config(name: str, size: str = "tiny", attn: str | None = None) -> Any:
    """The ``transformers`` config of architecture ``name`` at ``size`` (``"tiny"`` or ``"full"``).

    ``attn`` is the attention implementation (``"eager"``, ``"sdpa"``); by default ``"eager"`` for the
    tiny size (a real and a fake run take the same attention path) and transformers' own default for
    the full size.
    """
    import transformers

    if size not in ("tiny", "full"):
        raise ValueError(f"size={size!r}: use 'tiny' or 'full'")
    arch = ARCHS[name]
    cfg = getattr(transformers, arch.config_cls)(**(arch.tiny if size == "tiny" else arch.full))
    attn = attn or ("eager" if size == "tiny" else None)
    if attn is not None:
        for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None)):
            if c is not None:
                c._attn_implementation = attn
    return cfg


def supports_sdpa(name: str) -> bool:
    """Whether the model class of ``name`` has an SDPA attention path (else only eager)."""
    import transformers

    return bool(getattr(getattr(transformers, ARCHS[name].model_cls), "_supports_sdpa", False))


def build(name: str, size: str = "tiny", attn: str | None = None) -> nn.Module:
    """Instantiate architecture ``name`` at ``size`` in the current (fake or real) context, in training mode.

    Parameters take the default dtype and device (``fv.record(device=..., dtype=...)`` sets them).
    """
    import transformers

    arch = ARCHS[name]
    model = getattr(transformers, arch.model_cls)(config(name, size, attn))
    # as a user does after building (model.to(device)): a parameter made by a legacy constructor ignores the
    # device context (Wav2Vec2's masked_spec_embed = Parameter(torch.Tensor(n)) stays on the cpu, and a real
    # run on cuda then fails in SpecAugment's index_put_ as the fake one does); a no-op for every other tensor
    model = model.to(torch.get_default_device())
    if arch.loss_type is not None:
        model.loss_type = arch.loss_type
    return model.train()


def inputs(name: str, size: str, cfg: Any) -> dict[str, Any]:
    """The forward kwargs (labels included) of one training step, drawn from fixed seeds.

    Floating inputs take the default dtype (``fv.record(dtype=...)`` sets it).
    """
    return ARCHS[name].make_inputs(cfg, size)


def run(name: str, size: str = "tiny", *, attn: str | None = None, backward: bool = True) -> dict[str, Any]:
    """One training step of architecture ``name``: seed, build, inputs, forward with a loss, backward.

    Args:
        name: a key of :data:`ARCHS`.
        size: ``"tiny"`` (runs on real CPU tensors in milliseconds) or ``"full"`` (the published config:
            run it under a fake recording only).
        attn: the attention implementation (see :func:`config`).
        backward: also run the backward pass.

    Returns:
        ``model``, ``loss`` and ``inputs``, for the caller to inspect.
    """
    torch.manual_seed(SEED)
    np.random.seed(SEED)  # SpecAugment (Wav2Vec2) draws its masks with NumPy
    model = build(name, size, attn)
    kwargs = inputs(name, size, model.config)
    loss = model(**kwargs).loss
    if backward:
        loss.backward()
    return {"model": model, "loss": loss, "inputs": kwargs}
