"""The record: a columnar log of one recorded run, the plain data every analysis reads.

Every per-op, per-output and per-storage field lives in a compact typed array
(``array.array`` while recording, NumPy after), and every string (op names,
module paths, user lines, shapes, strides, arg templates) is interned once in a
string table. A 1M-op run therefore costs tens of bytes per op, not a Python
object per field. The columns and tables are declared in :mod:`fakeviz._core.schema`.

The engine fills a record through its :attr:`Record.builder`; analyses read it through
:meth:`Record.col` and :meth:`Record.strings`, and keep what they computed in the one memo,
:meth:`Record.cached`, which is emptied whenever the record grows.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from .schema import ALL_COLS, IN_COLS, MOD_COLS, OP_COLS, OUT_COLS, P_COLS, ST_COLS, STRING_TABLES, T_COLS

__all__ = ["Builder", "Interner", "Record", "fill_args"]

T = TypeVar("T")
TYPECODE_DTYPE = {"b": np.int8, "h": np.int16, "i": np.int32, "q": np.int64}


def column_dtype(name: str) -> np.dtype:
    """The NumPy dtype of column ``name`` (from its typecode in the schema)."""
    return np.dtype(TYPECODE_DTYPE[ALL_COLS[name]])


_ARG_FIELDS = re.compile(r"\{\{|\}\}|\{\}")


def fill_args(template: str, tensor_ids: Sequence[int]) -> str:
    """An op's argument text from its template (the ``args`` string table): ``$id`` for each ``{}``, in order.

    The recorder writes ``{}`` for each tensor input and doubles the braces of literal text (a string argument
    ``'{x}'`` is ``'{{x}}'``). Only those three forms are read: anything else in the template is text, never a
    format field, so a template from a file cannot run a format spec (``{:>200000000}`` stays as it is). A
    ``{}`` without an id left (a malformed file) is written ``$?``.
    """
    if "{" not in template and "}" not in template:
        return template
    n = len(tensor_ids)
    if template.count("{}") == n and template.count("{") == n and template.count("}") == n:
        parts = template.split("{}")  # the common case: bare placeholders, one per tensor
        return parts[0] + "".join(f"${t}{p}" for t, p in zip(tensor_ids, parts[1:]))
    ids = iter(tensor_ids)

    def field(m: re.Match[str]) -> str:
        if m.group() != "{}":
            return m.group()[0]
        t = next(ids, None)
        return "$?" if t is None else f"${t}"

    return _ARG_FIELDS.sub(field, template)


class Interner:
    """A string table: value -> id, with the list of strings."""

    __slots__ = ("ids", "strings")

    def __init__(self, strings: list[str] | None = None) -> None:
        self.strings: list[str] = list(strings or [])
        self.ids: dict[Any, int] = {}

    def add(self, key: Any, text: str) -> int:
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.strings)
            self.strings.append(text)
        return i


class Builder:
    """Append-only rows filled by the recorder.

    While recording, each table is one flat ``array('q')`` with a fixed number
    of fields per row (one ``extend`` per row is the cheapest append Python
    has); :meth:`columns` splits them into typed columns.
    """

    OP_FIELDS = tuple(OP_COLS)
    OUT_FIELDS = tuple(OUT_COLS)
    ST_FIELDS = tuple(ST_COLS)

    def __init__(self) -> None:
        self.op_rows = array("q")
        self.out_rows = array("q")
        self.storage_rows = array("q")
        self.param_rows = array("q")
        self.tensor_rows = array("q")
        self.in_tensor = array("q")
        self.mod_class = array("q")
        self.tables: dict[str, Interner] = {name: Interner() for name in STRING_TABLES}

    def num_ops(self) -> int:
        return len(self.op_rows) // len(OP_COLS)

    def num_storages(self) -> int:
        return len(self.storage_rows) // len(ST_COLS)

    def st_set(self, sid: int, field: str, value: int) -> None:
        self.storage_rows[sid * len(ST_COLS) + self.ST_FIELDS.index(field)] = value

    def st_get(self, sid: int, field: str) -> int:
        return self.storage_rows[sid * len(ST_COLS) + self.ST_FIELDS.index(field)]

    def columns(self) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        groups = (
            (self.op_rows, OP_COLS), (self.out_rows, OUT_COLS), (self.storage_rows, ST_COLS),
            (self.param_rows, P_COLS), (self.tensor_rows, T_COLS),
        )  # fmt: skip
        for data, spec in groups:
            width = len(spec)
            rows = np.frombuffer(data, dtype=np.int64)[: len(data) // width * width].reshape(-1, width)
            for j, (name, code) in enumerate(spec.items()):
                cols[name] = rows[:, j].astype(TYPECODE_DTYPE[code])
        (in_name,) = IN_COLS
        (mod_name,) = MOD_COLS
        cols[in_name] = np.frombuffer(self.in_tensor, dtype=np.int64).copy()
        cols[mod_name] = np.frombuffer(self.mod_class, dtype=np.int64).astype(column_dtype(mod_name))
        return cols


class Record:
    """A recorded run: ops, their outputs, the storages they live in, parameters and modules.

    Columns are filled while recording and readable at any time (also on a partial record, after an
    error inside the recorded block): :meth:`col` and :meth:`strings` copy what the builder holds so
    far. ``meta`` holds the recording's settings, ``error`` what stopped it (None: it ran to the end).
    """

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self.builder: Builder | None = Builder()
        self._cols: dict[str, np.ndarray] = {}
        self._strings: dict[str, list[str]] = {}
        self._memo: dict[Any, Any] = {}
        self._frozen_at = -1  # number of ops when _cols was last built
        self.error: dict[str, Any] | None = None

    @classmethod
    def from_columns(
        cls,
        columns: dict[str, np.ndarray],
        strings: dict[str, list[str]],
        *,
        meta: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> Record:
        """A finished record over columns and string tables read elsewhere (a ``.fvz`` file)."""
        rec = cls(meta=meta)
        rec.builder = None
        rec._cols = dict(columns)
        rec._strings = {k: list(v) for k, v in strings.items()}
        rec.error = error
        rec._frozen_at = len(rec._cols["op"])
        return rec

    # ------------------------------------------------------------------ columns
    def _freeze(self) -> None:
        """Build NumPy columns from the builder (cheap copy; repeated as the record grows)."""
        b = self.builder
        if b is None:
            return
        n = b.num_ops()
        if n == self._frozen_at and self._cols:
            return
        self._cols = b.columns()
        self._strings = {k: list(v.strings) for k, v in b.tables.items()}
        self._memo = {}
        self._frozen_at = n

    def finish(self) -> None:
        """Called when recording ends: drop the builder, keep NumPy columns."""
        self._frozen_at = -1
        self._freeze()
        self.builder = None

    @property
    def recording(self) -> bool:
        """True while the engine is still appending to this record."""
        return self.builder is not None

    def col(self, name: str) -> np.ndarray:
        """One raw column as a NumPy array (the columns are listed in :mod:`fakeviz._core.schema`)."""
        self._freeze()
        return self._cols[name]

    def columns(self) -> dict[str, np.ndarray]:
        """Every column, by name (the arrays themselves: read, do not write)."""
        self._freeze()
        return self._cols

    def strings(self, table: str) -> list[str]:
        """One string table (ops, modules, lines, args, shapes, strides, dtypes, devices, names, classes)."""
        self._freeze()
        return self._strings[table]

    def string_tables(self) -> dict[str, list[str]]:
        """Every string table, by name."""
        self._freeze()
        return self._strings

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        """The memo of analyses: ``compute()`` once per ``key`` while the record does not grow."""
        self._freeze()
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    def clear_memo(self) -> None:
        """Forget every cached analysis (benchmarks time them from scratch)."""
        self._memo = {}

    def __len__(self) -> int:
        return self.builder.num_ops() if self.builder is not None else len(self._cols["op"])

    @property
    def num_ops(self) -> int:
        """Number of recorded ops."""
        return len(self)

    def nbytes(self) -> int:
        """Approximate memory held by the record: columns plus string tables."""
        self._freeze()
        cols = sum(int(a.nbytes) for a in self._cols.values())
        strings = sum(len(x) + 49 for table in self._strings.values() for x in table)
        return cols + strings
