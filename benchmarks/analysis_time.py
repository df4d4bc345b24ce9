"""Analysis time and memory on a Llama-3-70B-shaped fwd+bwd trace (bf16, batch 1, seq 2048, fake cuda:0).

Records the run once (timed), then times every analysis a view needs, each from a
cold trace cache, and reports

  * ratio = total analysis time / recording time of the same run (target <= 0.2),
  * the time of each step as a ratio to the recording time,
  * the memory of the DataFrames the analysis builds (pandas ``memory_usage(deep=True)``),
    against the trace's own columns.

    python benchmarks/analysis_time.py [--layers N] [--seq 2048]

Results are printed and written to benchmarks/results/analysis_time.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _frame_bytes(obj) -> int:
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        return int(obj.memory_usage(deep=True).sum())
    if isinstance(obj, dict):
        return sum(_frame_bytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_frame_bytes(v) for v in obj)
    if hasattr(obj, "top"):  # Peak
        return _frame_bytes(obj.top)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None, help="fewer layers for a quick run")
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()

    import torch

    import fakeviz as fv
    from fakeviz import models

    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    cfg = models.config("llama3-70b", **overrides)

    gc.collect()
    t0 = time.perf_counter()
    with fv.record(device="cuda:0") as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (1, args.seq))
        model(ids, labels=ids).loss.backward()
    t_record = time.perf_counter() - t0
    del model
    gc.collect()

    steps = {
        "ops": lambda: trace.ops,
        "storages": lambda: trace.storages,
        "memory": lambda: trace.memory(),
        "peak": lambda: trace.peak(),
        "modules": lambda: trace.modules,
        "folded_modules": lambda: trace.folded_modules(),
        "tensors": lambda: trace.tensors,
        "alias_graph": lambda: trace.alias_graph(max_nodes=400),
        "fidelity": lambda: trace.fidelity(),
        "flop_coverage": lambda: trace.flop_coverage(),
    }
    trace.clear_memo()
    times: dict[str, float] = {}
    sizes: dict[str, int] = {}
    t_all = time.perf_counter()
    for name, fn in steps.items():
        t = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t
        sizes[name] = _frame_bytes(out)
    total = time.perf_counter() - t_all

    result = {
        "model": f"llama3_70b{' x' + str(args.layers) + ' layers' if args.layers else ''}, bf16, batch 1, "
        f"seq {args.seq}, fwd+bwd, fake cuda:0",
        "ops": trace.num_ops,
        "storages": int(len(trace.storages)),
        "ratio_analysis_to_record": round(total / t_record, 4),
        "target": 0.2,
        "step_ratio_to_record": {k: round(v / t_record, 4) for k, v in times.items()},
        "dataframe_bytes": sizes,
        "dataframe_bytes_total": sum(sizes.values()),
        "trace_bytes": trace.nbytes(),
        "dataframe_bytes_per_op": round(sum(sizes.values()) / max(trace.num_ops, 1), 1),
        "peak": {
            d: {"bytes": p.bytes, "allocated": p.allocated, "reserved": p.reserved, "op": p.op}
            for d, p in trace.peak().items()
        },  # fmt: skip
    }
    print(json.dumps(result, indent=2))
    out = HERE / "results" / "analysis_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
