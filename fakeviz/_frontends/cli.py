"""Command line: ``python -m fakeviz demo`` and ``python -m fakeviz report FILE``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .._core.gpus import gpu_capability
from .._trace import load
from .._views.text import summary, summary_html

__all__ = ["main"]


def demo(args: argparse.Namespace) -> int:
    import torch

    from .. import models
    from .._api import fake_cuda_status, record

    cfg = models.config(args.model, **({"num_hidden_layers": args.layers} if args.layers else {}))
    print(
        f"fakeviz demo: {args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), bf16, "
        f"batch {args.batch}, seq {args.seq}, fwd+bwd on fake {args.device}"
    )
    print(f"fake cuda: {fake_cuda_status().mode}")
    t0 = time.perf_counter()
    named = bool(args.gpu) and gpu_capability(args.gpu) is not None
    with record(device=args.device, gpu=args.gpu if named else None) as trace:
        model = models.build(cfg, dtype=torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
        out = model(ids, labels=ids)
        out.loss.backward()
    dt = time.perf_counter() - t0
    if args.gpu and not named:
        trace.meta["capacity"] = args.gpu  # a size such as "80GB": the verdict, without a GPU's attention rules
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e9:.1f} B parameters, recorded in {dt:.1f} s")
    print(summary(trace))
    out_path = Path(args.output)
    trace.save(out_path)
    html_path = out_path.with_suffix(".html")
    try:
        trace.to_html(html_path, args.gpu)
        what = "explorer (open it in a browser; works offline)"
    except FileNotFoundError as exc:  # the JS bundle was not built (no npm): a static summary instead
        print(exc, file=sys.stderr)
        html_path.write_text(
            "<!doctype html><meta charset='utf-8'><title>fakeviz demo</title>"
            + summary_html(trace)
            + "<pre>"
            + __import__("html").escape("\n".join(trace.oplog_lines(limit=200)))
            + "</pre>"
        )
        what = "summary page"
    print(f"trace written to {out_path}, {what}: {html_path}")
    return 0


def report(args: argparse.Namespace) -> int:
    trace = load(args.file)
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
    d.add_argument("--gpu", default="H100", help="GPU (catalog name) or capacity for the fits / does-not-fit verdict")
    d.set_defaults(fn=demo)
    r = sub.add_parser("report", help="summarise a saved trace")
    r.add_argument("file")
    r.add_argument("--oplog", type=int, default=0, help="also print the first N op-log lines")
    r.set_defaults(fn=report)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
