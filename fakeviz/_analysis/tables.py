"""The record as tables: ops, outputs and storages as pandas DataFrames, and the op log as text.

Each function takes a :class:`~fakeviz._core.record.Record` and keeps its result in the record's memo.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.record import Record, fill_args
from .._core.schema import CATEGORIES, FLAG_INPLACE, FLAG_VIEW, PHASES, ROLES, dtype_abbr

__all__ = ["args_strings", "oplog_lines", "ops_table", "outputs_table", "phase_counts", "storages_table"]


def categorical(codes: np.ndarray, categories: list[str]) -> Any:
    """A pandas Categorical over a string table (-1 codes are missing values)."""
    import pandas as pd

    return pd.Categorical.from_codes(codes.astype(np.int32), categories=_unique_cats(categories))


def _unique_cats(categories: list[str]) -> list[str]:
    # pandas needs unique categories; string tables are unique by construction,
    # but guard against a hand-edited file.
    if len(set(categories)) == len(categories):
        return categories
    seen: dict[str, int] = {}
    out = []
    for x in categories:
        k = seen.get(x, 0)
        seen[x] = k + 1
        out.append(x if k == 0 else f"{x} #{k}")
    return out


def ops_table(rec: Record) -> Any:
    """pandas DataFrame, one row per recorded op.

    Columns: seq, op, phase, module, user_line, args, n_inputs, n_outputs,
    is_view, inplace, and the first output's shape, dtype, device, stride,
    storage, storage_offset, plus ``nbytes`` (all outputs together).
    """
    return rec.cached("ops", lambda: _ops_table(rec))


def _ops_table(rec: Record) -> Any:
    import pandas as pd

    c, s = rec.columns(), rec.string_tables()
    n = len(c["op"])
    out_end = c["out_end"]
    out_start = np.concatenate([[0], out_end[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    in_end = c["in_end"]
    in_start = np.concatenate([[0], in_end[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    n_out = out_end - out_start
    has = n_out > 0
    first = np.where(has, out_start, 0)

    def first_col(name: str, fill: int = -1) -> np.ndarray:
        col = c[name]
        if len(col) == 0:
            return np.full(n, fill, dtype=np.int64)
        return np.where(has, col[np.minimum(first, len(col) - 1)], fill)

    nb = c["out_nbytes"]
    nbytes = np.add.reduceat(np.where(nb < 0, 0, nb), out_start[has]) if has.any() else np.zeros(0, np.int64)
    nbytes_full = np.zeros(n, dtype=np.int64)
    nbytes_full[has] = nbytes
    return pd.DataFrame(
        {
            "seq": np.arange(n, dtype=np.int64),
            "op": categorical(c["op"], s["ops"]),
            "phase": pd.Categorical.from_codes(c["phase"].astype(np.int32), categories=list(PHASES)),
            "module": categorical(c["module"], s["modules"]),
            "user_line": categorical(c["line"], s["lines"]),
            "args": args_strings(rec),
            "n_inputs": (in_end - in_start).astype(np.int32),
            "n_outputs": n_out.astype(np.int32),
            "is_view": (c["flags"] & FLAG_VIEW) != 0,
            "inplace": (c["flags"] & FLAG_INPLACE) != 0,
            "shape": categorical(first_col("out_shape"), s["shapes"]),
            "dtype": categorical(first_col("out_dtype"), s["dtypes"]),
            "device": categorical(first_col("out_device"), s["devices"]),
            "stride": categorical(first_col("out_stride"), s["strides"]),
            "storage": first_col("out_storage"),
            "storage_offset": first_col("out_offset"),
            "nbytes": nbytes_full,
        }
    )


def outputs_table(rec: Record) -> Any:
    """pandas DataFrame, one row per output tensor of every op."""
    return rec.cached("outputs", lambda: _outputs_table(rec))


def _outputs_table(rec: Record) -> Any:
    import pandas as pd

    c, s = rec.columns(), rec.string_tables()
    n_out = np.diff(np.concatenate([[0], c["out_end"]])).astype(np.int64)
    return pd.DataFrame(
        {
            "seq": np.repeat(np.arange(len(c["op"]), dtype=np.int64), n_out),
            "tensor": c["out_tensor"],
            "shape": categorical(c["out_shape"], s["shapes"]),
            "stride": categorical(c["out_stride"], s["strides"]),
            "dtype": categorical(c["out_dtype"], s["dtypes"]),
            "device": categorical(c["out_device"], s["devices"]),
            "storage": c["out_storage"],
            "storage_offset": c["out_offset"],
            "nbytes": c["out_nbytes"],
        }
    )


def storages_table(rec: Record) -> Any:
    """pandas DataFrame, one row per storage (the unit of memory and aliasing).

    Columns: storage, device, nbytes, category (see :data:`~fakeviz._core.schema.CATEGORIES`), roles
    (what the recorder saw it used as, ``"|"``-joined roles), name (parameter/buffer FQNs),
    alloc_seq / free_seq (lifetime in op seqs, -1 = before recording / still alive), owner (tensor id
    of the parameter whose gradient or optimizer state it is), and the creating op's op, phase,
    module and user_line.
    """
    return rec.cached("storages", lambda: _storages_table(rec))


def _storages_table(rec: Record) -> Any:
    import pandas as pd

    from .categories import storage_categories

    c, s = rec.columns(), rec.string_tables()
    alloc = c["st_alloc"]
    made = alloc >= 0
    at = np.where(made, alloc, 0)
    n_ops = len(c["op"])

    def creator(col: str) -> np.ndarray:
        if n_ops == 0:
            return np.full(len(alloc), -1, np.int64)
        return np.where(made & (alloc < n_ops), c[col][np.minimum(at, n_ops - 1)], -1)

    role_names = np.array(["|".join(r for i, r in enumerate(ROLES) if m >> i & 1) for m in range(1 << len(ROLES))])
    phase = creator("phase")
    return pd.DataFrame(
        {
            "storage": np.arange(len(c["st_device"]), dtype=np.int64),
            "device": categorical(c["st_device"], s["devices"]),
            "nbytes": c["st_nbytes"],
            "category": pd.Categorical.from_codes(storage_categories(rec), categories=list(CATEGORIES)),
            "roles": role_names[c["st_roles"].astype(np.int64) & ((1 << len(ROLES)) - 1)],
            "name": categorical(c["st_name"], s["names"]),
            "alloc_seq": alloc,
            "free_seq": c["st_free"],
            "owner": c["st_owner"],
            "op": categorical(creator("op"), s["ops"]),
            "phase": pd.Categorical.from_codes(phase.astype(np.int32), categories=list(PHASES)),
            "module": categorical(creator("module"), s["modules"]),
            "user_line": categorical(creator("line"), s["lines"]),
        }
    )


def args_strings(rec: Record) -> list[str]:
    """Each op's arguments as text, tensors written as ``$id``."""
    return _args_range(rec, 0, len(rec.col("op")))


