"""Fine-tuning on one GPU (issue 31): full, LoRA, QLoRA and an 8-bit optimizer, recorded, against the formulas.

For Llama-3.1-8B and Llama-3.1-70B at seq 2048, batch 1, one steady-state training step (``fv.plan(...,
train=True)``: the optimizer's state exists, as from step 2 of a real run) is recorded on one fake GPU for:

* ``full bf16 + AdamW``: every parameter trains, AdamW's two fp32 states;
* ``full bf16 + AdamW8bit``: the same with bitsandbytes' 8-bit AdamW (uint8 states + per-block absmax);
* ``LoRA r=16 bf16``: peft LoRA on every linear layer (``target_modules="all-linear"``), AdamW on the adapters;
* ``QLoRA NF4+dq r=16 + ckpt``: bitsandbytes NF4 base weights (double-quantised, bf16 compute), peft's
  ``prepare_model_for_kbit_training``, LoRA r=16, activation checkpointing and ``paged_adamw8bit``, the QLoRA
  paper's recipe.

Reported per configuration: the peak and its split by category, whether it fits on 24 / 48 / 80 GB (the verdict of
the caching-allocator model on an RTX 4090, an L40S and an H100: the memory their drivers report), and the recording's wall time as a ratio to the full bf16 record of the same model
(measured in the same run). Beside them, accelerate's ``estimate-memory`` figures for the same model (its
formula: bytes per dtype, "training using Adam" only for fp32/fp16) as the peer a user would ask first.

The QLoRA paper's claim (Dettmers et al. 2023: LLaMA-65B fine-tuned on one 48 GB GPU) is checked by running the
65B's published config (``huggyllama/llama-65b``'s config.json, LLaMA paper Table 2) the same way: QLoRA NF4, LoRA
r=64 on all linear layers as the paper did, paged AdamW8bit, checkpointing, batch 1, at seq 512 and 2048.

    python benchmarks/finetune.py [--models 8b,70b,65b] [--layers N] [--out benchmarks/results/finetune.json]

``--layers`` shortens the models (same widths) for a quick look; the quoted figures use the published depths.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import fakeviz as fv

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "finetune.json"
GIB = 2**30

# huggyllama/llama-65b's config.json (the HF conversion of Meta's LLaMA-65B weights); 65.2B in the LLaMA paper
LLAMA_65B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16", "vocab_size": 32000,
    "hidden_size": 8192, "intermediate_size": 22016, "num_hidden_layers": 80, "num_attention_heads": 64,
    "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02,
}  # fmt: skip
MODELS = {"8b": "meta-llama/Llama-3.1-8B", "70b": "meta-llama/Llama-3.1-70B", "65b": LLAMA_65B}
CONFIGS = {
    "full bf16 + AdamW": {"optimizer": "adamw"},
    "full bf16 + AdamW8bit": {"optimizer": "adamw8bit"},
    "LoRA r=16 bf16": {"lora": 16, "optimizer": "adamw"},
    "QLoRA NF4+dq r=16 + ckpt": {
        "quantization": "nf4+dq",
        "lora": 16,
        "checkpointing": True,
        "optimizer": "paged_adamw8bit",
    },
}
# the cards people rent or own for each size (their driver-reported memory, fakeviz._core.gpus), not "24GB" = 24e9
# bytes: an H100's 79.6 GiB holds what 80e9 bytes (74.5 GiB) does not
CAPACITIES = {"24 GB (RTX 4090)": "RTX 4090", "48 GB (L40S)": "L40S", "80 GB (H100)": "H100"}


def _nf4_dq() -> Any:
    """NF4 with double quantization and bf16 compute: the QLoRA paper's storage (BitsAndBytesConfig)."""
    import torch
    import transformers

    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip


def _model(key: str, layers: int | None) -> Any:
    spec = MODELS[key]
    overrides = {"num_hidden_layers": layers} if layers else {}
    return fv.models.config(spec, **overrides)


