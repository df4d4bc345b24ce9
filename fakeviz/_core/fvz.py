"""The ``.fvz`` file format: a record on disk, read without unpickling.

File format (``.fvz``), version 3
---------------------------------
A ZIP archive (deflated, CRC-checked) holding

* ``fakeviz.json``: ``{"format": "fakeviz-trace", "version": 3, "meta": {...}, "error": {...} | null,
  "strings": {table: [str, ...]}, "columns": {name: {"dtype": str, "length": int}}}``
* one ``columns/<name>.npy`` per column, plain NumPy ``.npy`` of a numeric dtype.

Loading never unpickles: JSON is parsed with :mod:`json` and arrays with
``numpy.load(allow_pickle=False)``; every column's dtype and length is checked
against the header, and cross-references (string ids, offsets) are bounds-checked.
``tests/core/test_fvz_compat.py`` loads a file written before the layer restructure.
Version 2 files (before ``st_carried``: storages carried in from an earlier cell of a fake session) are
read with that column all -1 (nothing carried in), which is what they recorded.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .errors import TraceFormatError
from .record import Record, column_dtype
from .schema import ALL_COLS, OP_COLS, P_COLS, PHASES, ROLES, ST_COLS, STRING_TABLES

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "read", "write"]

FORMAT_NAME = "fakeviz-trace"
FORMAT_VERSION = 3
_READS = {2: {"st_carried": -1}, 3: {}}  # version -> columns it lacks and the value that fills them
R = TypeVar("R", bound=Record)


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data (anything JSON cannot hold becomes its ``str``)."""
    return json.loads(json.dumps(obj, default=str))


def write(record: Record, path: str | Path) -> Path:
    """Write ``record`` to ``path`` (atomically: a ``.tmp`` file renamed into place)."""
    path = Path(path)
    cols = record.columns()
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "meta": jsonable(record.meta),
        "error": jsonable(record.error),
        "strings": record.string_tables(),
        "columns": {k: {"dtype": column_dtype(k).str, "length": len(v)} for k, v in cols.items()},
    }
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("fakeviz.json", json.dumps(header))
        for name, arr in cols.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            zf.writestr(f"columns/{name}.npy", buf.getvalue())
    tmp.replace(path)
    return path


