"""Serving capacity: :func:`serve` answers what vLLM would at start-up: how many KV cache blocks fit on the GPU, how
many requests of ``max_model_len`` tokens they serve at once, and the longest context one request can have.

Note: [vLLM's memory profile]
Followed from vLLM's V1 engine (``vllm-project/vllm`` at commit ``001cabc1be16``, late 2026; the KV arithmetic:
Note: [vLLM's KV cache blocks] in :mod:`fakeviz._analysis.kv_blocks`). At start-up each worker
(``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``) loads the weights, then runs the *profile run*
(``gpu_model_runner.py``, ``profile_run``): ``_dummy_run(max_num_batched_tokens)`` is one forward over
``max_num_batched_tokens`` tokens as ``min(tokens, max_num_seqs)`` dummy requests (``tokens // requests`` each, the
remainder on the last), without a KV cache, then ``_dummy_sampler_run``: the logits of each request's last token and
the sampler over them (float32). ``memory_profiling`` measures ``torch_peak_increase`` (the allocated peak of the
profile run over what was allocated before it: the weights), and the non-KV memory is ``weights +
torch_peak_increase + non_torch_increase``; the KV cache gets ``requested_memory - non_kv`` with ``requested_memory =
ceil(total GPU memory x gpu_memory_utilization)``.

Here: the weights are the fake build's (quantized by its library's own code with ``quantization=``), the profile
run is recorded (:attr:`Serving.trace`) on a fake GPU of the kind asked, and ``profile_peak`` is its peak of live
tensor bytes over the weights (torch's ``allocated_bytes`` counters round each allocation up to 512 bytes: a few
tens of KiB more on an 8B model). The forward is transformers' model, not vLLM's: ``requests`` sequences of ``tokens // requests``
when that divides evenly (the same tokens through every projection, MLP and norm as vLLM's flattened batch, and
attention over short sequences, close to vLLM's profile run, which skips attention), else one packed sequence of all
the tokens with the logits taken at each request's last token. What cannot be recorded (vLLM's own kernels, the
non-torch memory: CUDA context, cuBLAS workspace, NCCL buffers; CUDA graphs) is listed in the record's
``fidelity()["assumptions"]``: the answer is that of ``--enforce-eager`` with no non-torch memory, so vLLM's own
figure is a little lower (a few hundred MiB less KV cache).

The defaults are ``vllm serve``'s (``EngineArgs.get_batch_defaults``, the OpenAI server's usage context): on a GPU
of at least 70 GiB that is not an A100, ``max_num_batched_tokens=8192`` and ``max_num_seqs=1024``, else 2048 and
256; a defaulted ``max_num_batched_tokens`` is capped at ``max_num_seqs x max_model_len``. ``dtype=None`` is vLLM's
``"auto"``: the config's dtype, float32 configs served in bfloat16 (float16 before compute capability 8.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import models
from .._analysis import kv_blocks
from .._analysis.memory import peak_bytes
from .._core.errors import ArgumentError
from .._core.fmt import format_bytes
from .._core.gpus import CAPABILITY, Capacity, parse_gpus
from .._core.limits import check_tokens, token_width
from . import adapters

__all__ = ["Serving", "serve"]

_GIB = 1 << 30
KV_DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f}"  # vLLM's format_gib


# ----------------------------------------------------------------------------------------------- Serving
@dataclass
class Serving:
    """What vLLM would allocate for ``model`` on one GPU (see :func:`serve`).

    ``weights``: bytes of the loaded weights; ``profile_peak``: the profile run's allocated peak over them;
    ``requested``: ``ceil(capacity x gpu_memory_utilization)``; ``available_kv``: what is left for the KV cache
    (negative when the weights and the profile run already pass the budget); ``layout``: the KV cache groups
    (:class:`fakeviz._analysis.kv_blocks.KVLayout`); ``trace``: the record of the profile run (explore it).
    """

    model: str
    gpu: Capacity
    settings: dict[str, Any]
    layout: kv_blocks.KVLayout
    weights: int
    profile_peak: int
    requested: int
    context_limit: int
    trace: Any = field(repr=False, default=None)

    @property
    def available_kv(self) -> int:
        """Bytes for the KV cache: ``requested - weights - profile_peak`` (vLLM's ``available_kv_cache_memory``)."""
        return self.requested - self.weights - self.profile_peak

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes of one KV cache block: a page of ``block_size`` tokens of every layer of a group (for full
        attention only: ``2 x layers x kv_heads x head_dim x block_size x dtype size``)."""
        return self.layout.bytes_per_block

    @property
    def kv_blocks(self) -> int:
        """KV cache blocks vLLM allocates (its ``num_gpu_blocks``); 0 when nothing is left for them."""
        return self.layout.blocks(max(self.available_kv, 0))

    @property
    def kv_tokens(self) -> int:
        """vLLM's "GPU KV cache size: N tokens"."""
        return self.layout.kv_tokens(max(self.available_kv, 0))

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens served at once (vLLM's "Maximum concurrency for N tokens per
        request: X.XXx")."""
        return self.layout.max_concurrency(max(self.available_kv, 0))

    @property
    def max_context(self) -> int:
        """The longest context one request can have in this KV cache, up to the model's own context (vLLM's
        ``max_model_len=-1`` auto-fit); 0 when not even one token fits."""
        return self.layout.max_context(max(self.available_kv, 0), self.context_limit)

    @property
    def verdict(self) -> dict[str, Any]:
        """Does vLLM start, in the verdict's shape and words (Note: [the verdict] in :mod:`fakeviz._analysis.verdict`):
        the bytes judged are allocated bytes, as vLLM's memory profile counts them (``weights + profile_peak`` and
        the KV cache of one request of ``max_model_len``), against the bytes vLLM may use (``requested``:
        ``capacity x gpu_memory_utilization``). It fits when they are within it, which is vLLM starting (its check
        ``request_bytes <= available_kv``). ``{"fits", "judged", "capacity", "headroom", "request_kv", "text"}``."""
        request = self.layout.request_bytes()
        judged = self.weights + self.profile_peak + request
        fits = judged <= self.requested and self.available_kv > 0
        s = self.settings
        tokens = f"{s['max_model_len']:,}-token"
        text = (f"cuda:0 needs {format_bytes(judged)} allocated ({format_bytes(self.weights)} weights + "
                f"{format_bytes(self.profile_peak)} profile peak + {format_bytes(request)} KV cache of one {tokens} "
                f"request) of {format_bytes(self.requested)} requested ({s['gpu_memory_utilization']} of "
                f"{format_bytes(self.gpu.bytes)})")  # fmt: skip
        if judged > self.requested:
            text += f", over by {format_bytes(judged - self.requested)}"
        return {"fits": fits, "judged": judged, "capacity": self.requested, "headroom": self.requested - judged,
                "request_kv": request, "text": f"{'fits' if fits else 'does not fit'}: {text}"}  # fmt: skip

    @property
    def fits(self) -> bool:
        """Whether vLLM starts: something is left for the KV cache and one request of ``max_model_len`` fits
        (:attr:`verdict`, which says the bytes it judged)."""
        return bool(self.verdict["fits"])

    @property
    def error(self) -> str | None:
        """vLLM's own error when it would refuse to start (its text, with these figures), else None."""
        avail = self.available_kv
        if avail <= 0:
            return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                    "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
                    "for more details.")  # fmt: skip
        needed = self.layout.request_bytes()
        if needed <= avail:
            return None
        est = self.layout.max_context(avail, self.settings["max_model_len"])
        est_msg = f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else ""
        return (f"To serve at least one request with the models's max seq len ({self.settings['max_model_len']}), "
                f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
                f"({_gib(avail)} GiB). {est_msg}Try increasing `gpu_memory_utilization` or decreasing "
                "`max_model_len` when initializing the engine. See "
                "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")  # fmt: skip

    @property
    def text(self) -> str:
        """The budget and the answer in two lines (or vLLM's error)."""
        s = self.settings
        on = (
            self.gpu.spec
            if s["tensor_parallel_size"] == 1
            else f"{s['tensor_parallel_size']}x{self.gpu.spec} (per GPU)"
        )
        head = (f"{self.model} on {on}, gpu_memory_utilization {s['gpu_memory_utilization']}: "
                f"{format_bytes(self.requested)} requested - {format_bytes(self.weights)} weights - "
                f"{format_bytes(self.profile_peak)} profile peak ({s['max_num_batched_tokens']:,} tokens as "
                f"{s['profile_shape']}) = {format_bytes(self.available_kv)} for the KV cache")  # fmt: skip
        head += f"\n{self.verdict['text']}"  # the bytes judged (Note: [the verdict])
        if not self.fits:
            return f"{head}\ndoes not start: {self.error}"
        return (f"{head}\n{self.kv_blocks:,} blocks of {self.layout.block_size} tokens "
                f"({format_bytes(self.kv_bytes_per_block)} each), {self.kv_tokens:,} tokens; maximum concurrency for "
                f"{s['max_model_len']:,} tokens per request: {self.max_concurrency:.2f}x; longest context "
                f"{self.max_context:,}{self._state_text()}")  # fmt: skip

    def _state_text(self) -> str:
        """A hybrid model's fixed state (Note: [vLLM's Mamba state pages]), or nothing."""
        groups = [g for g in self.layout.groups if g.spec.kind == "mamba"]
        if not groups:
            return ""
        m, n = groups[0].spec, sum(len(g.layers) for g in groups)
        return (f"\n{n} {m.mamba_type} layers hold a fixed state of {format_bytes(m.state_bytes)} per request "
                f"(padded to a {format_bytes(m.page_bytes)} page); attention blocks raised to "
                f"{self.layout.block_size} tokens to hold one")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data (the command line's ``--json``)."""
        return {
            "model": self.model, "gpu": self.gpu.spec, "capacity": self.gpu.bytes, **self.settings,
            "weights": self.weights, "profile_peak": self.profile_peak, "requested": self.requested,
            "available_kv": self.available_kv, "kv_bytes_per_block": self.kv_bytes_per_block,
            "kv_blocks": self.kv_blocks, "kv_tokens": self.kv_tokens, "max_concurrency": self.max_concurrency,
            "max_context": self.max_context, "kv_groups": len(self.layout.groups),
            "layer_kinds": sorted({g.spec.kind for g in self.layout.groups}), "fits": self.fits, "error": self.error,
            "judged": self.verdict["judged"], "verdict": self.verdict["text"],
        }  # fmt: skip

    def explore(self, **kw: Any) -> Any:
        """The explorer of the profile run's record, with the GPU's capacity."""
        return self.trace.explore(self.gpu.spec, **kw)

    def __repr__(self) -> str:
        return f"Serving({self.text})"


# ------------------------------------------------------------------------------------------- arguments
def _check(max_model_len: Any, gpu_memory_utilization: Any, block_size: Any, kv_cache_dtype: Any,
           max_num_batched_tokens: Any, max_num_seqs: Any, tensor_parallel_size: Any) -> None:  # fmt: skip
    for name, v in (("max_model_len", max_model_len), ("max_num_batched_tokens", max_num_batched_tokens),
                    ("max_num_seqs", max_num_seqs), ("tensor_parallel_size", tensor_parallel_size)):  # fmt: skip
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ArgumentError(name, v, f"{name} is a whole number of at least 1", f"Give e.g. {name}=8192."
                                if name == "max_model_len" else "")  # fmt: skip
    u = gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
        raise ArgumentError("gpu_memory_utilization", u, "the fraction of the GPU's memory vLLM may use is in (0, 1]",
                            "Give e.g. gpu_memory_utilization=0.9 (vLLM's default).")  # fmt: skip
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in kv_blocks.BLOCK_SIZES:
        raise ArgumentError("block_size", block_size, "vLLM's block sizes are " +
                            ", ".join(map(str, kv_blocks.BLOCK_SIZES)), "Give block_size=16 (vLLM's default).")  # fmt: skip
    if kv_cache_dtype not in KV_DTYPES:
        raise ArgumentError("kv_cache_dtype", kv_cache_dtype, "not a KV cache dtype fakeviz follows",
                            "Give one of " + ", ".join(repr(k) for k in KV_DTYPES) + ".")  # fmt: skip
    if max_num_batched_tokens is not None and max_num_seqs is not None and max_num_batched_tokens < max_num_seqs:
        raise ArgumentError("max_num_batched_tokens", max_num_batched_tokens,
                            f"it is below max_num_seqs={max_num_seqs} (vLLM refuses this too)",
                            "Give max_num_batched_tokens >= max_num_seqs, or a smaller max_num_seqs.")  # fmt: skip


def _defaults(gpu: Capacity, max_model_len: int, tokens: int | None, seqs: int | None) -> tuple[int, int]:
    """``vllm serve``'s ``max_num_batched_tokens`` / ``max_num_seqs`` for this GPU (Note: [vLLM's memory profile])."""
    big = gpu.bytes >= 70 * _GIB and "A100" not in (gpu.gpu or "")
    if seqs is None:
        seqs = 1024 if big else 256
    if tokens is None:
        tokens = min(8192 if big else 2048, seqs * max_model_len)
    return tokens, seqs


def _serving_dtype(config: Any, dtype: Any, gpu: Capacity) -> torch.dtype:
    """``dtype=None``: vLLM's ``"auto"`` (``_resolve_auto_dtype``): the config's dtype, float32 served in the GPU's
    first dtype (bf16; fp16 before compute capability 8.0, where bf16 configs fall back to fp16 too). A bf16 asked
    for on such a GPU is refused, as vLLM refuses it."""
    cap = CAPABILITY.get(gpu.gpu or "", (8, 0))  # a plain size ("80GB"): a GPU of today
    if dtype is not None:
        d = models.as_dtype(dtype)
        if d == torch.bfloat16 and cap < (8, 0):
            raise ArgumentError("dtype", dtype, f"bfloat16 needs compute capability 8.0, the {gpu.gpu} has "
                                f"{cap[0]}.{cap[1]} (vLLM refuses it too)", "Give dtype='float16'.")  # fmt: skip
        return d
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = getattr(c, "dtype", None) or getattr(c, "torch_dtype", None) or getattr(config, "torch_dtype", None)
    d = models.as_dtype(d) if isinstance(d, (str, torch.dtype)) else torch.float32
    if d == torch.float32 or (d == torch.bfloat16 and cap < (8, 0)):
        d = torch.bfloat16 if cap >= (8, 0) else torch.float16
    return d


def _context(config: Any) -> int:
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(c, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else 0


# ---------------------------------------------------------------------------------------------- serve
def serve(
    model: Any,
    gpus: Any = "1xH100",
    *,
    max_model_len: int = 8192,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    quantization: Any = None,
    dtype: Any = None,
    kv_cache_dtype: str = "auto",
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    tensor_parallel_size: int = 1,
) -> Serving:
    """What vLLM would allocate for serving ``model``: records its profile run, takes the peak, and divides what is
    left of ``gpu_memory_utilization x`` the GPU's memory by the KV bytes of one block (Note: [vLLM's memory
    profile], Note: [vLLM's KV cache blocks]).

    Args:
        model: a catalog name, folder or config (:func:`fakeviz.models.build`), or a transformers causal LM.
        gpus: the GPUs, ``tensor_parallel_size`` of one kind: ``"1xH100"``, ``"H100"``, ``"2xA100 40GB"``, ``"80GB"``.
        max_model_len: tokens of one request (prompt and output); past the model's context it is refused, as vLLM
            refuses it.
        gpu_memory_utilization: the fraction of the GPU's memory vLLM may use, in (0, 1].
        block_size: tokens per KV cache block (vLLM's sizes: 1, 8, 16, 32, 64, 128, 256).
        quantization: the weights quantized by their library (``"nf4"``, ``"int8"``, ``"fp8"``, ...:
            :func:`fakeviz.models.build`'s ``quantization=``).
        dtype: the model's dtype; default vLLM's ``"auto"``.
        kv_cache_dtype: ``"auto"`` (the model's dtype), ``"bfloat16"``, ``"float16"``, ``"fp8"``, ``"fp8_e4m3"``,
            ``"fp8_e5m2"``.
        max_num_batched_tokens, max_num_seqs: the scheduler's limits; default ``vllm serve``'s for the GPU.
        tensor_parallel_size: GPUs the model is split over (``gpus`` names that many): one rank's shard is recorded
            (Note: [tensor parallel serving]); dense models whose heads, KV heads and MLP width it divides.

    Returns:
        :class:`Serving`: ``kv_blocks``, ``max_concurrency``, ``max_context``, ``kv_bytes_per_block``,
        ``profile_peak``, ``weights``, ``available_kv``, ``fits`` (``error``: vLLM's text when it would not start),
        ``text`` and ``trace``, the profile run's record.

    Raises:
        ArgumentError: a value vLLM would refuse, or one fakeviz does not follow (a layer kind it does not model).
    """
    _check(max_model_len, gpu_memory_utilization, block_size, kv_cache_dtype, max_num_batched_tokens, max_num_seqs,
           tensor_parallel_size)  # fmt: skip
    caps = parse_gpus(gpus)
    tp = tensor_parallel_size
    if len(caps) != tp or len({c.bytes for c in caps}) != 1:
        raise ArgumentError("gpus", gpus, f"{len(caps)} GPUs for tensor_parallel_size={tp}",
                            f"Give {tp} GPUs of one kind ('{tp}xH100').")  # fmt: skip
    gpu = caps[0]
    is_module = isinstance(model, torch.nn.Module)
    if is_module and tp > 1:
        raise ArgumentError("tensor_parallel_size", tp, "a module cannot be resharded: tensor parallel serving builds "
                            "one rank's shard from the model's config", "Give the model's name or config.")  # fmt: skip
    config = model.config if is_module else models.config(model)
    width = token_width(config)
    for name, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len)):
        if v is not None:  # Note: [size limits]: the profile run's tokens, one request's
            check_tokens(1, v, width, argument=name)
    limit = _context(config)
    if limit and max_model_len > limit:
        raise ArgumentError("max_model_len", max_model_len,
                            f"it is past the model's context of {limit:,} positions (config max_position_embeddings); "
                            "vLLM refuses it too unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                            f"Give max_model_len <= {limit:,}.")  # fmt: skip
    tokens, seqs = _defaults(gpu, max_model_len, max_num_batched_tokens, max_num_seqs)
    if tokens > seqs * max_model_len:  # its profile run's sequences would pass max_model_len (Note: [size limits])
        raise ArgumentError("max_num_batched_tokens", tokens, f"more tokens than max_num_seqs={seqs:,} requests of "
                            f"max_model_len={max_model_len:,} hold: the scheduler never batches them",
                            f"Give max_num_batched_tokens <= {seqs * max_model_len:,}.")  # fmt: skip
    _check(max_model_len, gpu_memory_utilization, block_size, kv_cache_dtype, tokens, seqs, 1)
    dt = _serving_dtype(config, dtype, gpu)
    state_bytes = torch.empty((), dtype=dt).element_size()
    kv_bytes = KV_DTYPES[kv_cache_dtype] or state_bytes
    specs = kv_blocks.layer_specs(config, block_size=block_size, dtype_bytes=kv_bytes, tensor_parallel_size=tp,
                                  state_dtype_bytes=state_bytes, max_model_len=max_model_len)  # fmt: skip
    layout = kv_blocks.kv_layout(specs, max_model_len=max_model_len, max_num_batched_tokens=tokens)
    rank = model if is_module else rank_config(config, tp)
    trace, weights, peak, shape = profile_run(rank, dtype=dt, quantization=quantization, gpu=gpu, tokens=tokens,
                                              seqs=seqs, tp=tp, vocab=None if is_module else _vocab(config))  # fmt: skip
    mamba = [s for s in specs if s.kind == "mamba"]
    if mamba:  # Note: [vLLM's Mamba state pages]
        trace.meta.setdefault("assumptions", []).append([-1, "vllm mamba state", MAMBA_ASSUMPTION.format(
            kind=mamba[0].mamba_type, state=mamba[0].state_bytes, page=mamba[0].page_bytes,
            block=layout.block_size)])  # fmt: skip
    label = getattr(config, "_name_or_path", "") or (model if isinstance(model, str) else type(model).__name__)
    settings = {
        "max_model_len": max_model_len, "gpu_memory_utilization": gpu_memory_utilization, "block_size": block_size,
        "dtype": str(dt).replace("torch.", ""), "kv_cache_dtype": kv_cache_dtype,
        "quantization": None if quantization is None else str(adapters.resolve_quantization(quantization).label),
        "max_num_batched_tokens": tokens, "max_num_seqs": seqs, "tensor_parallel_size": tensor_parallel_size,
        "profile_shape": shape, "kv_block_size": layout.block_size,
    }  # fmt: skip
    requested = math.ceil(gpu.bytes * gpu_memory_utilization)
    return Serving(str(label), gpu, settings, layout, weights, peak, requested, limit or max_model_len, trace)


# ------------------------------------------------------------------------------------------ profile run
MAMBA_ASSUMPTION = (
    "{kind} state of {state:,} bytes a layer, padded to the attention page of {page:,} bytes (attention block size "
    "raised to {block} tokens, the 16-token kernel alignment); prefix caching off (--no-enable-prefix-caching: one "
    "state page per request and Mamba group), no speculative decoding, states in the model's dtype "
    "(mamba_cache_dtype and mamba_ssm_cache_dtype 'auto'); Note: [vLLM's Mamba state pages]. The Mamba / "
    "linear-attention mixers of the profile run are transformers' PyTorch reference paths (the mamba_ssm, "
    "causal_conv1d and flash-linear-attention kernels are CUDA-only): their intermediates (a mamba1 scan's float32 "
    "batch x d_inner x tokens x state tensors) are far larger than vLLM's fused kernels', so the profile peak is an "
    "upper bound and the KV cache a lower bound"
)
ASSUMPTIONS = (
    ("vllm profile run", "vLLM runs its own model code (paged-attention kernels, fused ops); this profile run is "
     "transformers' model over the same tokens ({shape}); token-wise activations (projections, MLP, norms) have "
     "vLLM's sizes, attention's are transformers' kernels' (vLLM's profile run skips attention)"),
    ("vllm non-torch memory", "memory outside torch's allocator that vLLM adds to the non-KV memory (CUDA context "
     "growth, cuBLAS workspaces, NCCL buffers: typically a few hundred MiB) is not recorded: counted as 0"),
    ("vllm cuda graphs", "CUDA graphs are not captured (vLLM's --enforce-eager): graph memory is not counted"),
    ("vllm sampler", "the sampler as vLLM's dummy sampler run: float32 logits of each request's last token, "
     "temperature, softmax and the exponential race; top-k/top-p and logprobs are skipped as vLLM's profile run "
     "may skip them"),
)  # fmt: skip


def _vocab(config: Any) -> int:
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(c.vocab_size)


def rank_config(config: Any, tp: int) -> Any:
    """The config of one rank of ``tp``-way tensor-parallel serving, as vLLM shards the model.

    Note: [tensor parallel serving]
    vLLM pads the vocabulary to a multiple of 64 (``VocabParallelEmbedding``, ``ParallelLMHead``: their padded rows are
    weights too, at any ``tp``) and splits it over the ranks; the attention's query and KV heads and the MLP's width
    are split (column- and row-parallel linears); norms are whole on every rank. One rank's shard is therefore the
    model of a config with ``heads / tp``, ``kv_heads / tp``, ``intermediate_size / tp``, ``padded vocab / tp`` and
    the same ``head_dim``: its weights are a rank's, and its forward has a rank's activations. The logits a rank
    gathers for the sampler are the whole padded vocabulary, cut to the real one (``LogitsProcessor``); the gather
    is recorded as a local ``repeat`` of the same bytes and the all-reduces after row-parallel layers are not
    recorded (in place in vLLM). Mixture-of-experts and latent-attention models are sharded otherwise: refused for
    ``tp > 1``, as are sizes that do not split evenly. KV heads are never replicated here (vLLM replicates them when
    ``tp`` exceeds them): refused too.
    """
    import copy

    c = copy.deepcopy(config)
    t = c.get_text_config() if hasattr(c, "get_text_config") else c
    padded = kv_blocks.cdiv(int(t.vocab_size), 64) * 64
    if tp > 1:
        moe = any(getattr(t, k, None) for k in ("num_local_experts", "num_experts", "n_routed_experts"))
        if moe or getattr(t, "kv_lora_rank", None) or "linear_attention" in kv_blocks.layer_kinds(t):
            raise ArgumentError("tensor_parallel_size", tp, "tensor-parallel shards of mixture-of-experts, "
                                "latent-attention and Mamba / linear-attention models are not followed",
                                "Give tensor_parallel_size=1.")  # fmt: skip
        heads = int(t.num_attention_heads)
        kv = int(getattr(t, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(t, "head_dim", None) or int(t.hidden_size) // heads)
        for what, n in (("attention heads", heads), ("KV heads", kv), ("MLP width (intermediate_size)",
                        int(t.intermediate_size)), ("vocabulary padded to 64", padded)):  # fmt: skip
            if n % tp:
                raise ArgumentError("tensor_parallel_size", tp, f"the model's {n} {what} do not split evenly over "
                                    f"{tp} GPUs", f"Give a tensor_parallel_size that divides {n}.")  # fmt: skip
        t.head_dim = head_dim
        t.num_attention_heads, t.num_key_value_heads = heads // tp, kv // tp
        t.intermediate_size = int(t.intermediate_size) // tp
    t.vocab_size = padded // tp
    return c


def profile_run(model: Any, *, dtype: torch.dtype, quantization: Any, gpu: Capacity, tokens: int, seqs: int,
                tp: int = 1, vocab: int | None = None) -> tuple[Any, int, int, str]:  # fmt: skip
    """Record vLLM's profile run of ``model`` (a name, config or module; for ``tp > 1`` one rank's config:
    :func:`rank_config`) on one fake GPU of ``gpu``'s kind (Note: [vLLM's memory profile]); ``vocab``: the real
    vocabulary the gathered logits are cut to.

    Returns:
        ``(trace, weights, profile_peak, shape)``: the record, the bytes alive on the GPU before it (the weights),
        its allocated peak over them, and the shape its tokens were run as (``"1024 x 8"``).
    """
    from .._api import FakeSession, record
    from .._engine import cuda_api
    from .._engine.session import fakeify, session_patches

    q = adapters.resolve_quantization(quantization)
    session = FakeSession()
    with session_patches(), session.mode, cuda_api.gpu_session(on=True, gpu=gpu.gpu, count=1), \
            adapters.quantizing(q, gpu.gpu):  # fmt: skip
        if isinstance(model, torch.nn.Module):
            mod = fakeify(model, mode=session.mode, device="cuda:0").to(dtype)
            if q is not None:
                adapters.quantize(mod, q)
        else:
            mod = models.build(model, device="cuda:0", dtype=dtype, quantization=quantization)
    mod.eval()
    with record(device="cuda:0", gpus=1, gpu=gpu.gpu, modules=[mod], session=session) as trace:
        shape = profile_forward(mod, tokens=tokens, seqs=seqs, tp=tp, vocab=vocab)
    trace.meta["capacity"] = gpu.spec
    rows = [(op, text.format(shape=shape)) for op, text in ASSUMPTIONS]
    if tp > 1:
        rows.append(("vllm tensor parallel", f"one rank of {tp}: its shard of the weights and its activations; the "
                     "logits' all-gather is a local repeat of the same bytes, the all-reduces (in place in vLLM) and "
                     "their communication buffers are not recorded"))  # fmt: skip
    for op, text in rows:
        trace.meta.setdefault("assumptions", []).append([-1, op, text])
    weights = _alive_before(trace)
    peak = int(peak_bytes(trace).get("cuda:0", {}).get("bytes", 0))
    return trace, weights, max(peak - weights, 0), shape


def profile_forward(mod: torch.nn.Module, *, tokens: int, seqs: int, tp: int = 1, vocab: int | None = None,
                    device: str = "cuda:0") -> str:  # fmt: skip
    """vLLM's dummy run and dummy sampler run of a causal LM on ``device``, without autograd: ``tokens`` as
    ``min(tokens, seqs)`` requests (a batch of equal sequences, or one packed sequence when they do not divide),
    the logits of each request's last token (gathered over ``tp`` ranks, cut to ``vocab``), then the sampler.
    Returns the shape the tokens ran as (``"1024 x 8"``)."""
    reqs = min(tokens, seqs)
    per, rem = divmod(tokens, reqs)
    with torch.no_grad():
        if not rem:  # vLLM's requests as a batch of equal sequences: logits of each one's last token
            ids = torch.zeros(reqs, per, dtype=torch.long, device=device)
            logits = mod(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1, :]
        else:  # one packed sequence, the logits at each request's last token
            ids = torch.zeros(1, tokens, dtype=torch.long, device=device)
            last = torch.arange(1, reqs + 1, device=device) * per - 1
            last[-1] = tokens - 1
            logits = mod(input_ids=ids, use_cache=False, logits_to_keep=last).logits[0]
        if tp > 1:  # the rank's logits gathered over the tensor-parallel group (Note: [tensor parallel serving])
            logits = logits.repeat(1, tp)
        if vocab is not None:
            logits = logits[:, :vocab]
        _sampler(logits)
    return f"{reqs} x {per}" if not rem else f"1 x {tokens} packed, {reqs} requests"


def _sampler(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's sampler over the dummy requests' logits (``vllm/v1/sample/sampler.py``: float32, temperature, then
    the exponential race of ``random_sample``)."""
    logits = logits.to(torch.float32)
    temperature = torch.ones(logits.shape[0], 1, dtype=torch.float32, device=logits.device)
    logits = logits.div_(temperature)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def _alive_before(trace: Any, device: str = "cuda:0") -> int:
    """Bytes of the storages on ``device`` alive before the record's first op (the weights, carried in)."""
    c = trace.columns()
    devices = [str(d) for d in trace.string_tables()["devices"]]
    if device not in devices:
        return 0
    on = c["st_device"] == devices.index(device)
    before = c["st_alloc"] < 0
    return int(c["st_nbytes"][on & before].clip(min=0).sum())
