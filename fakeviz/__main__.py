"""Command line: ``python -m fakeviz demo`` and ``python -m fakeviz report FILE``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _fmt_gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def summary(trace) -> str:  # noqa: ANN001 - Trace, imported lazily
    """Plain-text summary: per-device peak, per-phase op counts."""
    lines = [f"{trace.num_ops:,} ops recorded"]
    lines.append("ops per phase: " + ", ".join(f"{k} {v:,}" for k, v in trace.phase_counts().items()))
    lines.append("peak live storage bytes per device:")
    for dev, pk in trace.peak_bytes().items():
        lines.append(f"  {dev:>8}: {_fmt_gib(pk['bytes'])}  at op #{pk['seq']} ({pk['op']})")
    if trace.error:
        lines.append(f"stopped by {trace.error.get('type')}: {trace.error.get('message', '')[:300]}")
    return "\n".join(lines)


def demo(args: argparse.Namespace) -> int:
    import torch

    import fakeviz as fv
    from fakeviz import models

    cfg = models.config(args.model, **({"num_hidden_layers": args.layers} if args.layers else {}))
    print(
        f"fakeviz demo: {args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), bf16, "
        f"batch {args.batch}, seq {args.seq}, fwd+bwd on fake {args.device}"
    )
    print(f"fake cuda: {fv.fake_cuda_status().mode}")
    t0 = time.perf_counter()
    with fv.record(device=args.device) as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
        out = model(ids, labels=ids)
        out.loss.backward()
    dt = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e9:.1f} B parameters, recorded in {dt:.1f} s")
    print(summary(trace))
    out_path = Path(args.output)
    trace.save(out_path)
    html_path = out_path.with_suffix(".html")
    html_path.write_text(
        "<!doctype html><meta charset='utf-8'><title>fakeviz demo</title>"
        + trace._repr_html_()
        + "<pre>"
        + __import__("html").escape("\n".join(trace.oplog_lines(limit=200)))
        + "</pre>"
    )
    print(f"trace written to {out_path}, summary page to {html_path}")
    return 0


def report(args: argparse.Namespace) -> int:
    import fakeviz as fv

    trace = fv.load(args.file)
    print(summary(trace))
    if args.oplog:
        print(trace.oplog(limit=args.oplog))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fakeviz", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="record a Llama-3-70B-shaped fwd+bwd under fake tensors")
    d.add_argument("--model", default="llama3-70b")
    d.add_argument("--layers", type=int, default=0, help="override the number of layers (0: the config's)")
    d.add_argument("--device", default="cuda:0")
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--seq", type=int, default=2048)
    d.add_argument("-o", "--output", default="fakeviz-demo.fvz")
    d.set_defaults(fn=demo)
    r = sub.add_parser("report", help="summarise a saved trace")
    r.add_argument("file")
    r.add_argument("--oplog", type=int, default=0, help="also print the first N op-log lines")
    r.set_defaults(fn=report)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
