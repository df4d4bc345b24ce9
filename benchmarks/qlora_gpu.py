"""A QLoRA step on a real GPU next to its fake twin (issue 31): the peak ``torch.cuda.max_memory_allocated`` of the
step against the fake record's peak on fake cuda (live storage bytes and the caching-allocator model), for a 4-layer
Llama-3.1-8B-shaped model in NF4 (bitsandbytes' own quantization and kernels), peft's
``prepare_model_for_kbit_training`` with activation checkpointing, LoRA r=16 on every linear layer, bitsandbytes'
AdamW8bit. Needs a CUDA build that sees a GPU, bitsandbytes and peft.

    python benchmarks/qlora_gpu.py [--layers 4] [--seq 2048 512] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import bitsandbytes as bnb  # imported before any fake session, as at the top of a training script
import peft
import torch
import transformers

import fakeviz as fv
from fakeviz.models import _quant


def step(cfg: Any, seq: int, device: str, mark: Any) -> None:
    """Build, quantize, prepare and train one step on ``device``; ``mark()`` is called when the step starts."""
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    _quant.apply(model, "nf4")
    model = peft.prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    opt = bnb.optim.AdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    mark()
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def real(cfg: Any, seq: int) -> dict[str, Any]:
    def mark() -> None:
        torch.cuda.synchronize()
        out["start_bytes"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    out: dict[str, Any] = {}
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    step(cfg, seq, "cuda", mark)
    torch.cuda.synchronize()
    out.update(seconds=time.perf_counter() - t0, peak_bytes=torch.cuda.max_memory_allocated() - base,
               start_bytes=out["start_bytes"] - base)  # fmt: skip
    return out


def fake(cfg: Any, seq: int) -> dict[str, Any]:
    n0 = {}
    t0 = time.perf_counter()
    with fv.record(device="cuda:0") as t:
        step(cfg, seq, "cuda", lambda: n0.setdefault("ops", len(t.ops)))
    assert t.error is None, t.error
    live = t.live_bytes()["cuda:0"]
    mem = t.memory(device="cuda:0")
    start = int(n0["ops"])
    col = "allocated" if "allocated" in mem.columns else None
    return {
        "seconds": time.perf_counter() - t0,
        "peak_bytes": int(live[start:].max()),
        "start_bytes": int(live[start - 1]) if start else 0,
        "allocator_peak_bytes": int(mem[col].iloc[start:].max()) if col else None,
        "assumptions": len(t.fidelity()["assumptions"]),
        "ops": t.num_ops,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 512])
    ap.add_argument("--out", default=None)
    ap.add_argument("--fake-only", action="store_true")
    a = ap.parse_args()
    cfg = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=a.layers)
    rows = []
    for seq in a.seq:
        row: dict[str, Any] = {"layers": a.layers, "seq": seq, "fake": fake(cfg, seq)}
        if not a.fake_only:
            row["real"] = real(cfg, seq)
            row["fake_over_real"] = row["fake"]["peak_bytes"] / row["real"]["peak_bytes"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "rows": rows}, f,
                      indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
