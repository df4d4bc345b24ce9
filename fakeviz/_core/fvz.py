"""The ``.fvz`` file format: a record on disk, read without unpickling.

File format (``.fvz``), version 3
---------------------------------
A ZIP archive (deflated, CRC-checked) holding

* ``fakeviz.json``: ``{"format": "fakeviz-trace", "version": 3, "meta": {...}, "error": {...} | null,
  "strings": {table: [str, ...]}, "columns": {name: {"dtype": str, "length": int}}}``
* one ``columns/<name>.npy`` per column, plain NumPy ``.npy`` of a numeric dtype.

Loading never unpickles: JSON is parsed with :mod:`json` and arrays are read from their ``.npy`` header and
raw bytes (never ``allow_pickle``). ``tests/core/test_fvz_compat.py`` loads a file written before the layer
restructure. Version 2 files (before ``st_carried``: storages carried in from an earlier cell of a fake
session) are read with that column all -1 (nothing carried in), which is what they recorded.

Checks and limits (Note: [a file is data])
------------------------------------------
A file is checked once, at load; anything wrong is one :class:`TraceFormatError` naming the file and the field.
Nothing is inflated before its size is known to be sane:

* every member's declared size (the ZIP directory) must agree with the trace header (a column's dtype and
  length) and, once its ``.npy`` header is read, with that header's dtype and shape; each member is read in
  1 MiB chunks into a buffer of its declared size, never more;
* all members together inflate to at most 16 MiB + 100 x the file's size (real traces compress 5-30x);
* ``fakeviz.json`` is at most 32 MiB of ASCII (what :func:`write` makes) with at most about 2,000,000 JSON
  values outside its strings (commas and brackets counted: each value is a Python object once parsed);
* a string is at most 4 MiB (``args``: an op's arguments, a foreach op's lists; ``names``: tied parameter
  names) or 16 KiB (every other table) long; a string inside ``meta`` or ``error`` at most 64 KiB;
* the op log the file describes (every op's name and arguments, every output's dtype, shape and device) is
  at most 16 MiB + 256 characters per op, input and output row;
* ``meta`` is an object and ``error`` null or an object, with the fields fakeviz reads of the types it reads;
* every column value is in range: string ids inside their table, storage ids inside the storage table,
  op seqs inside the op log, codes (phase, role bits, flags, parameter kind) among their values, tensor ids
  below 2**53, byte counts -1 (symbolic) or more, and each byte column's total below 2**62 (int64 sums).

A string of the file is data: an op's arguments are filled in by :func:`fakeviz._core.record.fill_args`,
never by ``str.format``. :func:`write` cuts a string longer than its table's limit (marked with ``…``) and
refuses a header over its limit, so what a recording holds is never refused for those.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import uuid
import zipfile
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .errors import ArgumentError, TraceFormatError
from .gpus import Capacity
from .record import Record, column_dtype
from .schema import ALL_COLS, OP_COLS, OUT_COLS, P_COLS, PHASES, ROLES, ST_COLS, STRING_TABLES, T_COLS

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "from_bytes", "read", "to_bytes", "write"]

FORMAT_NAME = "fakeviz-trace"
FORMAT_VERSION = 3
_READS = {2: {"st_carried": -1}, 3: {}}  # version -> columns it lacks and the value that fills them
R = TypeVar("R", bound=Record)

# Note: [a file is data]
# A .fvz comes from anywhere (a colleague, a bug report, a download), so reading one must cost memory and
# time in proportion to what a real record of that size costs, and everything after load must be able to trust
# it. The limits below are checked before anything is inflated or parsed further; each is far above what a
# recording makes (a 20k-op training step: a 111 KB header, strings under 200 characters, 2.5 MB of columns
# from a 266 KB file; a 3,000-parameter foreach AdamW: one 105 KB argument string). Strings are never used as
# format templates (fill_args), and no column value sends an analysis outside an array or past int64.
MAX_HEADER_BYTES = 32 << 20  # fakeviz.json
MAX_HEADER_VALUES = 2_000_000  # JSON values outside strings (each a Python object: about 64 bytes)
MAX_STRING = {"args": 4 << 20, "names": 4 << 20}  # characters per string, by table
MAX_SHORT_STRING = 16 << 10  # every other table: op names, modules, user lines, shapes, strides, dtypes, devices
INFLATE_FLOOR = 16 << 20  # all members together: this + INFLATE_RATIO x the file's size
INFLATE_RATIO = 100
TEXT_FLOOR = 16 << 20  # characters of the whole op log: this + TEXT_PER_ROW x (ops + inputs + outputs)
TEXT_PER_ROW = 256
MAX_TENSOR_ID = 1 << 53  # exact in JavaScript (the explorer)
MAX_BYTES_TOTAL = 1 << 62  # a byte column's sum: int64 stays exact through sums and the allocator's rounding
_MAX_META_STRING = 64 << 10  # a string inside meta or error
_CHUNK = 1 << 20
_NPY_HEADER_MAX = 1 << 16
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data (anything JSON cannot hold becomes its ``str``)."""
    return json.loads(json.dumps(obj, default=str))


