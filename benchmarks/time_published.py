"""The time model against a published figure, and how long estimating takes.

1. torchtitan's published Llama-3.1-8B throughput (pytorch/torchtitan ``docs/performance.md``, Table 1: 1D
   parallelism, FSDP on 8 H100s, local batch 2, sequence 8192, selective activation checkpointing, eager:
   **5,762 tokens/s per GPU**; the text gives 33 % MFU without torch.compile). The same configuration runs through
   ``fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, seq=8192, batch=2, train=True,
   checkpointing=True)`` (full activation checkpointing: fakeviz has no selective policy, so it recomputes more
   than torchtitan did) and timed as ``Simulation.speed`` does: the step from its first forward op (the plan's
   sharding set-up left out), model FLOPs as Note: [model FLOPs] counts them. Their H100s are Grand Teton's:
   96 GB HBM2e at 2.4 TB/s and a 500 W power limit, below the H100 SXM's 3.35 TB/s and 700 W, so the estimate is
   given for the H100 SXM spec and for the same spec with 2.4 TB/s HBM (no figure models the power limit).
2. Estimating time on a Llama-3-70B-shaped forward + backward record (80 layers, bf16, batch 1 x 2048, fake
   cuda:0): the seconds ``trace.step_time`` and ``trace.time`` take, against the seconds recording took.

    python benchmarks/time_published.py [--out benchmarks/results/time_published.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PUBLISHED = {"tokens_per_s_per_gpu": 5762, "mfu": 0.33, "source": "pytorch/torchtitan docs/performance.md, Table 1"}


def torchtitan_8b() -> dict[str, Any]:
    import fakeviz as fv
    from fakeviz._core.gpu_specs import gpu_spec
    from fakeviz._frontends import steps

    t = time.perf_counter()
    sim = fv.plan("meta-llama/Llama-3.1-8B", gpus="8xH100", parallel={"dp_shard": 8}, seq=8192, batch=2,
                  train=True, checkpointing=True)  # fmt: skip
    recorded = time.perf_counter() - t
    speed = sim.speed  # the step from its first forward op (not the plan's sharding set-up), slowest rank
    trace = sim.trace(sim.ranks[0])
    out: dict[str, Any] = {"recorded_s": recorded, "ranks_recorded": sim.ranks, "model_flops": speed.model_flops}
    sxm = gpu_spec("H100")
    teton = dataclasses.replace(sxm, name="H100 (2.4 TB/s HBM2e)", hbm_bytes_per_s=2.4e12)
    for label, spec in (("H100 SXM", sxm), ("H100 at 2.4 TB/s", teton)):
        st = steps.window_time(trace, spec, steps.step_start(trace), gpus_per_node=8)
        tps = speed.tokens / st.step_s / speed.gpus
        mfu = speed.model_flops / (st.step_s * speed.gpus * spec.peak_flops(speed.dtype))
        out[label] = {
            "step_s": st.step_s, "tokens_per_s_per_gpu": tps, "mfu": mfu, "exposed_comm_s": st.exposed_comm_s,
            "ratio_to_published_tps": tps / PUBLISHED["tokens_per_s_per_gpu"], "bound": st.bound,
        }  # fmt: skip
        print(f"{label:<20} step {st.step_s:.3f} s  {tps:7.0f} tokens/s/GPU ({tps / 5762:.2f} x published 5,762)  "
              f"MFU {mfu:.1%} (published 33 %)  exposed comm {st.exposed_comm_s * 1e3:.0f} ms")  # fmt: skip
    assert abs(out["H100 SXM"]["step_s"] - speed.step_s) < 1e-9, "the benchmark times what Simulation.speed does"
    return out


def estimate_speed_70b() -> dict[str, Any]:
    import torch

    import fakeviz as fv
    from fakeviz import models

    t = time.perf_counter()
    with fv.record(device="cuda:0") as trace:
        model = models.build("meta-llama/Meta-Llama-3-70B", dtype=torch.bfloat16)
        ids = models.inputs(model, batch=1, seq=2048)
        model(**ids).logits.float().sum().backward()
    recorded = time.perf_counter() - t
    t = time.perf_counter()
    st = trace.step_time("H100")
    first = time.perf_counter() - t
    t = time.perf_counter()
    trace.time("H100")
    table = time.perf_counter() - t
    print(f"70B fwd+bwd: {trace.num_ops:,} ops recorded in {recorded:.1f} s; step_time {first:.3f} s (features "
          f"included), time() {table:.3f} s; estimated step {st.step_s:.2f} s on one H100")  # fmt: skip
    return {"ops": trace.num_ops, "recorded_s": recorded, "step_time_s": first, "time_table_s": table,
            "ratio_to_recording": (first + table) / recorded, "step_s_h100": st.step_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "time_published.json")
    args = parser.parse_args(argv)
    result = {"published": PUBLISHED, "torchtitan_llama31_8b": torchtitan_8b(), "estimate_70b": estimate_speed_70b()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
