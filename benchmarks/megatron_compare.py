"""fakeviz's plans next to Megatron-LM's ``get_training_info`` for its four published Llama-2-7B configurations.

Megatron-LM PR #482 (``tools/get_training_info/README.md``, NVIDIA/Megatron-LM) publishes, for Llama-2-7B in bf16 on
one 8 x H800 machine, its estimate against ``torch.cuda.max_memory_allocated()`` after several iterations (GB):

    MBS  GBS   DP  PP  TP   actual  estimated  error
    2    2048  8   1   1    69.1    68.8       0.4 %
    4    512   4   1   2    55.7    55.5       0.4 %
    2    2048  4   2   1    49.8    49.5       0.6 %
    4    128   1   1   8    28.8    28.6       0.7 %

with ``--use-flash-attn --use-distributed-optimizer --swiglu --bf16`` (the README's example runs seq 2048; the table
does not give the sequence length: 2048 is assumed here).

What fakeviz runs for each row is ``fv.plan(parallel=...)``: torchtitan's recipe (FSDP2 over ``dp_shard`` = DP, the
model's own tensor-parallel plan over ``tp`` = TP, pipeline stages over ``pp`` = PP with 1F1B), one training step of
one micro-batch (``batch`` = MBS) in bf16 with AdamW. It is not Megatron's program: Megatron keeps bf16 parameters,
fp32 gradient buffers and fp32 master weights + Adam moments sharded over DP (ZeRO-1, its distributed optimizer);
torchtitan's recipe here shards bf16 parameters, gradients and AdamW moments over DP (ZeRO-3). Gradient
accumulation (GBS / (MBS x DP) micro-batches) does not raise either peak; under 1F1B the first stage holds
min(PP, microbatches) micro-batches (``tests/frontends/test_pipeline_plan.py``), so the pipeline row records 4
microbatches, not GBS / (MBS x DP) = 256. The H800 is an H100 with less NVLink bandwidth: same 80 GB, same sm90
kernels (the catalog's ``H100`` is used). So the table shows each side's own peak for the same model and layout;
the difference is the two programs' difference, not an error of either.

    python benchmarks/megatron_compare.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "megatron_compare.json"
SOURCE = "NVIDIA/Megatron-LM PR #482, tools/get_training_info/README.md (8 x H800, bf16)"
# Llama-2-7B's published config.json (meta-llama/Llama-2-7b-hf)
LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                 tie_word_embeddings=False)  # fmt: skip
ROWS = [  # (MBS, GBS, DP, PP, TP, actual GB, estimated GB, error %)
    (2, 2048, 8, 1, 1, 69.1, 68.8, 0.4),
    (4, 512, 4, 1, 2, 55.7, 55.5, 0.4),
    (2, 2048, 4, 2, 1, 49.8, 49.5, 0.6),
    (4, 128, 1, 1, 8, 28.8, 28.6, 0.7),
]
SEQ = 2048


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seq", type=int, default=SEQ)
    a = ap.parse_args()
    import torch
    from transformers import LlamaConfig

    import fakeviz as fv

    cfg = LlamaConfig(**LLAMA2_7B, dtype=torch.bfloat16)
    rows = []
    for mbs, gbs, dp, pp, tp, actual, est, err in ROWS:
        parallel = {k: v for k, v in (("pp", pp), ("dp_shard", dp), ("tp", tp)) if v > 1}
        extra = {"microbatches": 4, "schedule": "1F1B"} if pp > 1 else {}
        batch = mbs * (4 if pp > 1 else 1)  # a pipeline's batch is split into its microbatches of MBS
        t = time.perf_counter()
        sim = fv.plan(cfg, gpus="8xH100", parallel=parallel, batch=batch, seq=a.seq, train=True, dtype="bf16",
                      **extra)  # fmt: skip
        dt = time.perf_counter() - t
        pk = sim.peaks
        worst = pk.loc[pk.peak.idxmax()]
        ours = int(worst["peak"]) / 1e9
        rows.append({
            "MBS": mbs, "GBS": gbs, "DP": dp, "PP": pp, "TP": tp,
            "megatron_actual_gb": actual, "megatron_estimated_gb": est, "megatron_error_pct": err,
            "fakeviz_peak_gb": round(ours, 1), "fakeviz_peak_rank": int(worst["rank"]),
            "fakeviz_vs_megatron_actual_pct": round(100 * (ours - actual) / actual, 1),
            "fakeviz_by_kind_gb": {k: round(int(worst[k]) / 1e9, 2)
                                   for k in ("weights", "gradients", "optimizer", "activations", "temporaries")},
            "ranks_recorded": len(sim.ranks), "seconds": round(dt, 1), "text": sim.text,
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    out = {"source": SOURCE, "model": "Llama-2-7B (published config.json)", "seq": a.seq, "rows": rows,
           "note": "not the same program: Megatron ZeRO-1 with fp32 main grads and master weights vs torchtitan's "
                   "FSDP2 recipe in bf16; GB = 1e9 bytes (Megatron's table's unit is not stated)"}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
