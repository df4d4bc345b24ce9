"""Command line: ``python -m fakeviz demo`` and ``python -m fakeviz report FILE``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _fmt_bytes(n: int) -> str:
    from ._trace import _fmt_bytes as fmt

    return fmt(n)


def summary(trace) -> str:  # noqa: ANN001 - Trace, imported lazily
    """Plain-text summary: per-device peak by category and what set it, FLOPs, top modules, fidelity."""
    lines = [f"{trace.num_ops:,} ops recorded"]
    lines.append("ops per phase: " + ", ".join(f"{k} {v:,}" for k, v in trace.phase_counts().items() if v))
    lines.append("peak memory per device:")
    for dev, pk in trace.peak().items():
        alloc = ""
        if pk.allocated is not None:
            alloc = f"; allocator model: {_fmt_bytes(pk.allocated)} allocated, {_fmt_bytes(pk.reserved)} reserved"
        lines.append(f"  {dev:>8}: {_fmt_bytes(pk.bytes)} of tensors{alloc}")
        lines.append(f"            at op #{pk.seq} {pk.op} ({pk.phase}, {pk.module or '<top level>'})")
        if pk.user_line:
            lines.append(f"            {pk.user_line}")
        cats = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in pk.by_category.items() if v)
        lines.append(f"            {cats}")
    if trace.meta.get("capacity"):
        lines.append(f"verdict for {trace.meta.get('capacity_spec') or trace.meta['capacity']}: "
                     + trace.verdict(trace.meta["capacity"])["text"])  # fmt: skip
    flops = {k: v for k, v in trace.flops().items() if v}
    if flops:
        lines.append("FLOPs: " + ", ".join(f"{k} {v / 1e12:,.1f} T" for k, v in flops.items()))
        unknown = trace.flop_coverage().query("kind == 'unknown'")
        if len(unknown):
            lines.append(f"  ops without a FLOP formula (not counted): {', '.join(unknown.op.head(8))}")
    mt = trace.folded_modules()
    if len(mt):
        top = mt[mt.depth <= 3].sort_values("params", ascending=False).head(6)
        lines.append("largest modules (folded):")
        for _, r in top.iterrows():
            lines.append(f"  {r.path:<48} {r.params / 1e9:8.3f} B params  x{r['count']}")
    fid = trace.fidelity()
    if len(fid["without_meta"]) or len(fid["data_dependent"]):
        lines.append(f"fidelity: {len(fid['without_meta'])} ops without a meta kernel, "
                     f"{len(fid['data_dependent'])} data-dependent calls")  # fmt: skip
    att = fid["attention"]
    if len(att):
        lines.append("attention: " + ", ".join(f"{b} x{n}" for b, n in att.backend.value_counts().items()))
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
    from fakeviz._gpus import gpu_capability

    named = bool(args.gpu) and gpu_capability(args.gpu) is not None
    with fv.record(device=args.device, gpu=args.gpu if named else None) as trace:
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
            + trace._repr_html_()
            + "<pre>"
            + __import__("html").escape("\n".join(trace.oplog_lines(limit=200)))
            + "</pre>"
        )
        what = "summary page"
    print(f"trace written to {out_path}, {what}: {html_path}")
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
