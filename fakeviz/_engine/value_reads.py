"""Reads of values a fake run does not have: bounds from the record, documented assumptions, clear errors.

The part of Note: [values under fake tensors] (in :mod:`fakeviz._engine.values`) that runs only when code
reads a value the fake run does not know: :func:`bounds` (3. in the Note: what every draw can be, following
the read tensor back through the recorded ops), :data:`ASSUMPTIONS` and :func:`rule_for_read` (the reads
library code makes for a known reason, answered by a stated assumption), and the errors for the rest
(:func:`describe`, :func:`read_advice`, and :func:`guard_error` for a branch on a symbolic size under
``record(symbolic=True)``). Nothing here runs before such a read: the recorder's hot path never calls it.
"""

from __future__ import annotations

import ast
import itertools
import math
import sys
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._mode_utils import no_dispatch

from .._core.errors import DataDependentError
from .._core.schema import FLAG_INPLACE, OP_COLS, OUT_COLS, field

__all__ = [
    "ASSUMPTIONS", "NORMAL_BOUND", "read_advice", "bounds", "describe", "guard_error", "known_value", "rule_for_read",
]  # fmt: skip

#: Every normal draw lies within this many standard deviations of its mean (Note: [values under fake tensors]).
NORMAL_BOUND = 10.0


# ------------------------------------------------------------------------------------- assumptions
_NO_EARLY_STOP = (
    "generate(): no sequence finished early (no end-of-sequence token, no stopping criterion met by generated "
    "values): every step up to max_new_tokens / max_length runs"
)
#: Reads of unknown values in library code, answered by a documented assumption: (file suffix, function,
#: text the source line contains or "", answer, assumption).
_ERRORS = itertools.count(1)


def _decreasing() -> float:
    """An error that every call finds lower than the last (HQQ's early-stop test never stops)."""
    return 1.0 / (1 + next(_ERRORS))


#: ``(file suffix, function, text on the line, answer (a value, or a callable giving it), why)``
ASSUMPTIONS: tuple[tuple[str, str, str, Any, str], ...] = (
    ("torch/nn/init.py", "_no_grad_trunc_normal_", "", False,
     "trunc_normal_: no draw fell outside [a, b], so no re-draw (a real run re-draws the outliers: one more "
     "normal_ and where per round)"),
    ("transformers/generation/utils.py", "__call__", "unfinished_sequences", False, _NO_EARLY_STOP),
    ("transformers/generation/utils.py", "_has_unfinished_sequences", "", False, _NO_EARLY_STOP),
    ("transformers/generation/utils.py", "generate", "has_right_padding", False,
     "generate(): the inputs are not right-padded (a check that only warns)"),
    ("transformers/generation/utils.py", "generate", '(model_kwargs["attention_mask"] == 1).all()', True,
     "generate(): the attention mask is all ones (no padding in the inputs), so it is dropped"),
    ("transformers/generation/utils.py", "_prepare_attention_mask_for_generation", "", False,
     "generate(): the inputs contain no pad token (the attention mask is all ones)"),
    ("transformers/models/wav2vec2/modeling_wav2vec2.py", "forward", "labels.max()", False,
     "Wav2Vec2: labels.max() < vocab_size (the labels are valid)"),
    ("transformers/models/wav2vec2/modeling_wav2vec2.py", "forward", "skip_the_layer", False,
     "Wav2Vec2 LayerDrop: no layer skipped (the draw is on the GPU, unknown here; a real run skips each layer "
     "with probability config.layerdrop, so every layer running is the upper bound on time and memory)"),
    ("torchao/quantization/quant_primitives.py", "optimize_weights_proximal_legacy", "current_error", _decreasing,
     "torchao HQQ (int4 choose-qparams 'hqq'): each iteration lowered the error, so no early stop: all `iters` "
     "iterations ran (the upper bound on time; each iteration allocates the same)"),
)  # fmt: skip


ALL_SELECTED = "values unknown: assumed every element of {what} is selected (the largest output, an upper bound)"

# Note: [values after collectives]: a collective on a tensor whose values a fake run keeps (a loss, a count,
# a small buffer) runs on those values under torch.distributed's fake process group, which moves no data, so
# the tensor keeps this rank's own values (an all-reduced loss is not summed over the ranks). A real run's
# values come from the other ranks too: each such collective is a stated assumption in fidelity().
COLLECTIVES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})
COLLECTIVE_VALUES = "the values it writes are this rank's own: the fake process group moves no data between ranks"


