"""Text and compact HTML summaries of a record: its ``repr``, the notebook summary, the CLI report, a step's speed."""

from __future__ import annotations

from .._analysis.fidelity import fidelity_report
from .._analysis.flops import flop_coverage, flops_by_phase
from .._analysis.memory import peak_bytes, peaks
from .._analysis.tables import phase_counts
from .._analysis.tree import folded_modules, weight_precisions
from .._analysis.verdict import verdict
from .._core.fmt import format_bytes, format_count, format_seconds, html_text, visible
from .._core.record import Record

__all__ = ["precision_text", "speed_text", "summary", "summary_html", "trace_repr"]

# Above this many ops the repr skips what needs a pass over the whole record.
_REPR_LIMIT = 2_000_000


def trace_repr(rec: Record) -> str:
    """``<fakeviz.Trace 818 ops, done, devices=['cuda:0', 'cpu'], fits: ...>``."""
    n = len(rec)
    state = "recording" if rec.recording else "done"
    err = f", error={rec.error['type']}" if rec.error else ""
    devs = rec.strings("devices") if n < _REPR_LIMIT else []
    text = ""
    if rec.meta.get("capacity") and n < _REPR_LIMIT:
        text = f", {verdict(rec, rec.meta['capacity'])['text']}"
    return f"<fakeviz.Trace {n} ops, {state}, devices={devs}{err}{text}>"


def summary_html(rec: Record) -> str:
    """A compact HTML summary: ops per phase, the error if any, the verdict, the peak per device."""
    rows = []
    for dev, pk in peak_bytes(rec).items():
        rows.append(
            f"<tr><td>{html_text(dev)}</td><td>{format_bytes(pk['bytes'])}</td><td>{html_text(pk['op'])}</td></tr>"
        )
    phases = ", ".join(f"{k} {v}" for k, v in phase_counts(rec).items() if v)
    err = ""
    if rec.error:
        err = (
            f"<p class='fv-error'><b>Stopped by an error</b> in {html_text(str(rec.error.get('op')))}: "
            f"{html_text(str(rec.error.get('message'))[:500])}</p>"
        )
    text = ""
    if rec.meta.get("capacity"):
        v = verdict(rec, rec.meta["capacity"])
        cls = "fv-fits" if v["fits"] else "fv-over"
        spec = html_text(str(rec.meta.get("capacity_spec") or ""))
        text = f"<p class='{cls}'><b>{html_text(v['text'])}</b> {spec}</p>"
    weights = precision_text(rec)
    if weights:
        text += f"<p class='fv-weights'><b>weights</b>: {html_text(weights)}</p>"
    return (
        f"<div class='fv-trace'><b>fakeviz trace</b>: {len(rec)} ops ({html_text(phases)}){err}{text}"
        "<table><tr><th>device</th><th>peak live</th><th>at op</th></tr>" + "".join(rows) + "</table></div>"
    )


def summary(trace: Record) -> str:
    """Plain-text summary: per-device peak by category and what set it, FLOPs, top modules, fidelity.

    Every name and message from the user's code or a file is shown through :func:`visible` (Note: [bidi
    controls in names]): a control character in a module name cannot reorder or rewrite the line.
    """
    lines = [f"{trace.num_ops:,} ops recorded"]
    lines.append("ops per phase: " + ", ".join(f"{k} {v:,}" for k, v in phase_counts(trace).items() if v))
    lines.append("peak memory per device:")
    for dev, pk in peaks(trace).items():
        alloc = ""
        if pk.allocated is not None:
            alloc = f"; allocator model: {format_bytes(pk.allocated)} allocated, {format_bytes(pk.reserved)} reserved"
        lines.append(f"  {visible(dev):>8}: {format_bytes(pk.bytes)} of tensors{alloc}")
        lines.append(
            f"            at op #{pk.seq} {visible(pk.op)} ({pk.phase}, {visible(pk.module or '<top level>')})"
        )
        if pk.user_line:
            lines.append(f"            {visible(pk.user_line)}")
        cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in pk.by_category.items() if v)
        lines.append(f"            {cats}")
    if trace.meta.get("capacity"):
        lines.append(f"verdict for {trace.meta.get('capacity_spec') or trace.meta['capacity']}: "
                     + verdict(trace, trace.meta["capacity"])["text"])  # fmt: skip
    flops = {k: v for k, v in flops_by_phase(trace).items() if v}
    if flops:
        lines.append("FLOPs: " + ", ".join(f"{k} {v / 1e12:,.1f} T" for k, v in flops.items()))
        unknown = flop_coverage(trace).query("kind == 'unknown'")
        if len(unknown):
            lines.append(f"  ops without a FLOP formula (not counted): {', '.join(map(visible, unknown.op.head(8)))}")
    weights = precision_text(trace)
    if weights:
        lines.append(f"weights: {weights}")
    mt = folded_modules(trace)
    if len(mt):
        top = mt[mt.depth <= 3].sort_values("params", ascending=False).head(6)
        lines.append("largest modules (folded):")
        for _, r in top.iterrows():
            lines.append(f"  {visible(r.path):<48} {r.params / 1e9:8.3f} B params  x{r['count']}")
    fid = fidelity_report(trace)
    if len(fid["without_meta"]) or len(fid["data_dependent"]):
        lines.append(f"fidelity: {len(fid['without_meta'])} ops without a meta kernel, "
                     f"{len(fid['data_dependent'])} data-dependent calls")  # fmt: skip
    att = fid["attention"]
    if len(att):
        lines.append("attention: " + ", ".join(f"{b} x{n}" for b, n in att.backend.value_counts().items()))
    if trace.error:
        lines.append(
            f"stopped by {trace.error.get('type')}: {visible(trace.error.get('message', '')[:300], lines=True)}"
        )
    return visible("\n".join(lines), lines=True)  # what the lines above did not name (capacity_spec, kinds)


def precision_text(trace: Record) -> str:
    """``"nf4 (224 linear), bf16 (embed_tokens, 65 norm, lm_head), LoRA bf16 (112 adapted layers)"``: the
    precision of the weights, most bytes first (Note: [weight precision]); ``""`` without weights."""
    return visible(", ".join(f"{r['precision']} ({r['kinds']})" for r in weight_precisions(trace)))


def speed_text(step_s: float | None, tokens_per_s: float | None, mfu: float | None, *, gpus: int, gpu: str | None,
               note: str = "") -> str:  # fmt: skip
    """``"step 1.23 s on 8x H100, 53.3 K tokens/s (6.7 K per GPU), MFU 41.2%"``; without a step time, why not."""
    if step_s is None or step_s != step_s:
        return f"no step time: {note}" if note else "no step time"
    on = f"{gpus}x {gpu}" if gpus > 1 else str(gpu)
    parts = [f"step {format_seconds(step_s)} on {on}"]
    if tokens_per_s is not None and tokens_per_s == tokens_per_s:
        per = f" ({format_count(tokens_per_s / gpus)} per GPU)" if gpus > 1 else ""
        parts.append(f"{format_count(tokens_per_s)} tokens/s{per}")
    if mfu is not None and mfu == mfu:
        parts.append(f"MFU {mfu:.1%}")
    return ", ".join(parts)
