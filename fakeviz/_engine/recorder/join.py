"""One record from the records of a fake session's blocks (``%%fake`` cells): Note: [carried storages].

Each block's record starts with the storages earlier blocks left alive (carried in); the session gives
every storage a serial that stays the same across blocks. Joining concatenates the ops, outputs and
inputs, re-interns every string table, shifts tensor ids per block (a tensor used in two blocks has one
id per block; its storage is one), and makes one storage row per serial: allocated where it first
appeared, freed where it was freed, or at the start of the first block it was not carried into (it
died between blocks), with the union of its roles. The memory curve is then the one a single record of
the same code gives. ``meta["cells"]`` marks each block's op range: ``{"label", "start", "end", "error"}``
(``start``/``end`` are op seqs, ``end`` exclusive).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._core.record import Interner, Record, column_dtype
from ..._core.schema import ALL_COLS, STRING_TABLES

__all__ = ["join_records"]

# column -> the string table its ids index
_STRING_COLS = {
    "op": "ops", "module": "modules", "line": "lines", "args": "args", "out_shape": "shapes",
    "out_stride": "strides", "out_dtype": "dtypes", "out_device": "devices", "st_device": "devices",
    "st_name": "names", "p_name": "names", "p_module": "modules", "p_shape": "shapes", "p_dtype": "dtypes",
    "p_device": "devices",
}  # fmt: skip
_TENSOR_COLS = ("in_tensor", "out_tensor", "t_tensor", "p_tensor", "st_owner")
# meta lists of rows whose listed fields are op seqs (and, for deepcopies, field 1 a tensor id)
_SEQ_META = {
    "assumptions": (0,),
    "deepcopies": (0,),
    "fallback_kernels": (0,),
    "attention_calls": (0,),
    "steps": (0, 1),
}


def _remap(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    out = np.full(len(ids), -1, np.int64)
    ok = ids >= 0
    out[ok] = table[ids[ok].astype(np.int64)]
    return out


def _shift(ids: np.ndarray, by: int) -> np.ndarray:
    ids = ids.astype(np.int64)
    return np.where(ids >= 0, ids + by, ids)


def join_records(parts: list[tuple[Record, np.ndarray, str | None]], record_cls: type[Record]) -> Record:
    """``parts``: ``(record, serial of each storage, label)`` per block, in order. Returns one ``record_cls``."""
    tables = {name: Interner() for name in STRING_TABLES}
    mod_class: list[int] = []
    n_st = max((int(s.max()) + 1 for _, s, _ in parts if len(s)), default=0)
    st: dict[str, np.ndarray] = {name: np.full(n_st, -1, np.int64) for name in ("st_device", "st_nbytes",
                                 "st_alloc", "st_free", "st_name", "st_owner")}  # fmt: skip
    st["st_roles"] = np.zeros(n_st, np.int64)
    last_part = np.full(n_st, -1, np.int64)
    seen = np.zeros(n_st, bool)
    chunks: dict[str, list[np.ndarray]] = {}
    cells: list[dict[str, Any]] = []
    meta_rows: dict[str, list[Any]] = {}
    op_off = in_off = out_off = t_off = 0
    starts = []

    def add(name: str, arr: np.ndarray) -> None:
        chunks.setdefault(name, []).append(np.asarray(arr, np.int64))

    for i, (rec, serials, label) in enumerate(parts):
        c = rec.columns()
        s = rec.string_tables()
        remap = {t: np.array([tables[t].add(x, x) for x in s[t]], np.int64) for t in STRING_TABLES if t != "modules"}
        before = len(tables["modules"].strings)
        remap["modules"] = np.array([tables["modules"].add(x, x) for x in s["modules"]], np.int64)
        for j, m in enumerate(remap["modules"].tolist()):
            if m >= before and m == len(mod_class):
                k = int(c["mod_class"][j]) if j < len(c["mod_class"]) else -1
                mod_class.append(int(remap["classes"][k]) if k >= 0 else -1)
        n_ops = len(c["op"])
        starts.append(op_off)
        n_tensors = 1 + max((int(c[k].max()) for k in _TENSOR_COLS if len(c[k])), default=-1)
        for name in ("op", "module", "line", "args", "out_shape", "out_stride", "out_dtype", "out_device"):
            add(name, _remap(c[name], remap[_STRING_COLS[name]]))
        for name in ("phase", "flags", "flops", "out_offset", "out_nbytes"):
            add(name, c[name])
        add("in_end", c["in_end"].astype(np.int64) + in_off)
        add("out_end", c["out_end"].astype(np.int64) + out_off)
        add("in_tensor", _shift(c["in_tensor"], t_off))
        add("out_tensor", _shift(c["out_tensor"], t_off))
        add("out_storage", _remap(c["out_storage"], serials))
        add("t_tensor", _shift(c["t_tensor"], t_off))
        add("t_storage", _remap(c["t_storage"], serials))
        for name in ("p_name", "p_module", "p_shape", "p_dtype", "p_device"):
            add(name, _remap(c[name], remap[_STRING_COLS[name]]))
        for name in ("p_offset", "p_numel", "p_nbytes", "p_kind"):
            add(name, c[name])
        add("p_tensor", _shift(c["p_tensor"], t_off))
        add("p_storage", _remap(c["p_storage"], serials))
        add("p_grad", _remap(c["p_grad"], serials))
        # storages: one row per serial, made where it first appeared
        new = ~seen[serials]
        rows = serials[new]
        st["st_device"][rows] = remap["devices"][c["st_device"][new].astype(np.int64)]
        st["st_nbytes"][rows] = c["st_nbytes"][new]
        alloc = c["st_alloc"][new].astype(np.int64)
        st["st_alloc"][rows] = np.where(alloc >= 0, alloc + op_off, -1)
        seen[serials] = True
        st["st_roles"][serials] |= c["st_roles"].astype(np.int64)
        name = _remap(c["st_name"], remap["names"])
        st["st_name"][serials] = np.where(name >= 0, name, st["st_name"][serials])
        owner = _shift(c["st_owner"], t_off)
        st["st_owner"][serials] = np.where(owner >= 0, owner, st["st_owner"][serials])
        free = c["st_free"].astype(np.int64)
        st["st_free"][serials] = np.where(free >= 0, free + op_off, -1)
        last_part[serials] = i
        for key, fields in _SEQ_META.items():
            for row in rec.meta.get(key) or []:
                row = list(row)
                for f in fields:
                    row[f] = int(row[f]) + op_off
                if key == "deepcopies":
                    row[1] = int(row[1]) + t_off
                meta_rows.setdefault(key, []).append(row)
        err = rec.error
        cells.append({"label": label, "start": op_off, "end": op_off + n_ops,
                      "error": f"{err.get('type')}: {err.get('message', '')}"[:300] if err else None})  # fmt: skip
        op_off += n_ops
        in_off += len(c["in_tensor"])
        out_off += len(c["out_tensor"])
        t_off += n_tensors
    # alive at the end of a block but not carried into the next one: it died between the two
    between = (st["st_free"] < 0) & (last_part >= 0) & (last_part < len(parts) - 1)
    st["st_free"][between] = np.array(starts + [op_off], np.int64)[last_part[between] + 1]
    cols = {name: np.concatenate(chunks[name]) if chunks.get(name) else np.zeros(0, np.int64) for name in chunks}
    cols.update(st)
    cols["st_carried"] = np.full(n_st, -1, np.int64)
    cols["mod_class"] = np.array(mod_class, np.int64)
    _last_param_rows(cols)
    out = {name: cols[name].astype(column_dtype(name)) for name in ALL_COLS}
    meta = dict(parts[-1][0].meta)
    meta.pop("cell", None)
    meta.update(meta_rows)
    precision: dict[str, Any] = {}
    for rec, _, _ in parts:  # every block's modules (Note: [weight precision]); a later block's label wins
        precision.update(rec.meta.get("weight_precision") or {})
    if precision:
        meta["weight_precision"] = precision
    meta["cells"] = cells
    return record_cls.from_columns(
        out, {t: list(tables[t].strings) for t in STRING_TABLES}, meta=meta, error=parts[-1][0].error
    )


def _last_param_rows(cols: dict[str, np.ndarray]) -> None:
    """One parameter-table row per name: the last block's (its ``.grad`` at the end), in first-seen order."""
    names = cols["p_name"]
    if not len(names):
        return
    last: dict[int, int] = {}
    for j, n in enumerate(names.tolist()):
        last[n] = j  # dict keeps first-insertion order, value the last row
    keep = np.array(list(last.values()), np.int64)
    for name in [k for k in cols if k.startswith("p_")]:
        cols[name] = cols[name][keep]