def rule_for_read() -> tuple[Any, str] | None:
    """The assumption for the read being made now, from the innermost frame outside torch and fakeviz."""
    import linecache

    f: Any = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename.replace("\\", "/")
        if "/torch/" in fn and "/torch/nn/init.py" not in fn or "/fakeviz/_engine/" in fn:
            f = f.f_back
            continue
        for suffix, name, text, answer, why in ASSUMPTIONS:
            if fn.endswith(suffix) and f.f_code.co_name == name:
                # the statement may span lines: look at the line of the read and the next few
                if not text or text in "".join(linecache.getline(fn, f.f_lineno + i) for i in range(6)):
                    return (answer() if callable(answer) else answer), why
        return None
    return None


# -------------------------------------------------------------------------------------- provenance
_N_OP, _N_OUT = len(OP_COLS), len(OUT_COLS)
_OP, _ARGS, _IN_END, _OUT_END, _FLAGS = (field(OP_COLS, n) for n in ("op", "args", "in_end", "out_end", "flags"))
_O_TID, _O_ST = field(OUT_COLS, "out_tensor"), field(OUT_COLS, "out_storage")


def _producer(rec: Any, tid: int, before: int | None = None) -> tuple[str, list[Any], list[int], int] | None:
    """The op that last wrote tensor ``tid`` in the record (before output row ``before``): (op name, parsed
    non-tensor args, input tensor ids, its first output row); None when not found, or when another tensor on
    its storage was written after it."""
    import numpy as np

    b = rec.builder
    outd = np.frombuffer(b.out_rows, dtype=np.int64).reshape(-1, _N_OUT)
    if before is not None:
        outd = outd[:before]
    rows = np.nonzero(outd[:, _O_TID] == tid)[0]
    if not len(rows):
        return None
    row = int(rows[-1])
    opd = np.frombuffer(b.op_rows, dtype=np.int64).reshape(-1, _N_OP)
    k = int(np.searchsorted(opd[:, _OUT_END], row, side="right"))
    if k >= len(opd):
        return None
    st = int(outd[row, _O_ST])
    later = outd[int(opd[k, _OUT_END]) :]
    writes = np.nonzero((later[:, _O_ST] == st) & (later[:, _O_TID] != tid))[0]
    if st >= 0 and len(writes):
        ends = opd[k + 1 :, _OUT_END]
        for w in writes:
            j = k + 1 + int(np.searchsorted(ends, int(opd[k, _OUT_END]) + int(w), side="right"))
            if j < len(opd) and opd[j, _FLAGS] & FLAG_INPLACE:
                return None
    name = b.tables["ops"].strings[int(opd[k, _OP])]
    tmpl = b.tables["args"].strings[int(opd[k, _ARGS])]
    start = int(opd[k - 1, _IN_END]) if k else 0
    ins = [int(x) for x in b.in_tensor[start : int(opd[k, _IN_END])]]
    return name, _parse_args(tmpl), ins, int(opd[k - 1, _OUT_END]) if k else 0


def _parse_args(tmpl: str) -> list[Any]:
    """The positional arguments of an op-log template; ``{}`` (a tensor) becomes None, anything not a
    Python literal is dropped from there on."""
    parts, depth, cur = [], 0, ""
    for ch in tmpl:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out: list[Any] = []
    for p in parts:
        if "=" in p.split("[")[0]:
            break  # keyword arguments
        if p == "{}":
            out.append(None)
            continue
        try:
            out.append(ast.literal_eval(p))
        except (ValueError, SyntaxError):
            break
    return out


_CMP = {
    "aten.eq.Scalar": lambda lo, hi, c: (lo == hi == c, lo <= c <= hi),
    "aten.ne.Scalar": lambda lo, hi, c: (not lo <= c <= hi, not lo == hi == c),
    "aten.lt.Scalar": lambda lo, hi, c: (hi < c, lo < c),
    "aten.le.Scalar": lambda lo, hi, c: (hi <= c, lo <= c),
    "aten.gt.Scalar": lambda lo, hi, c: (lo > c, hi > c),
    "aten.ge.Scalar": lambda lo, hi, c: (lo >= c, hi >= c),
}
_SAME = frozenset(
    "aten.clone.default aten.detach.default aten.view.default aten._unsafe_view.default aten.expand.default "
    "aten.slice.Tensor aten.select.int aten.unsqueeze.default aten.squeeze.dim aten.squeeze.default "
    "aten.permute.default aten.t.default aten.transpose.int aten.contiguous.default aten.alias.default "
    "aten.reshape.default aten.flatten.using_ints aten.any.default aten.any.dim aten.all.default aten.all.dim "
    "aten.amax.default aten.amin.default aten.max.default aten.min.default aten._to_copy.default "
    "aten.lift_fresh.default".split()
)


