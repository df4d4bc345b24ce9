"""Accuracy of the allocator model against PyTorch's real CUDA caching allocator.

Runs each model of ``tests/zoo.py``, plus two wider models defined here whose
tensors reach the large pool (``wide_mlp``: 64 MiB weights, 8 MiB activations,
AdamW; ``conv_large``: convolutions with cuDNN workspaces), for real on
``cuda:0`` (one training step: build, forward, loss, backward, optional
optimizer step) inside
``fv.record(fake=False, device="cuda:0")``, and compares the peaks that
``torch.cuda.memory_stats()`` reports with the ones the model
(``fakeviz._analysis.allocator.replay_trace``) computes from the recorded trace:

* ``requested_bytes.all.peak``: raw bytes asked for; checks the *record*
  (which storages exist when), independently of the allocator model;
* ``allocated_bytes.all.peak``: blocks after rounding and unsplit remainders;
* ``reserved_bytes.all.peak``: ``cudaMalloc``-ed segments.

Before each case the model runs once unrecorded (warm-up: cuBLAS/cuBLASLt
handles and their workspaces, cuDNN, lazy kernels), everything is deleted, the
cache emptied and the peaks reset. What stays allocated after that warm-up
(typically the cuBLAS workspace of the current handle and stream, which
PyTorch allocates through the caching allocator and keeps) is invisible to the
record; it is reported as ``baseline_*`` and subtracted from the real peaks
before comparing (``*_net``). Not modelled and still inside the real peaks:
per-op workspaces allocated and freed inside an op (cuDNN convolution
workspaces, some reductions), new workspaces for other streams or handles,
and placement effects of the baseline segments (the real allocator may pack
small tensors into the free part of a baseline segment, so ``reserved`` can
grow less than the model says).

Each case is then recorded a second time under fake tensors on ``cuda:0``
(``fv.record(device="cuda:0")``: no memory, no kernels) and the same model
runs on that fake trace: the *fake peak* column compares what a user gets
without the GPU against ``torch.cuda.max_memory_allocated()`` (and the
reserved and requested peaks) of the real run, net of the baseline.

Two transformers cases at sizes whose tensors reach the large pool answer
issue 14's question whether reserved really runs 24-28 % above allocated for
MoE and GPT-NeoX: ``gpt_neox`` (GPTNeoXForCausalLM, 4 layers of width 1024,
batch 4 x 512, fp32, AdamW) and ``mixtral_bf16`` (MixtralForCausalLM, 2 layers
of width 1024, 8 experts top-2, batch 4 x 512, bf16, fwd+bwd).

Results are printed and written to ``benchmarks/results/gpu_accuracy.json``.
Without a CUDA device the script says so and exits with status 0.

    python benchmarks/gpu_accuracy.py [--cases mlp,gpt2_tied] [--history]
        [--cublas-workspace-config :4096:8]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "results" / "gpu_accuracy.json"

NOT_MODELLED = [
    "per-op workspaces allocated inside an op (cuDNN convolution workspaces and the like): in the real peaks only",
    "cuBLAS/cuBLASLt workspaces: measured as baseline after a warm-up run and subtracted; new ones made during "
    "the recorded run (other streams/handles) stay in the real peaks",
    "CUDA context, kernels and library handles: outside the caching allocator, in neither number",
    "other streams, record_stream, CUDA graphs, PYTORCH_CUDA_ALLOC_CONF options, expandable segments",
    "real device addresses: best-fit ties between equal-size free blocks may break differently",
]


def _rel(model: int, real: int) -> float | None:
    """Relative error of the model against the real value (None when the real value is 0)."""
    return None if real == 0 else (model - real) / real


def _fmt(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def _settle() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _wide_mlp() -> Any:
    """Two 2048 -> 8192 -> 2048 MLP blocks, batch 256, one AdamW step: all three size classes."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)) for _ in range(2)))
    x = torch.randn(256, 2048)
    loss = model(x).square().mean()
    loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, loss


