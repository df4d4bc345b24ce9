"""Real GPU timings for the time model (issue 32): kernel classes, whole steps and every op of a step.

Measures on ``cuda:0`` and writes one JSON file (``--out``; default
``benchmarks/results/gpu_time_<gpu>.json``) that the time model
(``fakeviz._analysis.timing``) is fitted to and checked against on machines without a GPU:

* ``micro``: single kernels timed with CUDA events (warm-up excluded, the mean of enough repetitions to
  fill ``--min-ms``): GEMMs by dtype and shape (fp32 with and without TF32, bf16, fp16), scaled dot-product
  attention by backend (flash, efficient, math; forward and forward+backward), elementwise ops,
  reductions and casts by size, foreach optimizer kernels, and the per-launch cost of an empty-sized op.
  Each row carries its FLOPs and the bytes it must move, so achieved FLOP/s and bytes/s follow.
* ``steps``: whole training steps (the ``gpu_accuracy.py`` zoo cases and transformer blocks at published
  widths): the median and spread of ``--steps`` timed steps (CUDA events, ``--warmup`` steps first), the
  step's kernels by class from ``torch.profiler`` (sum of kernel durations per class, GPU busy time), and
  every op of one step: a TorchDispatchMode wraps each dispatched op in a ``record_function`` range, so the
  profiler attributes every CUDA kernel to the op that launched it. Each op row has the op's name, its
  tensors' shapes, dtypes and strides, FLOPs (``fakeviz._engine.flops.op_flops``, the record's own numbers),
  bytes read and written, and the kernels it ran with their durations. The step is also recorded by
  ``fv.record(fake=False)`` and the op names of both are compared (``ops_match_record``), so a fake record
  of the same step on a CPU machine joins the measured times op by op.

No GPU: says so and exits 0 (``--device cpu`` runs everything but the kernel timings, to check the script).

    python benchmarks/gpu_time.py [--cases llama8b_2l,...] [--no-micro] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Kernel classes by CUDA kernel name (the profiler's names; cuBLAS, cuBLASLt/nvjet, CUTLASS, flash, ATen).
KERNEL_CLASSES: list[tuple[str, re.Pattern[str]]] = [
    ("attention", re.compile(r"flash|fmha|attention|mem_eff", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|sm\d+_xmma|cutlass|cublas|matmul|wgmma|splitK|dot_kernel", re.I)),
    ("foreach", re.compile(r"multi_tensor|foreach", re.I)),
    ("reduction", re.compile(r"reduce|softmax|norm|cross_entropy|nll_loss|argmax|topk|sort|scan|cumsum", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|cat|index|gather|scatter|embedding|transpose|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)),
    ("convolution", re.compile(r"conv|implicit|winograd|fft|cudnn", re.I)),
]


def kernel_class(name: str) -> str:
    for cls, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return cls
    return "other"


# ----------------------------------------------------------------------------------------------- timing helpers
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], Any], device: str, *, min_ms: float, warmup: int = 3) -> dict[str, float]:
    """Mean seconds per call of ``fn`` (CUDA events around a run of calls, warm-up excluded)."""
    import torch

    for _ in range(warmup):
        fn()
    _sync(device)
    if not device.startswith("cuda"):
        t = time.perf_counter()
        fn()
        return {"s": time.perf_counter() - t, "reps": 1}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one_ms = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max(min_ms / one_ms, 3), 2000))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return {"s": start.elapsed_time(end) / 1e3 / reps, "reps": reps}


# ---------------------------------------------------------------------------------------------- microbenchmarks
def micro(device: str, min_ms: float, small: bool = False, extra_only: bool = False) -> list[dict[str, Any]]:
    import torch
    from torch.nn import functional as F

    rows: list[dict[str, Any]] = []
    if extra_only:
        return micro_extra(device, min_ms)

    def add(kind: str, params: dict[str, Any], fn: Callable[[], Any], flops: int, nbytes: int) -> None:
        try:
            t = time_fn(fn, device, min_ms=min_ms)
        except Exception as exc:  # noqa: BLE001 - one unsupported config (a backend refusing a shape) is a row
            rows.append({"kind": kind, **params, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            return
        rows.append({"kind": kind, **params, "flops": flops, "bytes": nbytes, **t})

    size = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
    gemm_shapes = [
        (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
        (8192, 8192, 8192), (2048, 4096, 4096), (2048, 14336, 4096), (2048, 4096, 14336),
        (4096, 6144, 6144), (4096, 24576, 6144), (4096, 6144, 24576), (8192, 4096, 4096),
        (2048, 128256, 4096), (2048, 2048, 8192), (2048, 8192, 2048), (8, 4096, 4096), (1, 4096, 14336),
        (64, 4096, 4096), (512, 1024, 4096), (16384, 1024, 1024),
    ]  # fmt: skip
    if small:
        gemm_shapes = gemm_shapes[:2]
    for dtype, tf32 in ((torch.bfloat16, False), (torch.float16, False), (torch.float32, False), (torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, n, k in gemm_shapes:
            if dtype == torch.float32 and m * n * k > 2048 * 14336 * 4096:
                continue
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            add("gemm", {"dtype": str(dtype), "tf32": tf32, "m": m, "n": n, "k": k}, functools.partial(torch.mm, a, b),
                2 * m * n * k, (m * k + k * n + m * n) * size[dtype])  # fmt: skip
            del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    for batch, m, n, k in ((32, 2048, 2048, 128), (32, 2048, 128, 2048), (64, 512, 512, 64), (8, 4096, 4096, 128)):
        a = torch.randn(batch, m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device=device, dtype=torch.bfloat16)
        add("bmm", {"dtype": "torch.bfloat16", "batch": batch, "m": m, "n": n, "k": k},
            functools.partial(torch.bmm, a, b), 2 * batch * m * n * k, batch * (m * k + k * n + m * n) * 2)  # fmt: skip
        del a, b

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip
    for b, h, kvh, s, d in ((1, 32, 8, 2048, 128), (1, 32, 8, 8192, 128), (4, 32, 32, 2048, 128),
                            (8, 16, 16, 1024, 64), (16, 12, 12, 512, 64))[-1 if small else 0:]:  # fmt: skip
        for backend, which in backends.items():
            if backend == "math" and s > 4096:
                continue
            q = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, kvh, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, kvh, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
            gqa = kvh != h

            def fwd(q=q, k=k, v=v, which=which, gqa=gqa) -> Any:
                with sdpa_kernel(which):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            def fwd_bwd(fwd=fwd) -> Any:
                out = fwd()
                out.backward(torch.ones_like(out))

            fl = 4 * b * h * s * s * d // 2  # causal: half of QK^T and PV
            io = (2 * b * h * s * d + 2 * b * kvh * s * d) * 2
            params = {"backend": backend, "b": b, "h": h, "kv_h": kvh, "seq": s, "d": d, "causal": True}
            add("sdpa_fwd", params, fwd, fl, io)
            add("sdpa_fwd_bwd", params, fwd_bwd, fl * 7 // 2, io * 3)
            del q, k, v

    for numel in (1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)[: 2 if small else None]:
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(numel, device=device, dtype=dtype)
            y = torch.randn(numel, device=device, dtype=dtype)
            e = size[dtype]
            add("add", {"dtype": str(dtype), "numel": numel}, functools.partial(torch.add, x, y), numel, 3 * numel * e)
            add("mul_", {"dtype": str(dtype), "numel": numel}, functools.partial(x.mul_, 1.0001), numel, 2 * numel * e)
            add("gelu", {"dtype": str(dtype), "numel": numel}, functools.partial(F.gelu, x), numel, 2 * numel * e)
            add("copy", {"dtype": str(dtype), "numel": numel}, functools.partial(y.copy_, x), 0, 2 * numel * e)
            other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
            add("cast", {"dtype": str(dtype), "to": str(other), "numel": numel}, functools.partial(x.to, other), 0,
                numel * (e + size[other]))  # fmt: skip
            rows_ = max(numel // 4096, 1)
            x2 = x.view(rows_, -1)
            add("sum_lastdim", {"dtype": str(dtype), "numel": numel, "cols": x2.shape[1]},
                functools.partial(torch.sum, x2, -1), numel, numel * e + rows_ * e)  # fmt: skip
            add("softmax_lastdim", {"dtype": str(dtype), "numel": numel, "cols": x2.shape[1]},
                functools.partial(torch.softmax, x2, -1), 5 * numel, 2 * numel * e)  # fmt: skip
            add("transpose_copy", {"dtype": str(dtype), "numel": numel, "cols": x2.shape[1]},
                functools.partial(lambda t: t.t().contiguous(), x2), 0, 2 * numel * e)  # fmt: skip
            del x, y, x2

    for n_tensors, numel in ((64, 1 << 20), (256, 1 << 18), (16, 1 << 24))[: 1 if small else None]:
        params = [torch.randn(numel, device=device) for _ in range(n_tensors)]
        grads = [torch.randn(numel, device=device) for _ in range(n_tensors)]
        for p, g in zip(params, grads):
            p.grad = g
        total = n_tensors * numel
        add("foreach_add_", {"tensors": n_tensors, "numel_each": numel},
            functools.partial(torch._foreach_add_, params, grads, alpha=1e-3), total, 3 * total * 4)  # fmt: skip
        for impl in ("foreach", "fused"):
            opt = torch.optim.AdamW(params, lr=1e-5, **{impl: True})
            opt.step()
            add("adamw_step", {"impl": impl, "tensors": n_tensors, "numel_each": numel}, opt.step, 12 * total,
                total * 4 * 7)  # fmt: skip  # reads p, g, m, v; writes p, m, v
            del opt
        del params, grads

    tiny = torch.zeros(1, device=device)
    add("launch", {"op": "add_ one element"}, functools.partial(tiny.add_, 1), 1, 8)
    add("launch", {"op": "view (no kernel)"}, functools.partial(tiny.view, 1, 1), 0, 0)
    return rows


def micro_extra(device: str, min_ms: float) -> list[dict[str, Any]]:
    """Second set (``--micro extra``): GEMMs with a dimension off the 16-byte grid, attention-style bmm with a
    small inner dimension (eager attention), and causal against non-causal attention."""
    import torch
    from torch.nn import functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows: list[dict[str, Any]] = []

    def add(kind: str, params: dict[str, Any], fn: Callable[[], Any], flops: int, nbytes: int) -> None:
        try:
            t = time_fn(fn, device, min_ms=min_ms)
        except Exception as exc:  # noqa: BLE001 - one unsupported config is a row
            rows.append({"kind": kind, **params, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            return
        rows.append({"kind": kind, **params, "flops": flops, "bytes": nbytes, **t})

    for dtype, e in ((torch.bfloat16, 2), (torch.float32, 4)):
        for m, n, k in ((8192, 50257, 1024), (8192, 50304, 1024), (8192, 1024, 50257), (50257, 1024, 8192),
                        (2048, 4095, 4096), (2048, 4096, 4095), (2047, 4096, 4096), (4096, 4100, 4096),
                        (4096, 4104, 4096), (2048, 32001, 4096), (2048, 32000, 4096), (1000, 1000, 1000),
                        (2048, 11008, 4096), (2048, 5504, 4096), (2048, 2730, 4096)):  # fmt: skip
            if dtype == torch.float32 and m * n * k > 2**36:
                continue
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            add("gemm", {"dtype": str(dtype), "tf32": False, "m": m, "n": n, "k": k}, functools.partial(torch.mm, a, b),
                2 * m * n * k, (m * k + k * n + m * n) * e)  # fmt: skip
            del a, b
    for batch, m, n, k in ((128, 1024, 1024, 64), (128, 1024, 64, 1024), (64, 2048, 2048, 96), (64, 2048, 96, 2048),
                           (256, 512, 512, 64), (32, 4096, 4096, 128), (32, 4096, 128, 4096)):  # fmt: skip
        a = torch.randn(batch, m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device=device, dtype=torch.bfloat16)
        add("bmm", {"dtype": "torch.bfloat16", "batch": batch, "m": m, "n": n, "k": k},
            functools.partial(torch.bmm, a, b), 2 * batch * m * n * k, batch * (m * k + k * n + m * n) * 2)  # fmt: skip
        del a, b
    for b, h, s, d in ((1, 32, 4096, 128), (4, 16, 2048, 64), (2, 32, 2048, 128)):
        for causal in (True, False):
            for backend, which in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                                   ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip
                q = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)

                def fwd(q=q, which=which, causal=causal) -> Any:
                    with sdpa_kernel(which):
                        return F.scaled_dot_product_attention(q, q, q, is_causal=causal)

                def fwd_bwd(fwd=fwd) -> Any:
                    out = fwd()
                    out.backward(torch.ones_like(out))

                fl = 4 * b * h * s * s * d  # the full product, as torch's formula counts it
                params = {"backend": backend, "b": b, "h": h, "kv_h": h, "seq": s, "d": d, "causal": causal}
                add("sdpa_fwd", params, fwd, fl, 4 * b * h * s * d * 2)
                add("sdpa_fwd_bwd", params, fwd_bwd, fl * 7 // 2, 12 * b * h * s * d * 2)
                del q
    return rows


# -------------------------------------------------------------------------------------------------- step cases
class StepCase:
    """A built model and the step to time: ``step()`` runs forward, loss, backward (and optimizer step)."""

    def __init__(self, name: str, tokens: int, step: Callable[[], Any], model: Any, note: str) -> None:
        self.name, self.tokens, self.step, self.model, self.note = name, tokens, step, model, note


def _zoo_case(name: str, device: str) -> StepCase:
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    import zoo

    torch.manual_seed(zoo.SEED)
    with torch.device(device):
        case = zoo.ZOO[name]()
        opt = case.make_optimizer(case.model) if case.make_optimizer is not None else None
        inputs = case.make_inputs()

    def step() -> None:
        loss = case.loss_fn(case.model, inputs)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            case.model.zero_grad(set_to_none=True)

    return StepCase(name, 0, step, case.model, "tests/zoo.py, tiny (launch bound)")


def _hf_case(name: str, device: str) -> StepCase:
    """Transformer blocks at published widths, built from configs, bf16, one training step."""
    import torch
    import transformers

    spec: dict[str, Any] = {
        # Llama-3.1-8B's layer (hidden 4096, MLP 14336, GQA 32/8, vocab 128256), 2 layers, batch 1 x 4096
        "llama8b_2l": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, num_hidden_layers=2,
                       max_position_embeddings=8192, rope_theta=500000.0), (1, 4096), "sdpa", None),
        # the same at batch 2 x 2048 with an AdamW step (foreach, bf16 states)
        "llama8b_2l_adamw": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=4096, intermediate_size=14336,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, num_hidden_layers=2,
                             max_position_embeddings=8192), (2, 2048), "sdpa", "adamw"),
        # Llama-3.2-1B's layer (hidden 2048, MLP 8192, GQA 32/8), 4 layers, batch 4 x 2048
        "llama1b_4l": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=2048, intermediate_size=8192,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, num_hidden_layers=4,
                       max_position_embeddings=8192, tie_word_embeddings=True), (4, 2048), "sdpa", None),
        # Qwen2.5-7B's layer with eager attention (the math the eager path dispatches), batch 1 x 2048
        "qwen7b_2l_eager": ("Qwen2ForCausalLM", "Qwen2Config", dict(hidden_size=3584, intermediate_size=18944,
                            num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, num_hidden_layers=2,
                            max_position_embeddings=8192), (1, 2048), "eager", None),
        # GPT-NeoX-20B's layer (hidden 6144, 64 heads, MLP 24576), 2 layers, batch 1 x 2048
        "gpt_neox20b_2l": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(hidden_size=6144, intermediate_size=24576,
                           num_attention_heads=64, vocab_size=50432, num_hidden_layers=2, rotary_pct=0.25,
                           hidden_dropout=0.0, attention_dropout=0.0), (1, 2048), "sdpa", None),
        # Mixtral-8x7B's layer (8 experts of 14336, top-2), 2 layers, batch 1 x 2048
        "mixtral_2l": ("MixtralForCausalLM", "MixtralConfig", dict(hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                       vocab_size=32000, num_hidden_layers=2), (1, 2048), "sdpa", None),
        # held out (HOLDOUT_CASES): measured, never used to fit the time model's constants
        "llama8b_2l_b4": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=4096, intermediate_size=14336,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, num_hidden_layers=2,
                          max_position_embeddings=8192), (4, 4096), "sdpa", None),
        "mistral7b_2l_adamw": ("MistralForCausalLM", "MistralConfig", dict(hidden_size=4096, intermediate_size=14336,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=32768, num_hidden_layers=2,
                               max_position_embeddings=8192), (2, 4096), "sdpa", "adamw"),
        "qwen1_5b_4l": ("Qwen2ForCausalLM", "Qwen2Config", dict(hidden_size=1536, intermediate_size=8960,
                        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, num_hidden_layers=4,
                        max_position_embeddings=4096, tie_word_embeddings=True), (8, 1024), "sdpa", None),
        "phi3_mini_2l_eager": ("Phi3ForCausalLM", "Phi3Config", dict(hidden_size=3072, intermediate_size=8192,
                               num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, num_hidden_layers=2,
                               max_position_embeddings=4096, pad_token_id=0), (2, 2048), "eager", None),
        "llama1b_4l_autocast_fused": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=2048, intermediate_size=8192,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      num_hidden_layers=4, max_position_embeddings=8192, tie_word_embeddings=True),
                                      (2, 2048), "sdpa", "autocast+fused"),
        "gpt2_medium_8l_eager": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=1024, n_head=16, n_layer=8,
                                 vocab_size=50257, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
                                 attn_pdrop=0.0), (8, 1024), "eager", "adamw"),
        # second held-out set (HOLDOUT_CASES_2), measured after the constants were fitted and committed
        "llama3b_4l_adamw": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=3072, intermediate_size=8192,
                             num_attention_heads=24, num_key_value_heads=8, vocab_size=128256, num_hidden_layers=4,
                             max_position_embeddings=8192, tie_word_embeddings=True), (2, 4096), "sdpa", "adamw"),
        "qwen7b_2l_b2": ("Qwen2ForCausalLM", "Qwen2Config", dict(hidden_size=3584, intermediate_size=18944,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, num_hidden_layers=2,
                         max_position_embeddings=8192), (2, 4096), "sdpa", None),
        "mistral_nemo_2l": ("MistralForCausalLM", "MistralConfig", dict(hidden_size=5120, intermediate_size=14336,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=131072,
                            num_hidden_layers=2, max_position_embeddings=16384), (1, 8192), "sdpa", None),
    }  # fmt: skip
    cls_name, cfg_name, cfg, (batch, seq), attn, optim = spec[name]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(attn_implementation=attn, **cfg)
    autocast = optim == "autocast+fused"
    with torch.device(device):
        model = getattr(transformers, cls_name)(config)
        if not autocast:
            model = model.to(torch.bfloat16)
        ids = torch.randint(0, cfg.get("vocab_size", 50257), (batch, seq))
    opt = None
    if optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    elif autocast:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    dev_type = device.split(":")[0]

    def step() -> None:
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    return StepCase(name, batch * seq, step, model, f"{cls_name} {cfg} batch {batch}x{seq} attn={attn} optim={optim}")


ZOO_CASES = ["mlp", "convnet_channels_last", "gpt2_tied", "llama", "bert", "t5", "checkpointed"]
HF_CASES = ["llama8b_2l", "llama8b_2l_adamw", "llama1b_4l", "qwen7b_2l_eager", "gpt_neox20b_2l", "mixtral_2l"]
HOLDOUT_CASES = ["llama8b_2l_b4", "mistral7b_2l_adamw", "qwen1_5b_4l", "phi3_mini_2l_eager",
                 "llama1b_4l_autocast_fused", "gpt2_medium_8l_eager"]  # fmt: skip
HOLDOUT_CASES_2 = ["llama3b_4l_adamw", "qwen7b_2l_b2", "mistral_nemo_2l"]


def _tensors(x: Any) -> list[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _meta(ts: list[Any], cap: int = 6) -> list[list[Any]]:
    return [[list(t.shape), str(t.dtype).removeprefix("torch."), list(t.stride())] for t in ts[:cap]]


def _nbytes(ts: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def op_rows(case: StepCase, device: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every op of one step with the kernels it launched (profiler ranges per op)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils._python_dispatch import TorchDispatchMode

    from fakeviz._engine.flops import op_flops

    rows: list[dict[str, Any]] = []

    class OpRanges(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            i = len(rows)
            rows.append({})
            ins = _tensors(args) + _tensors(kwargs)
            with record_function(f"fvop#{i}"):
                out = func(*args, **kwargs)
            outs = _tensors(out)
            try:
                flops = int(op_flops(func, args, kwargs, out))
            except Exception:  # noqa: BLE001 - a formula that fails on an odd call is reported as unknown
                flops = -1
            rows[i] = {"i": i, "op": str(func), "in": _meta(ins), "n_in": len(ins), "out": _meta(outs),
                       "n_out": len(outs), "bytes_in": _nbytes(ins), "bytes_out": _nbytes(outs), "flops": flops}  # fmt: skip
            return out

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    _sync(device)
    with profile(activities=activities) as prof:
        with OpRanges():
            case.step()
        _sync(device)
    by_op: dict[int, list[tuple[str, float]]] = {}

    def kernels(evt: Any) -> list[tuple[str, float]]:
        found = [(k.name, k.duration) for k in getattr(evt, "kernels", [])]
        for child in evt.cpu_children:
            found += kernels(child)
        return found

    for evt in prof.events():
        if evt.name.startswith("fvop#") and str(evt.device_type).endswith("CPU"):
            by_op[int(evt.name[5:])] = kernels(evt)
    for row in rows:
        ks = by_op.get(row["i"], [])
        row["kernels"] = [[n[:120], round(d, 3)] for n, d in ks]
        row["device_us"] = round(sum(d for _, d in ks), 3)
    # the plain step's kernels by class (no dispatch mode: the kernels a user's step runs)
    _sync(device)
    with profile(activities=activities) as prof2:
        case.step()
        _sync(device)
    classes: dict[str, dict[str, float]] = {}
    busy = 0.0
    for evt in prof2.events():
        for k in getattr(evt, "kernels", []):
            c = classes.setdefault(kernel_class(k.name), {"us": 0.0, "kernels": 0})
            c["us"] += k.duration
            c["kernels"] += 1
            busy += k.duration
    return rows, {"busy_us": round(busy, 1), "by_class": classes}


def time_steps(case: StepCase, device: str, steps: int, warmup: int) -> dict[str, Any]:
    import torch

    for _ in range(warmup):
        case.step()
    _sync(device)
    times = []
    for _ in range(steps):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            case.step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            case.step()
            times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "steps": steps}


def run_case(name: str, device: str, steps: int, warmup: int) -> dict[str, Any]:
    import torch

    import fakeviz as fv

    case = _zoo_case(name, device) if name in ZOO_CASES else _hf_case(name, device)
    params = sum(p.numel() for p in case.model.parameters())
    timing = time_steps(case, device, steps, warmup)
    ops, kernels = op_rows(case, device)
    with fv.record(fake=False, device=device if device.startswith("cuda") else "cpu") as trace:
        case.step()
    recorded = [str(o) for o in trace.ops["op"]]
    names = [r["op"] for r in ops]
    flops = sum(r["flops"] for r in ops if r["flops"] > 0)
    row = {
        "case": name, "holdout": name in HOLDOUT_CASES + HOLDOUT_CASES_2, "note": case.note, "params": params, "tokens": case.tokens, **timing, **kernels,
        "ops": len(ops), "record_ops": trace.num_ops, "ops_match_record": _norm(names) == _norm(recorded),
        "flops": flops, "achieved_tflops": flops / timing["median_s"] / 1e12 if timing["median_s"] else None,
        "op_rows": ops,
    }  # fmt: skip
    if not row["ops_match_record"]:
        row["record_op_names"] = recorded
    if row["holdout"]:  # the real GPU's op log of the step, to compare with a fake record of it on any machine
        row["record_oplog"] = trace.oplog_lines()
    del case, trace
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def _norm(names: list[str]) -> list[str]:
    """Op names to compare: the record leaves out the ``detach`` autograd makes when it saves an output."""
    return [n.removeprefix("aten.") for n in names if n.removeprefix("aten.") != "detach.default"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default="", help=f"comma-separated (default: all): {', '.join(ZOO_CASES + HF_CASES)}"
    )
    parser.add_argument("--no-micro", action="store_true", help="skip the kernel microbenchmarks")
    parser.add_argument("--micro", choices=["main", "extra"], default="main",
                        help="extra: misaligned GEMMs, attention-style bmm, causal vs non-causal attention")  # fmt: skip
    parser.add_argument("--no-steps", action="store_true", help="skip the step cases")
    parser.add_argument("--min-ms", type=float, default=20.0, help="time each microbenchmark for about this long")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu (checks the script only)")
    parser.add_argument("--small", action="store_true", help="a few small microbenchmarks (to check the script)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_time: no CUDA device available (torch.cuda.is_available() is False); nothing to time.")
        return 0
    sys.path.insert(0, str(REPO))
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    out = args.out or HERE / "results" / f"gpu_time_{re.sub(r'[^A-Za-z0-9]+', '_', gpu).strip('_').lower()}.json"
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "device": gpu, "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
    }  # fmt: skip
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        pass
    if args.device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        result["sm_count"], result["memory_bytes"] = p.multi_processor_count, p.total_memory
    if not args.no_micro:
        t = time.perf_counter()
        result["micro"] = micro(args.device, args.min_ms, args.small, args.micro == "extra")
        print(f"micro: {len(result['micro'])} rows in {time.perf_counter() - t:.1f} s", flush=True)
        for r in result["micro"]:
            if r.get("kind") == "gemm" and "s" in r:
                print(f"  gemm {r['dtype']:<15} tf32={r['tf32']!s:<5} {r['m']:>6}x{r['n']:>6}x{r['k']:>6} "
                      f"{r['flops'] / r['s'] / 1e12:8.1f} TFLOP/s", flush=True)  # fmt: skip
    names = [c for c in args.cases.split(",") if c] or ZOO_CASES + HF_CASES
    result["steps"] = []
    for name in [] if args.no_steps else names:
        t = time.perf_counter()
        try:
            row = run_case(name, args.device, args.steps, args.warmup)
        except Exception as exc:  # noqa: BLE001 - one failing case must not hide the others
            row = {"case": name, "error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
        result["steps"].append(row)
        if "error" in row:
            print(f"{name:<20} error: {row['error']}", flush=True)
        else:
            dev = sum(r["device_us"] for r in row["op_rows"]) / 1e6
            print(f"{name:<20} {row['median_s'] * 1e3:9.2f} ms/step  ops {row['ops']:>5} match={row['ops_match_record']}"
                  f"  kernels {row['busy_us'] / 1e3:8.2f} ms  per-op kernels {dev * 1e3:8.2f} ms  "
                  f"{(row['achieved_tflops'] or 0):7.1f} TFLOP/s  ({time.perf_counter() - t:.1f} s)", flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, separators=(",", ":")))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