def one(model: Any, *, seq: int, batch: int = 1, **kw: Any) -> dict[str, Any]:
    """One plan on one 80 GB fake GPU (a single device: nothing is offloaded): its peak, categories, verdicts, time."""
    gc.collect()
    settings = {k: v for k, v in kw.items()}
    if kw.get("quantization") == "nf4+dq":
        kw = {**kw, "quantization": _nf4_dq()}
    t0 = time.perf_counter()
    p = fv.plan(model, gpus="H100", train=True, batch=batch, seq=seq, dtype="bf16", **kw)
    seconds = time.perf_counter() - t0
    peak = p.trace.peak()["cuda:0"]
    row = {
        "settings": settings,
        "seconds": seconds,
        "ops": int(p.trace.num_ops),
        "peak_bytes": int(peak.bytes),
        "allocated_bytes": int(peak.allocated or peak.bytes),
        "by_category": {k: int(v) for k, v in peak.by_category.items() if v},
        "fits": {label: bool(p.trace.verdict(card)["fits"]) for label, card in CAPACITIES.items()},
        "trainable_parameters": int(sum(t.numel() for t in p.module.parameters() if t.requires_grad)),
    }
    del p
    gc.collect()
    return row


def accelerate_estimate(model: Any) -> dict[str, Any]:
    """accelerate's ``estimate-memory`` for the same config: its own functions on a model built on the meta device."""
    import torch
    import transformers
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    cfg = model if not isinstance(model, dict) else fv.models.config(model)
    with init_empty_weights():
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    total, _largest = calculate_maximum_sizes(m)
    train = estimate_training_usage(total, "float16")
    return {
        "fp32_bytes": int(total),
        "fp16_bytes": int(total // 2),
        "int4_bytes": int(total // 8),
        "training_fp16_adam_bytes": int(max(train.values())),
        "training_int4": "not estimated (estimate_training_usage handles float32 and float16 only)",
    }


def fmt_gib(b: int) -> str:
    return f"{b / GIB:8.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="8b,70b,65b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    one(_model("8b", 1), seq=64)  # warm-up, untimed: imports, dispatch caches
    one(_model("8b", 1), seq=64, quantization="nf4+dq", lora=16, checkpointing=True, optimizer="paged_adamw8bit")
    out: dict[str, Any] = {"seq": args.seq, "batch": 1, "layers": args.layers, "models": {}}
    for key in args.models.split(","):
        model = _model(key, args.layers)
        res: dict[str, Any] = {"accelerate": accelerate_estimate(model), "configs": {}}
        if key == "65b":
            for seq in (512, 2048):
                kw = {"quantization": "nf4+dq", "lora": 64, "checkpointing": True, "optimizer": "paged_adamw8bit"}
                res["configs"][f"QLoRA paper recipe seq {seq}"] = one(model, seq=seq, **kw)
        else:
            for label, kw in CONFIGS.items():
                res["configs"][label] = one(model, seq=args.seq, **kw)
            base = res["configs"]["full bf16 + AdamW"]["seconds"]
            for row in res["configs"].values():
                row["seconds_over_full_bf16"] = row["seconds"] / base
        out["models"][key] = res
        print(f"\n{MODELS[key] if isinstance(MODELS[key], str) else 'LLaMA-65B (huggyllama/llama-65b config)'}"
              f"  accelerate: fp16 {fmt_gib(res['accelerate']['fp16_bytes'])} GiB, int4 "
              f"{fmt_gib(res['accelerate']['int4_bytes'])} GiB, fp16 Adam training "
              f"{fmt_gib(res['accelerate']['training_fp16_adam_bytes'])} GiB, int4 training: not estimated")  # fmt: skip
        print(
            f"  {'configuration':28s} {'peak GiB':>9s} {'alloc GiB':>9s}  4090  L40S  H100  {'t/bf16':>6s}  categories (GiB)"
        )
        for label, row in res["configs"].items():
            cats = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sorted(row["by_category"].items(), key=lambda kv: -kv[1]))
            fits = "  ".join(" yes" if row["fits"][c] else "  no" for c in CAPACITIES)  # in CAPACITIES' order
            ratio = row.get("seconds_over_full_bf16")
            print(f"  {label:28s} {fmt_gib(row['peak_bytes'])}  {fmt_gib(row['allocated_bytes'])}  {fits}  "
                  f"{ratio if ratio is None else f'{ratio:6.2f}'}  {cats}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