def _string_limit(table: str) -> int:
    return MAX_STRING.get(table, MAX_SHORT_STRING)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut_all(value: Any) -> Any:
    """``value`` (plain JSON data) with every string cut to the limit of strings in ``meta`` and ``error``."""
    if isinstance(value, str):
        return _cut(value, _MAX_META_STRING)
    if isinstance(value, list):
        return [_cut_all(x) for x in value]
    if isinstance(value, dict):
        return {_cut(k, _MAX_META_STRING): _cut_all(v) for k, v in value.items()}
    return value


def write(record: Record, path: str | Path) -> Path:
    """Write ``record`` to ``path`` (atomically: a new temporary file beside it, renamed into place).

    ``path`` must be a new path or a regular file (a symlink is replaced, never followed): a device, FIFO, socket
    or folder, or a symlink to one, is refused before anything is written, and checked again just before the
    rename (as root, a rename over ``/dev/full`` replaced the device with the trace). The temporary file is
    created exclusively (``O_EXCL | O_NOFOLLOW``, a name of its own), so no file of that name is written through.
    A string longer than its table's limit is cut (marked with ``…``); a record whose header would pass the
    header limit is refused with :class:`TraceFormatError` before anything is written (see the module docstring).

    Raises:
        ArgumentError: ``path`` is not a regular file or a new path.
        FileNotFoundError: its folder does not exist.
    """
    path = Path(path)
    text, cols = _header_text(record, path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the folder {path.parent} does not exist; create it or save elsewhere")
    _check_target(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask applies, as to any new file
    try:
        with os.fdopen(fd, "wb") as f:
            _archive(f, text, cols)
        _check_target(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def _check_target(path: Path) -> None:
    """Refuse to save onto anything but a regular file or a new path (a symlink: onto what it names)."""
    try:
        st = os.stat(path)  # through a symlink: what the user's name stands for
    except (FileNotFoundError, NotADirectoryError):
        return  # a new path, or a dangling symlink (replaced, its target never created)
    if stat.S_ISREG(st.st_mode):
        return
    kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
    link = " (through a symlink)" if path.is_symlink() else ""
    raise ArgumentError("path", str(path), f"{kind}{link}, not a regular file: saving never replaces one",
                        "Give the path of a .fvz file, new or one to replace.")  # fmt: skip


def to_bytes(record: Record) -> bytes:
    """``record`` as the bytes of a ``.fvz`` file (what :func:`write` would write), for sending a record between
    processes (:mod:`fakeviz._frontends.executors`) without a file and without pickling it."""
    text, cols = _header_text(record, "<bytes>")
    buf = io.BytesIO()
    _archive(buf, text, cols)
    return buf.getvalue()


def _header_text(record: Record, where: Any) -> tuple[str, dict[str, np.ndarray]]:
    cols = record.columns()
    strings = {k: [_cut(x, _string_limit(k)) for x in v] for k, v in record.string_tables().items()}
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "meta": _cut_all(jsonable(record.meta)),
        "error": _cut_all(jsonable(record.error)),
        "strings": strings,
        "columns": {k: {"dtype": column_dtype(k).str, "length": len(v)} for k, v in cols.items()},
    }
    text = json.dumps(header)
    if len(text) > MAX_HEADER_BYTES:
        raise TraceFormatError(
            f"{where}: this record's header (string tables and meta) is {len(text):,} bytes, over the "
            f"{MAX_HEADER_BYTES:,}-byte limit of the .fvz format; it cannot be saved as one file"
        )
    return text, cols


def _archive(target: Any, text: str, cols: dict[str, np.ndarray]) -> None:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("fakeviz.json", text)
        for name, arr in cols.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            zf.writestr(f"columns/{name}.npy", buf.getvalue())


def read(path: str | Path, cls: type[R] = Record) -> R:  # type: ignore[assignment]
    """Read a file written by :func:`write` as a ``cls``.

    Raises:
        TraceFormatError: the file is not a readable trace, or breaks a limit of the format (module docstring).
        FileNotFoundError, IsADirectoryError, PermissionError: as :func:`open` does.
    """
    path = Path(path)
    return _read(path, path, path.stat().st_size, cls)


def from_bytes(data: bytes, cls: type[R] = Record, name: str = "<bytes>") -> R:  # type: ignore[assignment]
    """Read the bytes of a ``.fvz`` file (:func:`to_bytes`) as a ``cls``, with every check :func:`read` makes
    (``name`` stands for the file in its errors). Raises :class:`TraceFormatError` as :func:`read` does."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"from_bytes: expected the bytes of a .fvz file, got {type(data).__name__}")
    return _read(io.BytesIO(bytes(data)), Path(name), len(data), cls)


def _read(source: Any, path: Path, size: int, cls: type[R]) -> R:
    try:
        with zipfile.ZipFile(source) as zf:
            members = {info.filename: info for info in zf.infolist()}
            if len(members) != len(zf.infolist()):  # zipfile reads the last of two same names: which was meant?
                seen: set[str] = set()
                dup = next(i.filename for i in zf.infolist() if i.filename in seen or seen.add(i.filename))
                raise _fail(path, f"two members are named {dup[:60]!r}; a trace holds each once")
            header = _read_header(path, zf, members)
            _check_header(path, header)
            specs = _check_members(path, header, members, size)
            cols = {name: _read_column(path, zf, members[f"columns/{name}.npy"], name, n) for name, n in specs.items()}
    except TraceFormatError:
        raise
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # noqa: BLE001 - zlib, zipfile, numpy, json: any damage means "unreadable"
        raise TraceFormatError(
            f"{path}: not a readable fakeviz trace ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    n_st = len(cols["st_device"]) if "st_device" in cols else 0
    for name, fill in _READS[header["version"]].items():
        cols.setdefault(name, np.full(n_st, fill, column_dtype(name)))
    missing = set(ALL_COLS) - set(cols)
    if missing:
        names = ", ".join(sorted(missing)[:4]) + (", ..." if len(missing) > 4 else "")
        raise _fail(path, f"{len(missing)} columns are missing ({names})")
    strings = {k: header["strings"][k] for k in STRING_TABLES}
    _check_refs(path, cols, strings)
    _check_text(path, cols, strings)
    return cls.from_columns(cols, strings, meta=header["meta"], error=header["error"])


def _fail(path: Path, what: str) -> TraceFormatError:
    return TraceFormatError(f"{path}: {what}; the file is damaged or not a fakeviz trace (save the run again)")


def _read_header(path: Path, zf: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo]) -> Any:
    info = members.get("fakeviz.json")
    if info is None:
        raise TraceFormatError(f"{path}: not a fakeviz trace (no fakeviz.json inside)")
    if info.file_size > MAX_HEADER_BYTES:
        raise _fail(path, f"fakeviz.json is {info.file_size:,} bytes, over the {MAX_HEADER_BYTES:,}-byte limit")
    with zf.open(info) as f:
        raw = f.read(MAX_HEADER_BYTES + 1)
    if len(raw) > MAX_HEADER_BYTES:  # zipfile stops at the declared size; belt and braces
        raise _fail(path, f"fakeviz.json is over the {MAX_HEADER_BYTES:,}-byte limit")
    if not raw.isascii():
        raise _fail(path, "fakeviz.json is not ASCII JSON")
    shape = _STRING_RE.sub(b"", raw)  # what is left outside strings: the JSON values themselves
    values = shape.count(b",") + shape.count(b"[") + shape.count(b"{")
    del shape
    if values > MAX_HEADER_VALUES:
        raise _fail(path, f"fakeviz.json holds about {values:,} values, over the limit of {MAX_HEADER_VALUES:,}")
    try:
        return json.loads(raw)
    except RecursionError:
        raise _fail(path, "fakeviz.json is nested too deeply") from None
    except ValueError as exc:
        raise _fail(path, f"fakeviz.json is not valid JSON ({str(exc)[:120]})") from None


def _check_header(path: Path, header: Any) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        fmt = header.get("format") if isinstance(header, dict) else None
        raise TraceFormatError(f"{path}: not a fakeviz trace (format field is {str(fmt)[:80]!r})")
    version = header.get("version")
    if type(version) is not int or version not in _READS:
        raise TraceFormatError(
            f"{path}: trace format version {str(version)[:40]!r}; this fakeviz reads versions "
            f"{', '.join(map(str, _READS))} (a newer fakeviz may read it)"
        )
    strings = header.get("strings")
    if not isinstance(strings, dict):
        raise _fail(path, "the string tables are missing")
    for table in STRING_TABLES:
        values = strings.get(table)
        if not isinstance(values, list) or not all(type(x) is str for x in values):
            raise _fail(path, f"string table {table!r} is missing or not a list of strings")
        limit = _string_limit(table)
        for i, x in enumerate(values):
            if len(x) > limit:
                raise _fail(
                    path, f"string {i} of table {table!r} is {len(x):,} characters, over the limit of {limit:,}"
                )
            if not x.isascii() and not _utf8(x):
                raise _fail(path, f"string {i} of table {table!r} is not valid Unicode")
    header["meta"] = _check_meta(path, header.get("meta"))
    header["error"] = _check_error(path, header.get("error"))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\\ud800"): printing or writing it would fail later
        return False
    return True


# ----------------------------------------------------------------- meta and error
_SCALAR = (str, int, float, type(None))  # bool is an int
# meta lists of rows: key -> (row length, or the least length when `more`, types of the leading fields, more)
_META_ROWS: dict[str, tuple[int, tuple[Any, ...], bool]] = {
    "steps": (3, (int, int, _SCALAR), False),  # [start, stop, label]: prefill and decode steps
    "assumptions": (3, (int, _SCALAR, _SCALAR), True),  # [seq, op, text, module?, user_line?]
    "fallback_kernels": (2, (int, _SCALAR), False),  # [seq, op]
    "attention_calls": (4, (int, _SCALAR, _SCALAR, _SCALAR), False),  # [seq, backend, setting, reason]
    "deepcopies": (2, (int, int), False),  # [seq, tensor]
}


def _is(value: Any, types: Any) -> bool:
    if types is int:
        return type(value) is int
    return isinstance(value, types)


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    """``meta``, checked where fakeviz reads it; any other key may hold any JSON (it is shown, never used)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _fail(path, f"'meta' is a {_json_type(meta)}, not an object")
    _check_strings(path, "meta", meta)
    for key, (n, types, more) in _META_ROWS.items():
        rows = meta.get(key)
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise _fail(path, f"meta[{key!r}] is a {_json_type(rows)}, not a list")
        for i, row in enumerate(rows):
            if (
                not (isinstance(row, list) and (len(row) >= n if more else len(row) == n))
                or not all(_is(x, t) for x, t in zip(row, types))
                or not all(isinstance(x, _SCALAR) for x in row)
            ):
                raise _fail(
                    path, f"meta[{key!r}][{i}] is not a row of {n} values ({', '.join(map(_type_name, types))})"
                )
    for key in ("fake", "symbolic"):
        if key in meta and not isinstance(meta[key], bool):
            raise _fail(path, f"meta[{key!r}] is a {_json_type(meta[key])}, not true or false")
    if not isinstance(meta.get("capacity_spec"), _SCALAR):
        raise _fail(path, f"meta['capacity_spec'] is a {_json_type(meta['capacity_spec'])}, not a GPU or a size")
    capacity = meta.get("capacity")
    if capacity not in (None, ""):
        try:
            if not isinstance(capacity, (str, int, float)):
                raise ValueError(capacity)
            if not 0 < Capacity.parse(capacity).bytes <= MAX_BYTES_TOTAL:
                raise ValueError(capacity)
        except (ValueError, OverflowError):
            raise _fail(path, f"meta['capacity'] is {str(capacity)[:60]!r}, not a GPU name or a size") from None
    cuda_api = meta.get("cuda_api")
    if cuda_api is not None:
        if not isinstance(cuda_api, dict):
            raise _fail(path, f"meta['cuda_api'] is a {_json_type(cuda_api)}, not an object")
        if not isinstance(cuda_api.get("elapsed_time", 0), (int, float)) or not math.isfinite(
            cuda_api.get("elapsed_time", 0)
        ):
            raise _fail(path, "meta['cuda_api']['elapsed_time'] is not a count")
        seqs = cuda_api.get("empty_cache") or []
        if not isinstance(seqs, list) or not all(type(x) is int for x in seqs):
            raise _fail(path, "meta['cuda_api']['empty_cache'] is not a list of op seqs")
    dist = meta.get("distributed")
    if dist is not None:
        groups = dist.get("groups", {}) if isinstance(dist, dict) else None
        if not isinstance(groups, dict) or not isinstance(dist.get("rank"), (int, type(None))):
            raise _fail(path, "meta['distributed'] is not {'groups': {...}, 'rank': int}")
        for name, group in groups.items():
            ranks = group.get("ranks") if isinstance(group, dict) else None
            if not isinstance(group, dict) or not (
                ranks is None or (isinstance(ranks, list) and all(type(r) is int for r in ranks))
            ):
                raise _fail(path, f"meta['distributed']['groups'][{name[:60]!r}] is not {{'ranks': [int, ...]}}")
    return meta


_ERROR_TEXT = ("type", "message", "op", "module", "user_line", "phase", "call", "called_at")


def _check_error(path: Path, error: Any) -> dict[str, Any] | None:
    """``error``: null, or what stopped the recorded run (``type`` and, as text, ``message``, ``op``, ...)."""
    if error is None:
        return None
    if not isinstance(error, dict):
        raise _fail(path, f"'error' is a {_json_type(error)}, not an object or null")
    _check_strings(path, "error", error)
    if type(error.get("type")) is not str:
        raise _fail(path, "error['type'] is missing or not a string")
    for key in _ERROR_TEXT:
        if not isinstance(error.get(key), (str, type(None))):
            raise _fail(path, f"error[{key!r}] is a {_json_type(error[key])}, not a string")
    if not isinstance(error.get("seq"), (int, type(None))) or isinstance(error.get("seq"), bool):
        raise _fail(path, "error['seq'] is not an op seq")
    return error


def _check_strings(path: Path, where: str, value: Any) -> None:
    """Every string (and object key) inside ``value``: at most 64 KiB, valid Unicode."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and (len(v) > _MAX_META_STRING or (not v.isascii() and not _utf8(v))):
            what = "longer than 65,536 characters" if len(v) > _MAX_META_STRING else "not valid Unicode"
            raise _fail(path, f"a string in {where!r} is {what}")


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null"
    )


def _type_name(types: Any) -> str:
    return "int" if types is int else "value"


# ----------------------------------------------------------------- members and columns
def _check_members(
    path: Path, header: dict[str, Any], members: dict[str, zipfile.ZipInfo], size: int
) -> dict[str, int]:
    """The columns to read, name -> length, once the header, the ZIP directory and the size limit agree."""
    spec = header.get("columns")
    if not isinstance(spec, dict):
        raise _fail(path, "the column list is missing")
    lengths: dict[str, int] = {}
    total = members["fakeviz.json"].file_size
    for name, col in spec.items():
        if name not in ALL_COLS:
            raise TraceFormatError(f"{path}: unknown column {name[:60]!r} (written by a newer fakeviz?)")
        want = column_dtype(name)
        if not isinstance(col, dict) or col.get("dtype") != want.str or type(col.get("length")) is not int:
            raise _fail(path, f"column {name!r} is not declared as {{'dtype': {want.str!r}, 'length': int}}")
        n = col["length"]
        if not 0 <= n < 1 << 48:
            raise _fail(path, f"column {name!r} declares {str(n)[:24]} rows")
        info = members.get(f"columns/{name}.npy")
        if info is None:
            raise _fail(path, f"column {name!r} has no member columns/{name}.npy")
        data = n * want.itemsize
        if not data + 10 <= info.file_size <= data + _NPY_HEADER_MAX:
            raise _fail(path, f"columns/{name}.npy is {info.file_size:,} bytes, the header says {n:,} rows of {want}")
        lengths[name] = n
        total += info.file_size
    budget = INFLATE_FLOOR + INFLATE_RATIO * size
    if total > budget:
        raise _fail(
            path, f"its members inflate to {total:,} bytes from a {size:,}-byte file, over the limit of {budget:,}"
        )
    groups = (("op", OP_COLS), ("out_tensor", OUT_COLS), ("st_device", ST_COLS), ("p_name", P_COLS),
              ("t_tensor", T_COLS))  # fmt: skip
    for first, group in groups:
        for name in group:
            if name in lengths and first in lengths and lengths[name] != lengths[first]:
                raise _fail(path, f"column {name!r} has {lengths[name]:,} rows, {first!r} has {lengths[first]:,}")
    return lengths


def _read_column(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, n: int) -> np.ndarray:
    """One ``.npy`` member as a 1-D array of ``n`` rows, read in bounded memory (never unpickled)."""
    want = column_dtype(name)
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=_NPY_HEADER_MAX)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=_NPY_HEADER_MAX)
        else:
            raise _fail(path, f"columns/{name}.npy is .npy version {version}")
        if dtype != want or shape != (n,):
            raise _fail(path, f"column {name!r} is {dtype} of shape {shape}, the header says {want} of ({n},)")
        if f.tell() + n * want.itemsize != info.file_size:
            raise _fail(path, f"columns/{name}.npy is {info.file_size:,} bytes, not a .npy of {n:,} rows")
        buf = bytearray(n * want.itemsize)
        view = memoryview(buf)
        pos = 0
        while pos < len(buf):
            chunk = f.read(min(_CHUNK, len(buf) - pos))
            if not chunk:
                break
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        if pos != len(buf) or f.read(1):
            raise _fail(path, f"columns/{name}.npy does not hold {n:,} rows")
    return np.frombuffer(buf, dtype=want)


# ----------------------------------------------------------------- column values
# column -> string table it indexes, and whether -1 (none) is allowed
_STRING_REFS = {
    "op": ("ops", False), "module": ("modules", True), "line": ("lines", True), "args": ("args", False),
    "out_shape": ("shapes", False), "out_stride": ("strides", False), "out_dtype": ("dtypes", False),
    "out_device": ("devices", False), "st_device": ("devices", False), "st_name": ("names", True),
    "p_name": ("names", False), "p_module": ("modules", True), "p_shape": ("shapes", False),
    "p_dtype": ("dtypes", False), "p_device": ("devices", False), "mod_class": ("classes", False),
}  # fmt: skip
_TENSOR_IDS = {"in_tensor": 0, "out_tensor": 0, "t_tensor": 0, "p_tensor": 0, "st_owner": -1}  # column -> least
_STORAGE_REFS = ("out_storage", "p_storage", "p_grad", "t_storage")  # -1: none
_AT_LEAST = {"flops": -1, "out_offset": -1, "p_offset": -1}
_BYTES = ("out_nbytes", "st_nbytes", "p_nbytes", "p_numel")  # -1: symbolic; sums stay exact in int64
_CODES = {  # column -> (least, most)
    "phase": (0, len(PHASES) - 1), "flags": (0, 7), "st_roles": (0, (1 << len(ROLES)) - 1),
    "st_carried": (-1, len(PHASES) - 1), "p_kind": (0, 1),
}  # fmt: skip


def _out_of_range(a: np.ndarray, lo: int, hi: int | None = None) -> bool:
    return bool(len(a)) and (int(a.min()) < lo or (hi is not None and int(a.max()) > hi))


def _check_refs(path: Path, c: dict[str, np.ndarray], s: dict[str, list[str]]) -> None:
    n_ops, n_st = len(c["op"]), len(c["st_device"])
    for col, (table, none) in _STRING_REFS.items():
        if _out_of_range(c[col], -1 if none else 0, len(s[table]) - 1):
            raise _fail(path, f"column {col!r} refers outside string table {table!r} ({len(s[table])} strings)")
    if len(c["mod_class"]) != len(s["modules"]):
        raise _fail(path, "column 'mod_class' does not match the module table")
    for end_col, tail in (("in_end", len(c["in_tensor"])), ("out_end", len(c["out_tensor"]))):
        e = c[end_col]
        if (n_ops and (e[-1] != tail or e[0] < 0 or (np.diff(e) < 0).any())) or (not n_ops and tail):
            raise _fail(path, f"offsets in {end_col!r} are inconsistent")
    for col, (lo, hi) in _CODES.items():
        if _out_of_range(c[col], lo, hi):
            raise _fail(path, f"column {col!r} holds codes outside {lo}..{hi}")
    for col, lo in _TENSOR_IDS.items():
        if _out_of_range(c[col], lo, MAX_TENSOR_ID - 1):
            raise _fail(path, f"column {col!r} holds tensor ids outside {lo}..2**53-1")
    for col in _STORAGE_REFS:
        if _out_of_range(c[col], -1, n_st - 1):
            raise _fail(path, f"column {col!r} refers outside the {n_st:,} storages")
    for col in ("st_alloc", "st_free"):  # an op seq, or the number of ops recorded at the time; -1 none
        if _out_of_range(c[col], -1, n_ops):
            raise _fail(path, f"column {col!r} refers outside the {n_ops:,} ops")
    for col, lo in _AT_LEAST.items():
        if _out_of_range(c[col], lo):
            raise _fail(path, f"column {col!r} holds values below {lo}")
    for col in _BYTES:
        a = c[col]
        if _out_of_range(a, -1) or float(np.maximum(a, 0).sum(dtype=np.float64)) >= MAX_BYTES_TOTAL:
            raise _fail(path, f"column {col!r} holds counts below -1, or adding up to 2**62 or more")
    if float(np.maximum(c["flops"], 0).sum(dtype=np.float64)) >= 2.0**63 * 0.99:
        raise _fail(path, "column 'flops' adds up past int64")


def _check_text(path: Path, c: dict[str, np.ndarray], s: dict[str, list[str]]) -> None:
    """The op log the file describes stays within TEXT_FLOOR + TEXT_PER_ROW per row (Note: [a file is data])."""

    def chars(col: str, table: str) -> int:
        lengths = np.fromiter(map(len, s[table]), dtype=np.int64, count=len(s[table]))
        a = c[col]
        return int(lengths[a[a >= 0]].sum()) if len(lengths) else 0

    text = chars("op", "ops") + chars("args", "args") + 16 * len(c["in_tensor"])
    text += sum(chars(col, table) for col, table in (("out_shape", "shapes"), ("out_dtype", "dtypes"),
                                                    ("out_device", "devices")))  # fmt: skip
    rows = len(c["op"]) + len(c["in_tensor"]) + len(c["out_tensor"])
    limit = TEXT_FLOOR + TEXT_PER_ROW * rows
    if text > limit:
        raise _fail(path, f"its op log would be {text:,} characters, over the limit of {limit:,} for {rows:,} rows")
