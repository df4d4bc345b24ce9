"""How long a LoRA / QLoRA step takes: a real GPU's median against the time model on the fake record (issue 31).

The same steps as ``benchmarks/qlora_gpu.py`` (a Llama with Llama-3.1-8B's widths, few layers): QLoRA (NF4 with
bitsandbytes' own quantization, peft's ``prepare_model_for_kbit_training`` with checkpointing, LoRA r=16 on every
linear layer, bitsandbytes' AdamW8bit) and LoRA in bf16 (no quantization, torch's AdamW), at two sequence lengths.

* ``--real`` (on a GPU): each step after 3 warm-up steps, 10 timed steps, the median (CUDA events), written as JSON.
* default (anywhere): the same step recorded under fake tensors on ``cuda:0`` in a ``FakeSession`` (build and a
  first step in one block, the measured step in a second, as a steady-state step), ``trace.step_time("H100")``,
  compared with the real medians of ``--measured`` (the JSON ``--real`` wrote on the H100).

    python benchmarks/finetune_time.py --real --out benchmarks/results/finetune_time_h100_real.json   # on the GPU
    python benchmarks/finetune_time.py --measured benchmarks/results/finetune_time_h100_real.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import bitsandbytes as bnb  # imported before any fake session, as at the top of a training script
import peft
import torch
import transformers

import fakeviz as fv
from fakeviz.models import _quant

HERE = Path(__file__).resolve().parent
CASES = {"qlora": True, "lora_bf16": False}


def build(cfg: Any, quantized: bool) -> tuple[Any, Any]:
    torch.manual_seed(0)
    with torch.device("cuda:0"):
        model = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    if quantized:
        _quant.apply(model, "nf4")
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = bnb.optim.AdamW8bit(params, lr=1e-4) if quantized else torch.optim.AdamW(params, lr=1e-4)
    return model, opt


def step(model: Any, opt: Any, ids: Any) -> None:
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def real(cfg: Any, seqs: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "bitsandbytes": bnb.__version__, "peft": peft.__version__, "cases": {}}  # fmt: skip
    for case, quantized in CASES.items():
        model, opt = build(cfg, quantized)
        for seq in seqs:
            ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda:0")
            for _ in range(3):
                step(model, opt, ids)
            times = []
            for _ in range(10):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step(model, opt, ids)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            out["cases"][f"{case} seq {seq}"] = {"median_s": statistics.median(times), "times_s": times}
            print(case, seq, f"{statistics.median(times) * 1e3:.2f} ms", flush=True)
        del model, opt
        torch.cuda.empty_cache()
    return out


def fake(cfg: Any, seqs: list[int], gpu: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, quantized in CASES.items():
        for seq in seqs:
            session = fv.FakeSession()
            with fv.record(session=session, device="cuda:0"):
                model, opt = build(cfg, quantized)
                ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda:0")
                step(model, opt, ids)
            t0 = time.perf_counter()
            with fv.record(session=session, device="cuda:0") as trace:
                step(model, opt, ids)
            recorded = time.perf_counter() - t0
            st = trace.step_time(gpu)
            out[f"{case} seq {seq}"] = {"estimate_s": float(st.step_s), "gpu_s": float(st.gpu_s),
                                        "host_s": float(st.host_s), "bound": st.bound, "record_s": recorded,
                                        "by_class_s": {k: float(v) for k, v in st.by_class.items() if v > 0}}  # fmt: skip
            del model, opt, session
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--measured", type=Path, default=HERE / "results" / "finetune_time_h100_real.json")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    cfg = fv.models.config("meta-llama/Llama-3.1-8B", num_hidden_layers=a.layers)
    if a.real:
        res = real(cfg, a.seq)
        (a.out or a.measured).write_text(json.dumps(res, indent=1))
        return 0
    measured = json.loads(a.measured.read_text())
    est = fake(cfg, a.seq, "H100")
    rows = {}
    for key, e in est.items():
        m = measured["cases"][key]["median_s"]
        rows[key] = {**e, "measured_s": m, "error": e["estimate_s"] / m - 1}
        print(f"{key:22s} measured {m * 1e3:8.2f} ms  estimate {e['estimate_s'] * 1e3:8.2f} ms  "
              f"error {rows[key]['error']:+6.1%}")  # fmt: skip
    out = a.out or HERE / "results" / "finetune_time.json"
    out.write_text(json.dumps({"gpu": measured["device"], "layers": a.layers, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