def bounds(rec: Any, t: Any, depth: int = 0) -> tuple[float, float] | None:
    """Bounds (lo, hi) every element of fake tensor ``t`` lies within, from the ops that made it (Note: [values
    under fake tensors], 3.), or None. Booleans are 0/1; lo == hi means the value is known. ``rec`` is the
    recorder (its record is the provenance)."""
    c = t.constant if isinstance(t, FakeTensor) else None
    if c is not None and c.numel():
        with no_dispatch():
            return float(c.min()), float(c.max())
    tag = t.__dict__.get("_fakeviz_tid")
    if tag is None or not rec.tid_base <= tag < rec.tid_limit:
        return None
    return _bounds_of(rec, tag - rec.tid_base, depth)


def _bounds_of(rec: Any, tid: int, depth: int, before: int | None = None) -> tuple[float, float] | None:
    if depth > 24:
        return None
    prod = _producer(rec, tid, before)
    if prod is None:
        return None
    name, a, ins, row = prod

    def inp(i: int) -> tuple[float, float] | None:
        return _bounds_of(rec, ins[i], depth + 1, row) if i < len(ins) else None

    if name == "aten.normal_.default":
        mean = float(a[1]) if len(a) > 1 else 0.0
        std = float(a[2]) if len(a) > 2 else 1.0
        return mean - NORMAL_BOUND * std, mean + NORMAL_BOUND * std
    if name in ("aten.randn.default", "aten.randn_like.default"):
        return -NORMAL_BOUND, NORMAL_BOUND
    if name in ("aten.rand.default", "aten.rand_like.default", "aten.bernoulli_.float", "aten.bernoulli.default"):
        return 0.0, 1.0
    if name == "aten.randint.low" and len(a) > 1:
        return float(a[0]), float(a[1]) - 1
    if name == "aten.randint.default" and a:
        return 0.0, float(a[0]) - 1
    if name == "aten.randperm.default" and a:
        return 0.0, float(a[0]) - 1
    if name == "aten.uniform_.default":
        return (float(a[1]) if len(a) > 1 else 0.0), (float(a[2]) if len(a) > 2 else 1.0)
    if name in ("aten.fill_.Scalar", "aten.full.default", "aten.full_like.default") and len(a) > 1:
        v = float(a[1])
        return v, v
    if name in ("aten.zero_.default", "aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default"):
        return 0.0, 0.0
    if name in ("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default"):
        return 1.0, 1.0
    if name in _CMP and len(a) > 1 and isinstance(a[1], (int, float)):
        x = inp(0)
        if x is None:
            return None
        all_true, any_true = _CMP[name](x[0], x[1], float(a[1]))
        return float(all_true), float(any_true)
    if name in ("aten.bitwise_or.Tensor", "aten.logical_or.default", "aten.bitwise_and.Tensor",
                "aten.logical_and.default"):  # fmt: skip
        x, y = inp(0), inp(1)
        is_or = name in ("aten.bitwise_or.Tensor", "aten.logical_or.default")
        dominant = (1.0, 1.0) if is_or else (0.0, 0.0)  # x | True, x & False: known whatever x is
        if x == dominant or y == dominant:
            return dominant
        if x is None or y is None or not (0 <= x[0] <= x[1] <= 1 and 0 <= y[0] <= y[1] <= 1):
            return None
        if is_or:
            return max(x[0], y[0]), max(x[1], y[1])
        return min(x[0], y[0]), min(x[1], y[1])
    if name in ("aten.bitwise_not.default", "aten.logical_not.default"):
        x = inp(0)
        return (1.0 - x[1], 1.0 - x[0]) if x is not None and 0 <= x[0] <= x[1] <= 1 else None
    if name == "aten.neg.default":
        x = inp(0)
        return (-x[1], -x[0]) if x is not None else None
    if name == "aten.abs.default":
        x = inp(0)
        if x is None:
            return None
        lo = 0.0 if x[0] <= 0 <= x[1] else min(abs(x[0]), abs(x[1]))
        return lo, max(abs(x[0]), abs(x[1]))
    if name == "aten.where.self":
        cnd = inp(0)
        if cnd is None:
            return None
        x, y = inp(1), inp(2)
        if cnd == (1.0, 1.0):
            return x
        if cnd == (0.0, 0.0):
            return y
        return (min(x[0], y[0]), max(x[1], y[1])) if x is not None and y is not None else None
    if name in _SAME:
        return inp(0)
    return None


