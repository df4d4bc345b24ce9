"""vLLM's paged KV cache as plain arithmetic of a model's config: the bytes of one block per layer kind, how the
layers are grouped, how many blocks a budget holds and how many sequences of ``max_model_len`` they serve.

Note: [vLLM's KV cache blocks]
Followed from vLLM's V1 engine (``vllm-project/vllm`` at commit ``001cabc1be16``, late 2026: ``vllm/v1/
kv_cache_interface.py`` and ``vllm/v1/core/kv_cache_utils.py``):

* A layer's *spec* says what one block of ``block_size`` tokens costs (``page_size_bytes``) and what one request
  of ``max_model_len`` tokens needs at most (``max_memory_usage_bytes``):
  full attention (``FullAttentionSpec``): a page is ``2 x block_size x kv_heads x head_dim x dtype size`` (keys and
  values), a request ``cdiv(max_model_len, block_size)`` pages; sliding window (``SlidingWindowSpec``): the same
  page, but a request holds only its window: ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
  block_size) + 1`` pages (the last ``window - 1`` computed tokens plus one chunked-prefill step, and one page
  more because the window need not start at a block's start); multi-head latent attention (``MLAAttentionSpec``,
  DeepSeek-V2/V3): one compressed latent per token, no separate values, ``block_size x 1 x (kv_lora_rank +
  qk_rope_head_dim) x dtype size`` a page, never split by tensor parallelism.
* Layers are grouped (``get_kv_cache_groups``): all layers alike is one group; otherwise the page sizes are made
  equal (``unify_kv_cache_spec_page_size``: a smaller page's block size is multiplied up) and each kind's layers are
  split into groups of ``group_size`` layers (the fewest layers of any kind; the most when that is under 1.5 x the
  fewest), the last group of a kind padded, layers ``i::groups`` in group ``i``.
* Blocks (``get_kv_cache_config_from_groups``): ``group_size`` tensors of ``num_blocks`` pages each, every tensor
  shared by one layer of each group: ``num_blocks = available // page // group_size``. One *block* here is thus a
  page of every layer of one group: ``page x group_size`` bytes; for a model of only full-attention layers that
  is ``2 x layers x kv_heads x head_dim x block_size x dtype size``.
* What a request needs (``get_max_concurrency_for_kv_cache_config``): the sum over groups of its spec's pages per
  request; ``max_concurrency = num_blocks / that`` (the log line "Maximum concurrency for N tokens per request");
  "GPU KV cache size: N tokens" is ``num_blocks // groups x block_size``. The check that one request of
  ``max_model_len`` fits (``_check_enough_kv_cache_memory``) compares ``group_size x page x`` those pages with the
  available bytes; the longest context that fits is vLLM's own binary search (``_estimate_max_model_len_from_groups``).

Layer kinds vLLM handles otherwise (chunked local attention, cross attention, the Mamba and linear-attention
layers of models not listed in Note: [vLLM's Mamba state pages]) are refused here, not guessed.

Note: [vLLM's Mamba state pages]
Mamba and linear-attention layers (transformers' ``"linear_attention"`` layer type) keep a fixed state per request,
whatever its length: vLLM's ``MambaSpec`` (``vllm/v1/kv_cache_interface.py`` at ``001cabc1be16``): its page is the
state, ``sum(prod(shape) x dtype size)`` over the layer's state tensors, padded up to ``page_size_padded``; its block
size is ``mamba_block_size``, which is ``max_model_len`` with prefix caching off; a request holds
``page x (1 + num_speculative_blocks)`` (``mamba_cache_mode="none"``), one page of each Mamba group. The state
shapes, as ``MambaStateShapeCalculator`` (``vllm/model_executor/layers/mamba/mamba_utils.py``, read at
``02d710837549``, conv state in its default ``"SD"`` layout) and each model's ``get_mamba_state_shape_from_config``
write them, on one of ``tp`` GPUs:

* mamba1 (Jamba, ``jamba.py``): ``d_inner = mamba_expand x hidden_size``; conv ``(mamba_d_conv - 1, d_inner / tp)``,
  ssm ``(d_inner / tp, mamba_d_state)``;
* mamba2 (Bamba, ``bamba.py``): ``d_inner = mamba_expand x hidden_size``, ``n_groups`` (raised to ``tp`` when ``tp``
  does not divide it); conv ``(mamba_d_conv - 1, (d_inner + 2 x n_groups x mamba_d_state) / tp)``, ssm
  ``(mamba_n_heads / tp, mamba_d_head, mamba_d_state)``; NemotronH (``nemotron_h.py``) the same with ``d_inner =
  mamba_num_heads x mamba_head_dim``, ``n_groups``, ``ssm_state_size``, ``conv_kernel``, and its ssm state in the
  config's ``mamba_ssm_cache_dtype``, float32 when it sets none (``NemotronHForCausalLMConfig``); its MLP and MoE
  layers hold no cache;
* gated delta net (Qwen3-Next's linear attention, ``qwen3_next.py``): conv ``(linear_conv_kernel_dim - 1,
  (2 x linear_key_head_dim x linear_num_key_heads + linear_value_head_dim x linear_num_value_heads) / tp)``,
  temporal ``(linear_num_value_heads / tp, linear_value_head_dim, linear_key_head_dim)``.

Otherwise both states are in the model's dtype (``mamba_cache_dtype`` and ``mamba_ssm_cache_dtype`` ``"auto"``; the KV cache's
``kv_cache_dtype`` does not apply to them). The attention page is then made at least one state page
(``Platform._align_hybrid_block_size`` in ``vllm/platforms/interface.py``, read in a 2026 copy of it: the index
holds that file at no commit near ``001cabc1be16``; earlier the same rule was ``HybridAttentionMambaModelConfig.
verify_and_update_config``, ``vllm/model_executor/models/config.py``, read at ``1936cf3841ed``, with 16 for the
alignment): with ``a = max(the attention backend's smallest kernel block, block_size)`` (16 for FlashAttention and
FlashInfer, so ``a`` is the block size asked for when that is 16 or more), the attention block size becomes ``a x
cdiv(mamba_page, a x attention bytes of one token)`` when the one asked for is smaller, and the Mamba page is padded
to the attention page. Equal pages, the layers are grouped as above (a
group of Mamba layers, like one of attention layers, holds ``group_size`` layers); what a request needs is
``cdiv(max_model_len, block_size)`` blocks per attention group and one per Mamba group, so a longer context costs
only attention blocks. Assumed (named in ``fidelity()`` by :func:`fakeviz.serve`): prefix caching off
(``--no-enable-prefix-caching``; with it on vLLM keeps ``"align"`` mode's extra state pages and aligns the block to
the Mamba kernel's chunk), no speculative decoding, the 16-token alignment (Blackwell with head size 256 and MLA
backends align otherwise). The profile run of such a model records transformers' PyTorch reference paths of the
Mamba scan and the gated delta rule (vLLM's fused kernels are CUDA-only): a mamba1 scan holds float32 ``batch x
d_inner x tokens x state`` tensors that vLLM's kernel never makes (4 GiB each for Jamba-v0.1 at 8,192 tokens as
1,024 x 8), so ``profile_peak`` is an upper bound there and the KV cache a lower one. Other Mamba-kind models
(Falcon-H1, granite hybrids, short-conv LFM2, MiniMax linear attention) are refused: their shapes are not followed
here yet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._core.errors import ArgumentError

__all__ = ["KVGroup", "KVLayout", "LayerSpec", "cdiv", "kv_layout", "layer_kinds", "layer_specs", "mamba_state"]

# the token counts vLLM accepts as block_size (vllm/config/cache.py ``BlockSize``)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
KNOWN_KINDS = ("full_attention", "sliding_attention", "linear_attention", "mlp", "moe")
# transformers' layer types of layers without attention or state (NemotronH's MLP and MoE layers): no KV cache
NO_CACHE_KINDS = ("mlp", "moe")
# vLLM's names of the state dtypes a config may set (mamba_ssm_cache_dtype), in bytes
STATE_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
# the attention kernels' block alignment vLLM raises a hybrid model's block size to (FlashAttention / FlashInfer)
KERNEL_BLOCK_ALIGNMENT = 16
# model_type -> vLLM's Mamba state kind for its "linear_attention" layers (Note: [vLLM's Mamba state pages])
MAMBA_TYPES = {"jamba": "mamba1", "bamba": "mamba2", "nemotron_h": "mamba2", "qwen3_next": "gated_delta_net"}


def cdiv(a: int, b: int) -> int:
    """Ceiling division, vLLM's ``cdiv``."""
    return -(-a // b)


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV cache spec (vLLM's ``FullAttentionSpec``, ``SlidingWindowSpec``, ``MLAAttentionSpec``).

    ``kind``: ``"full"``, ``"sliding"``, ``"mla"`` or ``"mamba"`` (vLLM's ``MambaSpec``: a fixed state);
    ``kv_heads`` on one GPU; ``head_size`` (MLA: the latent, ``kv_lora_rank + qk_rope_head_dim``); ``dtype_bytes``:
    the KV cache dtype's size; ``window``: a sliding layer's window in tokens. A Mamba layer: ``states``, each state
    tensor's ``(shape, dtype size)`` on one GPU; ``padded``: its page padded to that many bytes; ``mamba_type``
    (``"mamba1"``, ``"mamba2"``, ``"gated_delta_net"``); its ``block_size`` is ``max_model_len`` and the attention
    fields are 0 (Note: [vLLM's Mamba state pages]).
    """

    kind: str
    block_size: int
    kv_heads: int
    head_size: int
    dtype_bytes: int
    window: int | None = None
    states: tuple[tuple[tuple[int, ...], int], ...] = ()
    padded: int | None = None
    mamba_type: str = ""

    @property
    def state_bytes(self) -> int:
        """A Mamba layer's state of one request, unpadded (``MambaSpec.page_size_bytes`` before padding)."""
        return sum(math.prod(shape) * size for shape, size in self.states)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of ``block_size`` tokens of this layer (``page_size_bytes``; a Mamba layer: its state,
        padded)."""
        if self.kind == "mamba":
            return self.padded if self.padded is not None else self.state_bytes
        per_token = self.kv_heads * self.head_size * (1 if self.kind == "mla" else 2)
        return self.block_size * per_token * self.dtype_bytes

    def request_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The most one request of ``max_model_len`` tokens holds in this layer (``max_memory_usage_bytes``; a
        Mamba layer: one page, ``mamba_cache_mode="none"``)."""
        if self.kind == "mamba":
            return self.page_bytes
        if self.kind == "sliding":
            assert self.window is not None
            tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return (cdiv(tokens, self.block_size) + 1) * self.page_bytes
        return cdiv(max_model_len, self.block_size) * self.page_bytes


@dataclass(frozen=True)
class KVGroup:
    """Layers sharing one block table (vLLM's ``KVCacheGroupSpec``): their spec and layer indices (padding slots
    are not listed: a group can hold fewer layers than ``group_size``)."""

    spec: LayerSpec
    layers: tuple[int, ...]


@dataclass(frozen=True)
class KVLayout:
    """The KV cache groups of a model (:func:`kv_layout`) and what follows from them for a budget."""

    groups: tuple[KVGroup, ...]
    group_size: int
    max_model_len: int
    max_num_batched_tokens: int

    @property
    def page_bytes(self) -> int:
        return self.groups[0].spec.page_bytes

    @property
    def block_size(self) -> int:
        """The tokens of one block (the smallest of the groups', as vLLM's log line takes it)."""
        return min(g.spec.block_size for g in self.groups)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block: a page of every layer slot of a group (``page x group_size``)."""
        return self.page_bytes * self.group_size

    def blocks(self, available: int) -> int:
        """Blocks in ``available`` bytes (``get_num_blocks``; 0 when nothing is available)."""
        return max(int(available) // self.page_bytes // self.group_size, 0)

    def blocks_per_request(self, max_model_len: int | None = None) -> int:
        """Blocks one request of ``max_model_len`` tokens (default: the layout's) needs, over all groups."""
        n = self.max_model_len if max_model_len is None else max_model_len
        return sum(cdiv(g.spec.request_bytes(n, self.max_num_batched_tokens), self.page_bytes) for g in self.groups)

    def request_bytes(self, max_model_len: int | None = None) -> int:
        """Bytes one request needs (``_max_memory_usage_bytes_from_groups``): checked against what is available."""
        return self.bytes_per_block * self.blocks_per_request(max_model_len)

    def max_concurrency(self, available: int) -> float:
        """Requests of ``max_model_len`` tokens at once (``get_max_concurrency_for_kv_cache_config``)."""
        return self.blocks(available) / self.blocks_per_request()

    def kv_tokens(self, available: int) -> int:
        """vLLM's "GPU KV cache size: N tokens": ``num_blocks // groups x block_size``."""
        return self.blocks(available) // len(self.groups) * self.block_size

    def max_context(self, available: int, limit: int) -> int:
        """The longest ``max_model_len`` up to ``limit`` whose one request fits in ``available`` bytes (vLLM's
        binary search, ``_estimate_max_model_len_from_groups``); 0 when not even one token fits."""
        if self.request_bytes(1) > available:
            return 0
        lo, hi, best = 1, int(limit), 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.request_bytes(mid) <= available:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def layer_kinds(config: Any) -> list[str]:
    """Each decoder layer's attention kind as transformers names it (``layer_types``; a config without it: every
    layer ``"sliding_attention"`` when it sets ``sliding_window``, else ``"full_attention"``)."""
    c = _text_config(config)
    n = int(c.num_hidden_layers)
    types = getattr(c, "layer_types", None)
    if types:
        return [str(t) for t in types][:n]
    window = getattr(c, "sliding_window", None)
    if window and getattr(c, "use_sliding_window", True) is not False:
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def layer_specs(config: Any, *, block_size: int, dtype_bytes: int, tensor_parallel_size: int = 1,
                state_dtype_bytes: int | None = None, max_model_len: int | None = None) -> list[LayerSpec]:  # fmt: skip
    """One :class:`LayerSpec` per KV cache of a transformers config, on one of ``tensor_parallel_size`` GPUs: one per
    decoder layer (a Mamba or linear-attention layer's state: Note: [vLLM's Mamba state pages]).

    ``state_dtype_bytes``: the model dtype's size, the Mamba states' (default ``dtype_bytes``); ``max_model_len``:
    needed by a model with Mamba layers (their block size). With Mamba layers the attention layers' ``block_size``
    is raised, as vLLM raises it, until one attention page holds a state page, and the state page is padded to it.

    Raises:
        ArgumentError: ``tensor_parallel_size`` does not split the KV heads or the state; a layer kind vLLM allocates
            otherwise (chunked attention, the state of a model not followed: Note: [vLLM's KV cache blocks]); an
            encoder model.
    """
    c = _text_config(config)
    model_type = getattr(c, "model_type", "?")
    if getattr(c, "is_encoder_decoder", False) or not hasattr(c, "num_hidden_layers"):
        raise ArgumentError("model", getattr(c, "model_type", type(c).__name__),
                            "serving capacity covers decoder-only language models (one KV cache per decoder layer)",
                            "Give a causal LM (Llama, Qwen, Gemma, Mistral, ...).")  # fmt: skip
    tp = int(tensor_parallel_size)
    kinds = layer_kinds(c)
    unknown = sorted({k for k in kinds if k not in KNOWN_KINDS})
    if "linear_attention" in kinds and model_type not in MAMBA_TYPES:
        unknown.append(f"linear_attention of {model_type}")
    if unknown:
        raise ArgumentError("model", model_type,
                            f"its layer kinds {unknown} are not followed: vLLM keeps chunked attention and the state "
                            "of these layers in specs whose shapes fakeviz does not model yet (Mamba state is "
                            f"followed for {', '.join(sorted(MAMBA_TYPES))})",
                            "Give a model of full and sliding-window attention layers, or one of those.")  # fmt: skip
    if getattr(c, "kv_lora_rank", None):  # multi-head latent attention: one latent per token, replicated across tp
        if "linear_attention" in kinds:
            raise ArgumentError("model", model_type, "latent attention with Mamba layers is not followed",
                                "Give a model of one of them.")  # fmt: skip
        head = int(c.kv_lora_rank) + int(getattr(c, "qk_rope_head_dim", 0) or 0)
        return [LayerSpec("mla", block_size, 1, head, dtype_bytes) for _ in kinds]
    heads = int(c.num_attention_heads)
    kv = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or int(c.hidden_size) // heads)
    if kv % tp:
        raise ArgumentError("tensor_parallel_size", tp, f"the model's {kv} KV heads do not split evenly over {tp} GPUs",
                            f"Give a tensor_parallel_size that divides {kv}.")  # fmt: skip
    state = None
    if "linear_attention" in kinds:
        if max_model_len is None:
            raise ArgumentError("max_model_len", None, "a model with Mamba layers needs it (their state's block size)",
                                "Give max_model_len=8192.")  # fmt: skip
        state = mamba_state(c, tp=tp, dtype_bytes=state_dtype_bytes or dtype_bytes)
        state = replace(state, block_size=int(max_model_len))
    if state is not None and any(k in ("full_attention", "sliding_attention") for k in kinds):
        # Platform._align_hybrid_block_size (hybrids only): one attention page holds at least one state page
        one_token = 2 * (kv // tp) * head_dim * dtype_bytes
        a = max(KERNEL_BLOCK_ALIGNMENT, block_size)  # Platform._align_hybrid_block_size
        block_size = max(block_size, a * cdiv(state.state_bytes, a * one_token))
        page = block_size * one_token
        state = replace(state, padded=page if page != state.state_bytes else None)
    window = getattr(c, "sliding_window", None)
    out = []
    for k in kinds:
        if k in NO_CACHE_KINDS:
            continue
        if k == "linear_attention":
            out.append(state)
        elif k == "sliding_attention":
            out.append(LayerSpec("sliding", block_size, kv // tp, head_dim, dtype_bytes, int(window)))
        else:
            out.append(LayerSpec("full", block_size, kv // tp, head_dim, dtype_bytes))
    return out


def mamba_state(config: Any, *, tp: int = 1, dtype_bytes: int = 2) -> LayerSpec:
    """The state of one Mamba or linear-attention layer of ``config`` on one of ``tp`` GPUs, as vLLM's
    ``MambaStateShapeCalculator`` shapes it (Note: [vLLM's Mamba state pages]): a ``"mamba"`` :class:`LayerSpec`,
    unpadded, of block size 1, both states of ``dtype_bytes``.

    Raises:
        ArgumentError: a model whose state is not followed; ``tp`` does not split the state.
    """
    c = _text_config(config)
    model_type = getattr(c, "model_type", "?")
    kind = MAMBA_TYPES.get(model_type)
    ssm_bytes = dtype_bytes
    if model_type == "nemotron_h":  # NemotronHForCausalLMConfig: the config's mamba_ssm_cache_dtype, else float32
        name = str(getattr(c, "mamba_ssm_cache_dtype", None) or "float32").replace("torch.", "")
        if name not in STATE_DTYPES:
            raise ArgumentError("model", model_type, f"its mamba_ssm_cache_dtype {name!r} is not followed",
                                "Give a config of " + ", ".join(STATE_DTYPES) + " state.")  # fmt: skip
        ssm_bytes = STATE_DTYPES[name]
    if kind == "mamba1":
        d_inner, conv = int(c.mamba_expand) * int(c.hidden_size), int(c.mamba_d_conv)
        conv_dim, split = d_inner, [("mamba d_inner", d_inner)]
        ssm = (d_inner // tp, int(c.mamba_d_state))
    elif kind == "mamba2" and model_type == "nemotron_h":  # nemotron_h.py: d_inner = heads x head_dim
        heads, head, n = int(c.mamba_num_heads), int(c.mamba_head_dim), int(c.ssm_state_size)
        d_inner, conv, groups = heads * head, int(c.conv_kernel), int(c.n_groups)
        groups += 0 if groups % tp == 0 else tp - groups
        conv_dim = d_inner + 2 * groups * n
        split = [("mamba conv dim", conv_dim), ("mamba heads", heads)]
        ssm = (heads // tp, head, n)
    elif kind == "mamba2":
        d_inner, conv, n = int(c.mamba_expand) * int(c.hidden_size), int(c.mamba_d_conv), int(c.mamba_d_state)
        groups = int(c.mamba_n_groups)
        groups += 0 if groups % tp == 0 else tp - groups  # extra_groups_for_head_shards
        conv_dim = d_inner + 2 * groups * n
        split = [("mamba conv dim", conv_dim), ("mamba heads", int(c.mamba_n_heads))]
        ssm = (int(c.mamba_n_heads) // tp, int(c.mamba_d_head), n)
    elif kind == "gated_delta_net":
        nk, nv = int(c.linear_num_key_heads), int(c.linear_num_value_heads)
        dk, dv, conv = int(c.linear_key_head_dim), int(c.linear_value_head_dim), int(c.linear_conv_kernel_dim)
        conv_dim = 2 * dk * nk + dv * nv
        split = [("linear-attention conv dim", conv_dim), ("linear-attention value heads", nv)]
        ssm = (nv // tp, dv, dk)
    else:
        raise ArgumentError("model", model_type, "its Mamba / linear-attention state is not followed",
                            f"Give one of {', '.join(sorted(MAMBA_TYPES))}.")  # fmt: skip
    for what, n in split:
        if n % tp:
            raise ArgumentError("tensor_parallel_size", tp, f"the model's {n} {what} do not split evenly over {tp} "
                                "GPUs (vLLM's divide() refuses it)", f"Give a tensor_parallel_size that divides {n}.")  # fmt: skip
    states = (((conv - 1, conv_dim // tp), dtype_bytes), (ssm, ssm_bytes))
    return LayerSpec("mamba", 1, 0, 0, dtype_bytes, states=states, mamba_type=kind)


def _unify_pages(specs: Sequence[LayerSpec]) -> list[LayerSpec]:
    """Equal page sizes by multiplying the block size of smaller pages (``unify_kv_cache_spec_page_size``)."""
    top = max(s.page_bytes for s in specs)
    out = []
    for s in specs:
        if s.page_bytes != top:
            if top % s.page_bytes:
                raise ArgumentError("model", "?", "its layers' KV pages cannot be made one size (vLLM raises "
                                    "NotImplementedError here)", "")  # fmt: skip
            s = replace(s, block_size=s.block_size * (top // s.page_bytes))
        out.append(s)
    return out


def kv_layout(specs: Sequence[LayerSpec], *, max_model_len: int, max_num_batched_tokens: int) -> KVLayout:
    """vLLM's KV cache groups of these layers (``get_kv_cache_groups``; Note: [vLLM's KV cache blocks])."""
    if len(set(specs)) == 1:
        return KVLayout((KVGroup(specs[0], tuple(range(len(specs)))),), len(specs), max_model_len,
                        max_num_batched_tokens)  # fmt: skip
    specs = _unify_pages(specs)
    same: dict[LayerSpec, list[int]] = {}
    for i, s in enumerate(specs):
        same.setdefault(s, []).append(i)
    fewest = min(len(v) for v in same.values())
    most = max(len(v) for v in same.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups = []
    for spec, layers in same.items():
        n = cdiv(len(layers), group_size)
        groups.extend(KVGroup(spec, tuple(layers[i::n])) for i in range(n))
    return KVLayout(tuple(groups), group_size, max_model_len, max_num_batched_tokens)
