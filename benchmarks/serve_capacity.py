"""Serving capacity (issue 33): ``fv.serve`` for a few catalog models on one H100 80 GB, against a formula peer and
against vLLM's own published start-up log lines.

* ``h100``: Llama-3.1-8B, Qwen2.5-7B, Gemma-2-9B, Gemma-3-1B, Mistral-7B-v0.1 on 1 x H100 at
  ``gpu_memory_utilization=0.9``, ``max_model_len=8192`` and ``vllm serve``'s defaults (8192 batched tokens, 1024
  sequences): our KV blocks, tokens and maximum concurrency (vLLM's arithmetic on the recorded profile run), and what
  a formula peer gives: ``(0.9 x capacity - weights)`` over the KV bytes of full attention on every layer (no profile
  activation, no sliding windows, no hybrid groups).
* ``published``: vLLM's own log lines for Llama-3.1-8B-Instruct on an RTX 3090 (vllm-project/vllm issue #10517,
  V0 engine, Dec 2024: chunked prefill off below 32k, so its profile run is ``max_model_len`` tokens as 256 sequences):
  "Loading model weights took 14.9888 GB", "peak_torch_memory", "non_torch_memory", "# GPU blocks", "Maximum
  concurrency". Our profile run is recorded with the same tokens and sequences; the KV figures are given both on our
  RTX 3090 capacity and on vLLM's reported ``total_gpu_memory`` with its measured non-torch memory added.
* ``hybrid``: Jamba-v0.1 (AI21's published config.json, transformers' ``JambaConfig()`` defaults: 4 attention and 28
  Mamba layers, 51.6 B parameters) on 1 x H200 (its bf16 weights do not fit an 80 GB H100) at ``max_model_len``
  8,192 and its whole 262,144-token context: vLLM keeps a Mamba layer's state fixed (Note: [vLLM's Mamba state
  pages]), the formula peer counts every layer's KV as growing with the context. Besides the peer on its own budget,
  the peer's concurrency on our KV budget isolates the state's effect from the profile run's.

    python benchmarks/serve_capacity.py [--part h100|published|hybrid|all] [--out PATH]

Results: ``benchmarks/results/serve_capacity.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import fakeviz as fv
from fakeviz._analysis import kv_blocks

OUT = Path(__file__).resolve().parent / "results" / "serve_capacity.json"
GIB = 1 << 30
MODELS = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "google/gemma-2-9b", "google/gemma-3-1b-pt",
          "mistralai/Mistral-7B-v0.1")  # fmt: skip

# vllm-project/vllm#10517 (RTX 3090, meta-llama/Llama-3.1-8B-Instruct, gpu_memory_utilization 0.90, block 16)
PUBLISHED = {
    "source": "https://github.com/vllm-project/vllm/issues/10517 (vLLM V0, Dec 2024)",
    "total_gpu_memory_gib": 23.58, "weights_gib": 14.9888, "non_torch_gib": 0.35,
    "runs": [
        {"max_model_len": 20000, "peak_torch_gib": 17.06, "kv_cache_gib": 3.81, "gpu_blocks": 1952,
         "max_concurrency": 1.56},
        {"max_model_len": 29000, "peak_torch_gib": 17.98, "kv_cache_gib": 2.89, "gpu_blocks": 1478,
         "max_concurrency": 0.82},
    ],
}  # fmt: skip


def formula_peer(name: str, capacity: int, weights: int, *, util: float, max_model_len: int, dtype_bytes: int,
                 block_size: int = 16) -> dict[str, Any]:  # fmt: skip
    """What a weights-plus-KV formula gives: every layer full attention, nothing for the profile run (``name``: a
    catalog name or a transformers config)."""
    c = fv.models.config(name) if isinstance(name, str) else name
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    kv = c.num_key_value_heads or c.num_attention_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_block = 2 * c.num_hidden_layers * kv * hd * block_size * dtype_bytes
    avail = util * capacity - weights
    blocks = max(int(avail // per_block), 0)
    return {"kv_blocks": blocks, "kv_tokens": blocks * block_size,
            "max_concurrency": blocks * block_size / max_model_len}  # fmt: skip


def h100() -> list[dict[str, Any]]:
    rows = []
    for name in MODELS:
        t0 = time.perf_counter()
        s = fv.serve(name, "1xH100", max_model_len=8192, gpu_memory_utilization=0.9)
        dt = time.perf_counter() - t0
        d = s.to_dict()
        kv_bytes = 2 if d["kv_cache_dtype"] == "auto" and d["dtype"] in ("bfloat16", "float16") else 4
        peer = formula_peer(name, s.gpu.bytes, s.weights, util=0.9, max_model_len=8192, dtype_bytes=kv_bytes)
        rows.append({
            "model": name, "seconds": round(dt, 2), "dtype": d["dtype"], "layer_kinds": d["layer_kinds"],
            "kv_groups": d["kv_groups"], "weights_gib": s.weights / GIB, "profile_peak_gib": s.profile_peak / GIB,
            "available_kv_gib": s.available_kv / GIB, "kv_bytes_per_block": s.kv_bytes_per_block,
            "kv_blocks": s.kv_blocks, "kv_tokens": s.kv_tokens, "max_concurrency": round(s.max_concurrency, 2),
            "max_context": s.max_context, "fits": s.fits,
            "peer_kv_blocks_16_tokens": peer["kv_blocks"], "peer_kv_tokens": peer["kv_tokens"],
            "peer_max_concurrency": round(peer["max_concurrency"], 2),
            "peer_over_ours_concurrency": round(peer["max_concurrency"] / s.max_concurrency, 3),
        })  # fmt: skip
        print(f"{name}: ours {s.max_concurrency:.2f}x ({s.kv_tokens:,} tokens, profile peak "
              f"{s.profile_peak / GIB:.2f} GiB) vs peer {peer['max_concurrency']:.2f}x, {dt:.1f} s", flush=True)  # fmt: skip
    return rows


def jamba_config() -> Any:
    """Jamba-v0.1's published config.json (ai21labs/Jamba-v0.1): transformers' ``JambaConfig()`` defaults."""
    from transformers import JambaConfig

    c = JambaConfig()
    c._name_or_path = "ai21labs/Jamba-v0.1"
    return c


def hybrid() -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    c = jamba_config()
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(c).parameters())
    rows = []
    for n in (8192, 262144):
        t0 = time.perf_counter()
        s = fv.serve(c, "1xH200", max_model_len=n, gpu_memory_utilization=0.9)
        dt = time.perf_counter() - t0
        d = s.to_dict()
        peer = formula_peer(c, s.gpu.bytes, s.weights, util=0.9, max_model_len=n, dtype_bytes=2)
        kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2
        peer_on_ours = s.available_kv / kv_per_token / n
        mamba = next(g.spec for g in s.layout.groups if g.spec.kind == "mamba")
        rows.append({
            "model": "ai21labs/Jamba-v0.1", "parameters": params, "parameters_published": "51.6B (ai21labs/Jamba-v0.1)",
            "gpu": "1xH200", "max_model_len": n, "seconds": round(dt, 2), "dtype": d["dtype"],
            "layer_kinds": d["layer_kinds"], "kv_groups": d["kv_groups"], "kv_block_size": d["kv_block_size"],
            "mamba_state_bytes": mamba.state_bytes, "mamba_page_bytes": mamba.page_bytes,
            "weights_gib": s.weights / GIB, "profile_peak_gib": s.profile_peak / GIB,
            "available_kv_gib": s.available_kv / GIB, "kv_bytes_per_block": s.kv_bytes_per_block,
            "kv_blocks": s.kv_blocks, "kv_tokens": s.kv_tokens, "max_concurrency": round(s.max_concurrency, 2),
            "max_context": s.max_context, "fits": s.fits,
            "peer_max_concurrency": round(peer["max_concurrency"], 2),
            "peer_over_ours_concurrency": round(peer["max_concurrency"] / s.max_concurrency, 3),
            "peer_on_our_kv_budget_max_concurrency": round(peer_on_ours, 2),
            "peer_on_our_kv_budget_over_ours": round(peer_on_ours / s.max_concurrency, 3),
        })  # fmt: skip
        print(f"Jamba-v0.1 {n}: ours {s.max_concurrency:.2f}x (block {d['kv_block_size']}, profile peak "
              f"{s.profile_peak / GIB:.2f} GiB) vs peer {peer['max_concurrency']:.2f}x, peer on our budget "
              f"{peer_on_ours:.2f}x, {dt:.1f} s", flush=True)  # fmt: skip
    return rows


def published() -> dict[str, Any]:
    p = PUBLISHED
    out = {"source": p["source"], "runs": []}
    for run in p["runs"]:
        n = run["max_model_len"]
        s = fv.serve("meta-llama/Llama-3.1-8B", "RTX 3090", max_model_len=n, gpu_memory_utilization=0.9,
                     max_num_batched_tokens=n, max_num_seqs=256)  # fmt: skip
        vllm_peak = (run["peak_torch_gib"] - p["weights_gib"]) * GIB  # V0's peak_torch_memory includes the weights
        # on vLLM's reported total and with its measured non-torch memory: only the profile runs and weights differ
        avail = math.ceil(p["total_gpu_memory_gib"] * GIB * 0.9) - s.weights - s.profile_peak - p["non_torch_gib"] * GIB
        blocks = s.layout.blocks(int(avail))
        out["runs"].append({
            "max_model_len": n,
            "vllm_weights_gib": p["weights_gib"], "ours_weights_gib": s.weights / GIB,
            "vllm_profile_peak_gib": vllm_peak / GIB, "ours_profile_peak_gib": s.profile_peak / GIB,
            "ours_over_vllm_profile_peak": round(s.profile_peak / vllm_peak, 3),
            "vllm_gpu_blocks": run["gpu_blocks"], "vllm_kv_cache_gib": run["kv_cache_gib"],
            "vllm_max_concurrency": run["max_concurrency"],
            "ours_gpu_blocks_on_our_rtx3090": s.kv_blocks, "ours_max_concurrency_on_our_rtx3090": round(s.max_concurrency, 2),
            "ours_capacity_gib": s.gpu.bytes / GIB,
            "ours_gpu_blocks_on_vllms_total_with_its_non_torch": blocks,
            "ours_max_concurrency_on_vllms_total_with_its_non_torch": round(blocks / s.layout.blocks_per_request(), 2),
            "ours_over_vllm_blocks": round(blocks / run["gpu_blocks"], 3),
        })  # fmt: skip
        r = out["runs"][-1]
        print(f"published {n}: vLLM peak {r['vllm_profile_peak_gib']:.2f} GiB, ours {r['ours_profile_peak_gib']:.2f}; "
              f"vLLM {run['gpu_blocks']} blocks, ours {blocks} on vLLM's total", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("h100", "published", "hybrid", "all"), default="all")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    res: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    res["vllm_followed"] = (
        "vllm-project/vllm 001cabc1be16 (V1: kv_cache_utils.py, kv_cache_interface.py, gpu_worker.py); Mamba state "
        "shapes: mamba_utils.py (02d710837549), the hybrid block: Platform._align_hybrid_block_size"
    )
    res["note"] = (
        kv_blocks.__name__
        + ": Note: [vLLM's KV cache blocks], Note: [vLLM's Mamba state pages]; fakeviz._frontends.serving: "
        "Note: [vLLM's memory profile]"
    )
    if args.part in ("h100", "all"):
        res["h100"] = h100()
    if args.part in ("published", "all"):
        res["published"] = published()
    if args.part in ("hybrid", "all"):
        res["hybrid"] = hybrid()
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