def describe(rec: Any, t: Any) -> str:
    """Where the unknown value of ``t`` came from, for the error (Note: [values under fake tensors])."""
    if rec is None or not isinstance(t, FakeTensor):
        return ""
    tag = t.__dict__.get("_fakeviz_tid")
    if tag is None or not rec.tid_base <= tag < rec.tid_limit:
        return ""
    prod = _producer(rec, tag - rec.tid_base)
    if prod is None:
        return ""
    size = math.prod(t.shape) if not t._has_symbolic_sizes_strides else "?"
    return f"the value read is ${tag - rec.tid_base} ({size} elements), made by {prod[0]}"


def guard_error(rec: Any, exc: BaseException) -> DataDependentError | None:
    """A ``GuardOnDataDependentSymNode`` (``record(symbolic=True)``: Python code branched on a size or value
    that is a symbol, outside any op) as a :class:`DataDependentError` naming the user's line, the module
    and the op that made the symbol; None for any other exception."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if not isinstance(exc, GuardOnDataDependentSymNode):
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    if any("/torch/export/" in f.f_code.co_filename.replace("\\", "/") for f, _ in frames):
        return None  # torch.export's (fakeviz.check_export explains it)
    line = src = module = None
    found = rec.user_frame(frames)  # the op table's test of a file, not a substring of its path
    if found is not None:
        import linecache

        code, lineno = found[0].f_code, found[1]
        line = f"{code.co_filename}:{lineno} in {code.co_name}"
        src = linecache.getline(code.co_filename, lineno).strip()
    for f, _ in reversed(frames):
        me = f.f_locals.get("self")
        if module is None and isinstance(me, torch.nn.Module) and id(me) in rec.mod_names:
            module = rec.builder.tables["modules"].strings[rec.mod_names[id(me)]]
    op = None
    import numpy as np

    from .._core.schema import FLAG_DATA_DEPENDENT

    opd = np.frombuffer(rec.builder.op_rows, dtype=np.int64).reshape(-1, _N_OP)
    dd = np.nonzero(opd[:, _FLAGS] & FLAG_DATA_DEPENDENT)[0]
    if len(dd):
        op = rec.builder.tables["ops"].strings[int(opd[int(dd[-1]), _OP])]
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    msg = (
        f"Python code at {line or '<unknown line>'} (module {module or '<top level>'}) branched on a size or value "
        f"that depends on data{f', made by op {op} (seq {int(dd[-1])})' if op else ''}.\n"
        + (f"    {src}\n" if src else "")
        + "With record(symbolic=True) such a size is a symbol, and no branch can be taken on it.\n"
        "What to do: record without symbolic=True: the fake run then uses the values it knows (Note: [values "
        "under fake tensors] in fakeviz/_engine/values.py) or a stated assumption (every element selected), "
        "listed in fidelity()['assumptions'].\n"
        f"The partial trace is on this exception as `.trace`. (torch said: {type(exc).__name__}: {first[:300]})"
    )
    return DataDependentError(msg, op=op, module=module, user_line=line)


def read_advice(exc: BaseException, limit: int) -> str:
    """What to do about a read of an unknown value ``exc`` (the DataDependentError's body); ``limit``: how many
    elements a tensor with a value may have."""
    where = getattr(exc, "fakeviz_unknown", "") or ""
    return (
        (f"{where}; its value is not known to the fake run.\n" if where else "")
        + "A fake run knows the values of tensors of up to "
        f"{limit} elements made from Python numbers, real tensors passed in, random draws in step with "
        "the real run, and ops on those (Note: [values under fake tensors] in fakeviz/_engine/values.py).\n"
        "What to do: build the value from Python numbers or a real tensor (e.g. pass real input ids), or "
        "compute it outside the recorded block and pass a Python number; for a check that only validates "
        "inputs, move it before the block." + (f"\n{exc.fakeviz_hint}" if getattr(exc, "fakeviz_hint", None) else "")
    )


def known_value(t: Any) -> torch.Tensor | None:
    """The CPU value of fake tensor ``t`` if the run knows it, also inside a fake rule that runs with the
    inputs' values hidden (``Values._hidden``): for fake rules that read values as the real kernel does
    (Note: [cuDNN CTC under fake tensors])."""
    if not isinstance(t, FakeTensor):
        return None
    if t.constant is not None:
        return t.constant
    values = getattr(t.fake_mode, "_fv_values", None)
    for h, c in (values.local.__dict__.get("hidden") or ()) if values is not None else ():
        if h is t:
            return c
    return None
