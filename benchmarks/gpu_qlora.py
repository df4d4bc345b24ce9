"""A QLoRA training step on a real GPU against its fake twin (issue 31): fake peak vs ``max_memory_allocated``.

A 4-layer Llama with Llama-3.1-8B's widths is built in bf16, quantized to NF4 (double-quantised, bf16 compute) by
fakeviz's ``models._quant.apply`` (bitsandbytes' own modules and quantize op), prepared by peft's
``prepare_model_for_kbit_training`` (checkpointing on), given LoRA r=16 on every linear layer by ``get_peft_model``,
and an optimizer with its state (a first step on zero gradients). Then one training step (forward with labels,
backward, ``opt.step``) is measured:

* real: on the GPU, ``torch.cuda.max_memory_allocated()`` over the step minus what was allocated before it;
* fake: the same code in a ``fv.FakeSession`` on ``cuda:0`` (the build, the optimizer's state and a warm-up step in
  a first block, the step in a second), and the caching-allocator model's allocated peak of the step's block minus
  what the block started with (the carried storages). Also reported: the real bytes held before the step against
  the fake carried bytes (the difference is cuBLAS's workspace and anything else the record cannot see).

Cases: AdamW (fp32 states of the adapters) and bitsandbytes' AdamW8bit. The paged AdamW8bit is left out: its state
is CUDA unified memory, which the caching allocator does not count, so ``max_memory_allocated`` cannot check it.

    python benchmarks/gpu_qlora.py [--layers 4] [--seq 1024] [--out benchmarks/results/gpu_qlora.json]

Needs a CUDA GPU and bitsandbytes with its CUDA library (the device run carries one on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "gpu_qlora.json"


def build(layers: int, optimizer: str) -> tuple[Any, Any, Any]:
    """The QLoRA model and its optimizer with state, built on whatever the current device and mode say."""
    import peft
    import torch
    import transformers

    import fakeviz as fv
    from fakeviz._frontends import steps
    from fakeviz.models import _quant

    cfg = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=layers)
    torch.manual_seed(0)
    with torch.device("cuda:0"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    _quant.apply(model, "nf4")
    model = peft.prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    lcfg = peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    opt = steps.make_optimizer(optimizer, model)
    steps.init_state(opt)
    return model, opt, cfg


def step(model: Any, opt: Any, vocab: int, seq: int) -> None:
    import torch

    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (1, seq), device="cuda:0")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def settle() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def real_case(layers: int, seq: int, optimizer: str) -> dict[str, Any]:
    import torch

    model, opt, cfg = build(layers, optimizer)
    step(model, opt, cfg.vocab_size, seq)  # warm-up: cuBLAS workspaces, autograd's buffers
    settle()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    step(model, opt, cfg.vocab_size, seq)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated()
    after = torch.cuda.memory_allocated()
    del model, opt
    settle()
    return {"before": before, "peak": peak, "peak_over_before": peak - before, "after": after, "seconds": seconds}


def fake_case(layers: int, seq: int, optimizer: str) -> dict[str, Any]:
    import torch

    import fakeviz as fv
    from fakeviz._analysis.allocator import simulate_trace

    before = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
    session = fv.FakeSession()
    t = time.perf_counter()
    with fv.record(session=session, device="cuda:0"):
        model, opt, cfg = build(layers, optimizer)
        step(model, opt, cfg.vocab_size, seq)  # as the real run's warm-up
    with fv.record(session=session, device="cuda:0") as trace:
        step(model, opt, cfg.vocab_size, seq)
    seconds = time.perf_counter() - t
    run = simulate_trace(trace, "cuda:0")
    peak = trace.peak()["cuda:0"]
    carried = int(run.block_size[run.alloc_seq == -1].sum())  # the storages the block started with (carried)
    out = {
        "ops": trace.num_ops,
        "peak_allocated_model": int(run.peak_allocated),
        "peak_over_carried": int(run.peak_allocated) - carried,
        "peak_raw": int(peak.bytes),
        "carried_allocated": carried,
        "by_category": {k: int(v) for k, v in peak.by_category.items() if v},
        "seconds": seconds,
        "real_allocator_untouched": torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0) == before,
        "incomplete": trace.error is not None,
    }
    del model, opt, session
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--optimizers", default="adamw,adamw8bit")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    import bitsandbytes
    import peft
    import torch
    import transformers

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": transformers.__version__,
        "bitsandbytes": bitsandbytes.__version__, "peft": peft.__version__, "layers": args.layers, "seq": args.seq,
        "cases": {},
    }  # fmt: skip
    for optimizer in args.optimizers.split(","):
        row: dict[str, Any] = {}
        try:
            row["real"] = real_case(args.layers, args.seq, optimizer)
        except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
            row["real"] = {"error": f"{type(exc).__name__}: {str(exc)[:800]}"}
        try:
            row["fake"] = fake_case(args.layers, args.seq, optimizer)
        except Exception as exc:  # noqa: BLE001
            row["fake"] = {"error": f"{type(exc).__name__}: {str(exc)[:800]}"}
        real, fake = row["real"], row["fake"]
        if "error" not in real and "error" not in fake:
            # the step's own peak over what it started with: the real "before" also holds cuBLAS's workspace,
            # which the fake record does not see (gpu_accuracy.py subtracts it the same way)
            row["rel_error_step_peak"] = (fake["peak_over_carried"] - real["peak_over_before"]) / real[
                "peak_over_before"
            ]
            row["before_real_minus_carried_fake"] = real["before"] - fake["carried_allocated"]
        out["cases"][optimizer] = row
        print(optimizer, json.dumps(row, indent=1, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