def _args_range(rec: Record, start: int, stop: int) -> list[str]:
    """The argument text of ops ``start .. stop - 1`` (templates filled by ``fill_args``: never ``str.format``)."""
    c = rec.columns()
    templates = rec.strings("args")
    in_end = c["in_end"]
    if stop <= start:
        return []
    first = int(in_end[start - 1]) if start > 0 else 0
    tids = c["in_tensor"][first : int(in_end[stop - 1])].tolist()
    out: list[str] = []
    lo = 0
    for a, end in zip(c["args"][start:stop].tolist(), (in_end[start:stop] - first).tolist()):
        out.append(fill_args(templates[a], tids[lo:end]))
        lo = end
    return out


def oplog_lines(rec: Record, *, limit: int | None = None, start: int = 0) -> list[str]:
    """The op log, one line per op in the logging-tensor form.

    ``$3: bf16[8, 4096] cuda:0 = aten.mm.default($1, $2)``. Multi-output ops
    list every output; ops with no tensor output start with ``_``. ``$N`` names a tensor object, as
    torch's LoggingTensorMode numbers them: an in-place op's output keeps its input's number
    (``$2: f32[4] cpu = aten.add_.Tensor($2, 1)``, Note: [op log numbering] in the recorder), and the
    tensors in a list argument are named too (``aten.index.Tensor($0, [None, $3])``). Only the ops shown
    are formatted (``oplog(limit=10)`` of a 300k-op record formats 10).
    """
    c, s = rec.columns(), rec.string_tables()
    n = len(c["op"])
    start = min(max(start, 0), n)
    stop = n if limit is None else min(n, start + max(limit, 0))
    if stop <= start:
        return []
    args = _args_range(rec, start, stop)
    shapes, devices, dtypes, ops = s["shapes"], s["devices"], s["dtypes"], s["ops"]
    out_end = c["out_end"]
    o_first = int(out_end[start - 1]) if start > 0 else 0
    o_stop = int(out_end[stop - 1])
    ot, osh, odt, odev = (c[k][o_first:o_stop].tolist() for k in ("out_tensor", "out_shape", "out_dtype", "out_device"))
    ends = (out_end[start:stop] - o_first).tolist()
    op_ids = c["op"][start:stop].tolist()
    lines = []
    lo = 0
    for k, end in enumerate(ends):
        outs = [f"${ot[j]}: {dtype_abbr(dtypes[odt[j]])}[{shapes[osh[j]]}] {devices[odev[j]]}" for j in range(lo, end)]
        lhs = ", ".join(outs) if outs else "_"
        lines.append(f"{lhs} = {ops[op_ids[k]]}({args[k]})")
        lo = end
    return lines


def phase_counts(rec: Record) -> dict[str, int]:
    """Number of ops per phase."""
    counts = np.bincount(rec.col("phase").astype(np.int64), minlength=len(PHASES))
    return {p: int(n) for p, n in zip(PHASES, counts)}