def _conv_large() -> Any:
    """A small conv net on 32 x 3 x 128 x 128 images: cuDNN picks algorithms with workspaces."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    x = torch.randn(32, 3, 128, 128)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,)))
    loss.backward()
    return model, loss


def _hf_lm(kind: str) -> Any:
    """A transformers causal LM from a config (no download), one training step on batch 4 x 512."""
    import torch
    import transformers

    torch.manual_seed(0)
    common = {"vocab_size": 8192, "hidden_size": 1024, "num_attention_heads": 8, "attn_implementation": "eager"}
    if kind == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(num_hidden_layers=4, intermediate_size=4096, hidden_dropout=0.0,
                                         attention_dropout=0.0, **common)  # fmt: skip
        model, dtype, step = transformers.GPTNeoXForCausalLM(cfg), torch.float32, True
    else:
        cfg = transformers.MixtralConfig(num_hidden_layers=2, intermediate_size=2048, num_key_value_heads=4,
                                         num_local_experts=8, num_experts_per_tok=2, **common)  # fmt: skip
        model, dtype, step = transformers.MixtralForCausalLM(cfg).to(torch.bfloat16), torch.bfloat16, False
    torch.manual_seed(1)
    ids = torch.randint(0, 8192, (4, 512))
    loss = model(ids, labels=ids).loss
    loss.backward()
    if step:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert next(model.parameters()).dtype == dtype
    return model, loss


def _full_width(kind: str) -> Any:
    """4 layers of a published model at full width in bf16, fwd+bwd on batch 1 x 2048 (fits an H200).

    ``mixtral_full_width``: Mixtral-8x7B-v0.1's layer (hidden 4096, 8 experts of 14336, top-2, GQA 32/8);
    ``gpt_neox_full_width``: GPT-NeoX-20B's layer (hidden 6144, 64 heads, MLP 24576). Not in the default
    set (``--cases`` names them): they are the sizes at which the allocator model showed reserved memory
    24-28 % above allocated.
    """
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                                         num_local_experts=8, num_experts_per_tok=2, attn_implementation="eager")  # fmt: skip
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.GPTNeoXConfig(vocab_size=50432, hidden_size=6144, intermediate_size=24576,
                                         num_hidden_layers=4, num_attention_heads=64, rotary_pct=0.25,
                                         hidden_dropout=0.0, attention_dropout=0.0, attn_implementation="eager")  # fmt: skip
        model = transformers.GPTNeoXForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, 2048))
    loss = model(ids, labels=ids).loss
    loss.backward()
    return model, loss


FULL_WIDTH_CASES: dict[str, Callable[[], Any]] = {
    "mixtral_full_width": functools.partial(_full_width, "mixtral"),
    "gpt_neox_full_width": functools.partial(_full_width, "gpt_neox"),
}

EXTRA_CASES: dict[str, Callable[[], Any]] = {
    "wide_mlp": _wide_mlp,
    "conv_large": _conv_large,
    "gpt_neox": functools.partial(_hf_lm, "gpt_neox"),
    "mixtral_bf16": functools.partial(_hf_lm, "mixtral"),
}


def run_case(name: str, step: Callable[[], Any], *, history: bool) -> dict[str, Any]:
    """One case: warm-up, baseline, recorded real run, model; returns the comparison row."""
    import torch

    import fakeviz as fv
    from fakeviz._analysis.allocator import replay_trace

    with torch.device("cuda:0"):
        kept = step()  # warm-up, not recorded
    del kept
    _settle()
    stats0 = torch.cuda.memory_stats()
    baseline = {k: int(stats0.get(f"{k}_bytes.all.current", 0)) for k in ("allocated", "reserved", "requested")}
    torch.cuda.reset_peak_memory_stats()
    if history:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    t = time.perf_counter()
    with fv.record(fake=False, device="cuda:0") as trace:
        kept = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    real_oplog = trace.oplog_lines()
    stats = torch.cuda.memory_stats()
    real_snapshot = torch.cuda.memory._snapshot() if history else None
    if history:
        torch.cuda.memory._record_memory_history(enabled=None)
    del kept
    _settle()

    run = replay_trace(trace, "cuda:0")
    row: dict[str, Any] = {
        "case": name,
        "ops": trace.num_ops,
        "storages_cuda": int(len(run.storage)),
        "seconds_recorded_run": round(seconds, 3),
        "baseline": baseline,
    }
    model = {"requested": run.peak_requested, "allocated": run.peak_allocated, "reserved": run.peak_reserved}
    for key in ("requested", "allocated", "reserved"):
        real = int(stats.get(f"{key}_bytes.all.peak", 0))
        net = real - baseline[key]
        row[key] = {
            "real_peak": real,
            "real_peak_net": net,
            "model_peak": model[key],
            "rel_error_net": _rel(model[key], net),
            "rel_error_raw": _rel(model[key], real),
        }
    row["model_peak_allocated_seq"] = run.peak_allocated_seq
    row["real_reserved_over_allocated"] = _ratio(row["reserved"]["real_peak_net"], row["allocated"]["real_peak_net"])
    row["model_reserved_over_allocated"] = _ratio(run.peak_reserved, run.peak_allocated)
    row["fake"] = fake_twin(step, row)
    row["oplogs"] = {"real": real_oplog, "fake": row.pop("_fake_oplog", None)}  # None: the fake twin failed
    row["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
    if real_snapshot is not None:
        events = real_snapshot["device_traces"][0] if real_snapshot["device_traces"] else []
        row["history"] = {
            "real_allocs": sum(e["action"] == "alloc" for e in events),
            "model_allocs": sum(e[0] == "alloc" for e in run.events),
            "real_segment_allocs": sum(e["action"] == "segment_alloc" for e in events),
            "model_segment_allocs": sum(e[0] == "segment_alloc" for e in run.events),
            "real_segment_bytes": sum(e["size"] for e in events if e["action"] == "segment_alloc"),
            "model_segment_bytes": sum(e[4] for e in run.events if e[0] == "segment_alloc"),
            "unmodelled_allocs": _unmodelled(events, run.events),
        }
    return row


def _unmodelled(real_events: list[dict[str, Any]], model_events: list[tuple[Any, ...]], top: int = 12) -> list[Any]:
    """The largest real allocations whose size the model never allocates as often: size, count, and the frames
    (Python and C++, innermost first) of one example, so a reader can name the op that allocated them."""
    from collections import Counter

    from fakeviz._analysis.allocator import round_size

    real = Counter(e["size"] for e in real_events if e["action"] == "alloc")  # block sizes (rounded)
    model = Counter(round_size(e[4]) for e in model_events if e[0] == "alloc")  # requested: round the same way
    extra = real - model
    out = []
    for size in sorted(extra, reverse=True)[:top]:
        example = next(e for e in real_events if e["action"] == "alloc" and e["size"] == size)
        frames = [
            f"{f.get('name')} {Path(str(f.get('filename'))).name}:{f.get('line')}" for f in example.get("frames", [])
        ]
        out.append({"size": size, "count": extra[size], "frames": frames[:40]})
    return out


def _ratio(a: int, b: int) -> float | None:
    return None if not b else a / b


def fake_twin(step: Callable[[], Any], row: dict[str, Any]) -> dict[str, Any]:
    """Record ``step`` under fake tensors on cuda:0 and compare its modelled peaks with the real run's.

    The fake run allocates no device memory, so the real allocator's counters must not move (checked).
    """
    import torch

    import fakeviz as fv
    from fakeviz._analysis.allocator import replay_trace

    before = torch.cuda.memory_stats()
    t = time.perf_counter()
    try:
        with fv.record(device="cuda:0") as trace:
            kept = step()
        del kept
    except Exception as exc:  # noqa: BLE001 - reported in the row, the real comparison still stands
        return {"error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    seconds = time.perf_counter() - t
    after = torch.cuda.memory_stats()
    run = replay_trace(trace, "cuda:0")
    row["_fake_oplog"] = trace.oplog_lines()
    out: dict[str, Any] = {
        "ops": trace.num_ops,
        "ops_equal_real": trace.num_ops == row["ops"],
        "seconds": round(seconds, 3),
        "ratio_to_real_recorded_run": round(seconds / row["seconds_recorded_run"], 3),
        "real_allocator_untouched": after.get("allocated_bytes.all.allocated", 0)
        == before.get("allocated_bytes.all.allocated", 0),
    }
    model = {"requested": run.peak_requested, "allocated": run.peak_allocated, "reserved": run.peak_reserved}
    for key in ("requested", "allocated", "reserved"):
        real = row[key]["real_peak_net"]
        out[key] = {"fake_peak": model[key], "real_peak_net": real, "rel_error_net": _rel(model[key], real)}
    out["reserved_over_allocated"] = _ratio(run.peak_reserved, run.peak_allocated)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated zoo case names (default: all)")
    parser.add_argument(
        "--history", action="store_true", help="also record the real allocator's history and compare event counts"
    )
    parser.add_argument(
        "--cublas-workspace-config",
        default=None,
        help="set CUBLAS_WORKSPACE_CONFIG before CUDA starts (e.g. ':4096:8'); default: leave it as is",
    )
    parser.add_argument(
        "--oplogs",
        type=Path,
        default=None,
        help="write every case's real and fake op logs and peaks to this JSON file (the golden fixture "
        "tests/fixtures/h200_golden.json that tests/engine/test_gpu_golden.py checks on CPU)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON output (default: {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    if args.cublas_workspace_config is not None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = args.cublas_workspace_config

    import torch

    if not torch.cuda.is_available():
        print("gpu_accuracy: no CUDA device available (torch.cuda.is_available() is False); nothing to compare.")
        return 0

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    import zoo

    cases: dict[str, Callable[[], Any]] = {name: functools.partial(zoo.run, name) for name in zoo.ZOO}
    cases.update(EXTRA_CASES)
    default = list(cases)
    cases.update(FULL_WIDTH_CASES)
    names = [c for c in args.cases.split(",") if c] or default
    unknown = sorted(set(names) - set(cases))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(cases)}")

    rows = []
    for name in names:
        try:
            rows.append(run_case(name, cases[name], history=args.history))
        except Exception as exc:  # noqa: BLE001 - one failing case (e.g. a missing extra) must not hide the others
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"})
            _settle()

    header = (
        f"{'case':<24}{'ops':>7}  {'baseline':>10}  {'requested real/model':>25} {'err':>8}  "
        f"{'allocated real/model':>25} {'err':>8}  {'reserved real/model':>25} {'err':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<24}  error: {r['error']}")
            continue
        cells = []
        for key in ("requested", "allocated", "reserved"):
            c = r[key]
            pair = f"{_fmt(c['real_peak_net'])} / {_fmt(c['model_peak'])}"
            cells.append(f"{pair:>25} {_pct(c['rel_error_net']):>8}")
        print(f"{r['case']:<24}{r['ops']:>7}  {_fmt(r['baseline']['allocated']):>10}  " + "  ".join(cells))
    print()
    print("Fake twin: the same step recorded under fake tensors on cuda:0, allocator model on the fake trace")
    head2 = (f"{'case':<24}{'ops =':>6}  {'max_memory_allocated / fake':>30} {'err':>8}  "
             f"{'reserved real/fake':>25} {'err':>8}  {'resv/alloc real':>15} {'fake':>6}")  # fmt: skip
    print(head2)
    print("-" * len(head2))
    for r in rows:
        f = r.get("fake") or {}
        if "error" in r or "error" in f:
            print(f"{r['case']:<24}  error: {r.get('error') or f.get('error')}")
            continue
        a, v = f["allocated"], f["reserved"]
        rr, fr = r["real_reserved_over_allocated"], f["reserved_over_allocated"]
        print(
            f"{r['case']:<24}{'yes' if f['ops_equal_real'] else 'NO':>6}  "
            f"{_fmt(a['real_peak_net']) + ' / ' + _fmt(a['fake_peak']):>30} {_pct(a['rel_error_net']):>8}  "
            f"{_fmt(v['real_peak_net']) + ' / ' + _fmt(v['fake_peak']):>25} {_pct(v['rel_error_net']):>8}  "
            f"{'-' if rr is None else f'{rr:.3f}':>15} {'-' if fr is None else f'{fr:.3f}':>6}"
        )
    print()
    print("real = torch.cuda.memory_stats() peak minus the baseline left after a warm-up run")
    print("       (cuBLAS workspaces etc., invisible to the record); err = (model - real) / real.")
    print("Not modelled (still inside the real peaks unless noted):")
    for line in NOT_MODELLED:
        print(f"  - {line}")

    errors = {
        key: [abs(r[key]["rel_error_net"]) for r in rows if "error" not in r and r[key]["rel_error_net"] is not None]
        for key in ("requested", "allocated", "reserved")
    }
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "max_abs_rel_error_net": {k: (max(v) if v else None) for k, v in errors.items()},
        "fake_max_abs_rel_error_net": {
            key: max(
                (
                    abs(r["fake"][key]["rel_error_net"])
                    for r in rows
                    if "error" not in r
                    and "error" not in r.get("fake", {"error": 1})
                    and r["fake"][key]["rel_error_net"] is not None
                ),
                default=None,
            )
            for key in ("requested", "allocated", "reserved")
        },  # fmt: skip
        "cases": rows,
        "not_modelled": NOT_MODELLED,
    }
    oplogs = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cases": {
            r["case"]: {**r.pop("oplogs"), **{k: r[k]["real_peak_net"] for k in ("requested", "allocated", "reserved")}}
            for r in rows if "oplogs" in r
        },
    }  # fmt: skip
    if args.oplogs is not None:
        args.oplogs.write_text(json.dumps(oplogs, indent=1) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