def read(path: str | Path, cls: type[R] = Record) -> R:  # type: ignore[assignment]
    """Read a file written by :func:`write` as a ``cls``. Raises :class:`TraceFormatError` if unreadable."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise TraceFormatError(f"{path}: member {bad!r} is corrupted (CRC mismatch)")
            try:
                header = json.loads(zf.read("fakeviz.json"))
            except KeyError:
                raise TraceFormatError(f"{path}: not a fakeviz trace (no fakeviz.json inside)") from None
            _check_header(path, header)
            cols = {}
            for name, spec in header["columns"].items():
                if name not in ALL_COLS:
                    raise TraceFormatError(f"{path}: unknown column {name!r}")
                arr = np.load(io.BytesIO(zf.read(f"columns/{name}.npy")), allow_pickle=False)
                want = column_dtype(name)
                if arr.dtype != want or arr.ndim != 1 or len(arr) != spec["length"]:
                    raise TraceFormatError(
                        f"{path}: column {name!r} has dtype {arr.dtype}, {arr.ndim} dims, length "
                        f"{len(arr)}; expected {want}, 1 dim, length {spec['length']}"
                    )
                cols[name] = arr
    except TraceFormatError:
        raise
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # zlib, zipfile, numpy, json: any damage means "unreadable"
        raise TraceFormatError(f"{path}: not a readable fakeviz trace ({type(exc).__name__}: {exc})") from exc
    n_st = len(cols["st_device"]) if "st_device" in cols else 0
    for name, fill in _READS[header["version"]].items():
        cols.setdefault(name, np.full(n_st, fill, column_dtype(name)))
    missing = set(ALL_COLS) - set(cols)
    if missing:
        raise TraceFormatError(f"{path}: missing columns {sorted(missing)}")
    strings = {k: list(header["strings"][k]) for k in STRING_TABLES}
    _check_refs(path, cols, strings)
    return cls.from_columns(cols, strings, meta=header.get("meta") or {}, error=header.get("error"))


def _check_header(path: Path, header: Any) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        fmt = header.get("format") if isinstance(header, dict) else None
        raise TraceFormatError(f"{path}: not a fakeviz trace (format field is {fmt!r})")
    if header.get("version") not in _READS:
        raise TraceFormatError(
            f"{path}: trace format version {header.get('version')!r}; this fakeviz reads versions "
            f"{', '.join(map(str, _READS))}"
        )
    strings = header.get("strings")
    if not isinstance(strings, dict) or any(
        not isinstance(strings.get(k), list) or not all(isinstance(x, str) for x in strings[k]) for k in STRING_TABLES
    ):
        raise TraceFormatError(f"{path}: string tables are missing or malformed")


def _check_refs(path: Path, c: dict[str, np.ndarray], s: dict[str, list[str]]) -> None:
    refs = {
        "op": "ops", "module": "modules", "line": "lines", "args": "args", "out_shape": "shapes",
        "out_stride": "strides", "out_dtype": "dtypes", "out_device": "devices", "st_device": "devices",
        "st_name": "names",
    }  # fmt: skip
    for col, table in refs.items():
        a = c[col]
        if len(a) and (a.max() >= len(s[table]) or a.min() < -1):
            raise TraceFormatError(f"{path}: column {col!r} refers past string table {table!r}")
    n_ops = len(c["op"])
    for col in OP_COLS:
        if len(c[col]) != n_ops:
            raise TraceFormatError(f"{path}: column {col!r} has {len(c[col])} rows, expected {n_ops}")
    for end_col, lengths in (("in_end", len(c["in_tensor"])), ("out_end", len(c["out_tensor"]))):
        e = c[end_col]
        if n_ops and (e[-1] != lengths or (np.diff(e) < 0).any() or e[0] < 0):
            raise TraceFormatError(f"{path}: offsets in {end_col!r} are inconsistent")
    if len(c["phase"]) and (c["phase"].min() < 0 or c["phase"].max() >= len(PHASES)):
        raise TraceFormatError(f"{path}: phase codes out of range")
    if len(c["st_roles"]) and (c["st_roles"].min() < 0 or c["st_roles"].max() >= 1 << len(ROLES)):
        raise TraceFormatError(f"{path}: storage role bits out of range")
    if len(c["st_carried"]) and (c["st_carried"].min() < -1 or c["st_carried"].max() >= len(PHASES)):
        raise TraceFormatError(f"{path}: carried-in phase codes out of range")
    n_st = len(c["st_device"])
    for col in ST_COLS:
        if len(c[col]) != n_st:
            raise TraceFormatError(f"{path}: column {col!r} has {len(c[col])} rows, expected {n_st}")
    if len(c["t_tensor"]) != len(c["t_storage"]):
        raise TraceFormatError(f"{path}: input tensor columns differ in length")
    n_p = len(c["p_name"])
    for col in P_COLS:
        if len(c[col]) != n_p:
            raise TraceFormatError(f"{path}: column {col!r} has {len(c[col])} rows, expected {n_p}")
    if len(c["mod_class"]) != len(s["modules"]):
        raise TraceFormatError(f"{path}: module class column does not match the module table")
    for col, table in (("p_module", "modules"), ("p_shape", "shapes"), ("p_dtype", "dtypes"),
                       ("p_device", "devices"), ("mod_class", "classes")):  # fmt: skip
        a = c[col]
        if len(a) and (a.max() >= len(s[table]) or a.min() < -1):
            raise TraceFormatError(f"{path}: column {col!r} refers past string table {table!r}")
    for col in ("p_storage", "p_grad", "p_name", "t_storage"):
        a = c[col]
        limit = len(s["names"]) if col == "p_name" else n_st
        if len(a) and (a.max() >= limit or a.min() < -1):
            raise TraceFormatError(f"{path}: column {col!r} has out-of-range references")
