"""The Trace: a columnar record of one recorded run.

Every per-op, per-output and per-storage field lives in a compact typed array
(``array.array`` while recording, NumPy after), and every string (op names,
module paths, user lines, shapes, strides, arg templates) is interned once in a
string table. A 1M-op run therefore costs tens of bytes per op, not a Python
object per field.

File format (``.fvz``), version 1
---------------------------------
A ZIP archive (stored, CRC-checked) holding

* ``fakeviz.json``: ``{"format": "fakeviz-trace", "version": 1, "meta": {...},
  "strings": {table: [str, ...]}, "columns": {name: {"dtype": str, "length": int}}}``
* one ``columns/<name>.npy`` per column, plain NumPy ``.npy`` of a numeric dtype.

Loading never unpickles: JSON is parsed with :mod:`json` and arrays with
``numpy.load(allow_pickle=False)``; every column's dtype and length is checked
against the header, and cross-references (string ids, offsets) are bounds-checked.
"""

from __future__ import annotations

import html
import io
import json
import zipfile
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import TraceFormatError

__all__ = ["CATEGORIES", "PHASES", "ROLES", "Trace", "load"]

FORMAT_NAME = "fakeviz-trace"
FORMAT_VERSION = 2

PHASES = ("init", "forward", "backward", "optimizer", "other")
# What the recorder saw a storage used as (a bitmask per storage, bit i = ROLES[i]):
# a parameter or buffer of a module, an input of a top-level module call, the .grad
# of a leaf, optimizer state, or saved for backward (autograd's saved-tensor hooks).
ROLES = ("parameter", "buffer", "input", "gradient", "optimizer", "saved")
ROLE_PARAM, ROLE_BUFFER, ROLE_INPUT, ROLE_GRAD, ROLE_OPT, ROLE_SAVED = (1 << i for i in range(len(ROLES)))
# Memory categories (see fakeviz._memory for how roles and phases map onto them).
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Optimizer state", "Activation", "Temporary", "Input", "Other")

FLAG_VIEW = 1  # the op's output aliases an input (schema alias info, no write)
FLAG_INPLACE = 2  # the op writes one of its inputs (in-place or out= variant)
FLAG_DATA_DEPENDENT = 4  # an output shape contains unbacked symbols

# name -> typecode for array.array; NumPy dtypes follow from the item size.
_OP_COLS = {
    "op": "i",  # string id in "ops"
    "phase": "b",
    "module": "i",  # string id in "modules", -1 none
    "line": "i",  # string id in "lines", -1 unknown
    "args": "i",  # string id in "args" (template with {} per tensor input)
    "in_end": "q",  # end offset into the inputs column
    "out_end": "q",  # end offset into the output columns
    "flags": "b",
    "flops": "q",  # FLOPs of the op (fakeviz._flops), -1 no formula
}
_IN_COLS = {"in_tensor": "q"}
# a recorded tensor's __dict__["_fakeviz_tid"] is base + id, ids in the low TID_BITS bits
# (see Note: [tensor tags] in _recorder)
TID_BITS = 40
TID_MASK = (1 << TID_BITS) - 1

_OUT_COLS = {
    "out_tensor": "q",
    "out_shape": "i",  # string id in "shapes"
    "out_stride": "i",  # string id in "strides"
    "out_dtype": "h",  # string id in "dtypes"
    "out_device": "h",  # string id in "devices"
    "out_storage": "q",
    "out_offset": "q",
    "out_nbytes": "q",  # -1 when symbolic
}
_ST_COLS = {
    "st_device": "h",
    "st_nbytes": "q",  # -1 when symbolic
    "st_alloc": "q",  # op seq that first produced it; -1 existed before recording
    "st_free": "q",  # number of ops recorded when it was freed; -1 alive at the end
    "st_roles": "b",  # bitmask of ROLES
    "st_name": "i",  # string id in "names" (parameter/buffer FQNs joined by "|"), -1
    "st_owner": "q",  # tensor id of the parameter whose gradient/optimizer state this is, -1
}
# one row per parameter/buffer name of every module seen (tied names get one row each)
_P_COLS = {
    "p_name": "i",  # string id in "names": the full name "Root.layers.0.mlp.weight"
    "p_module": "i",  # string id in "modules" of the owning module
    "p_tensor": "q",  # tensor id ($N); tied names share it
    "p_storage": "q",
    "p_offset": "q",
    "p_numel": "q",
    "p_nbytes": "q",  # bytes of this tensor (numel * itemsize), -1 symbolic
    "p_shape": "i",  # string id in "shapes"
    "p_dtype": "h",
    "p_device": "h",
    "p_kind": "b",  # 0 parameter, 1 buffer
    "p_grad": "q",  # storage id of its .grad at the end (-1 none)
}
# tensors first seen as op inputs (never produced by a recorded op): their storage
_T_COLS = {"t_tensor": "q", "t_storage": "q"}
# aligned with the "modules" string table
_MOD_COLS = {"mod_class": "i"}  # string id in "classes"
_ALL_COLS = {**_OP_COLS, **_IN_COLS, **_OUT_COLS, **_ST_COLS, **_P_COLS, **_T_COLS, **_MOD_COLS}
_TYPECODE_DTYPE = {"b": np.int8, "h": np.int16, "i": np.int32, "q": np.int64}
STRING_TABLES = ("ops", "modules", "lines", "args", "shapes", "strides", "dtypes", "devices", "names", "classes")

_DTYPE_ABBR = {
    "torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16", "torch.bfloat16": "bf16",
    "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
    "torch.uint8": "u8", "torch.bool": "b8", "torch.complex64": "c64", "torch.complex128": "c128",
    "torch.float8_e4m3fn": "f8e4m3fn", "torch.float8_e5m2": "f8e5m2",
}  # fmt: skip


class _Interner:
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


class _Builder:
    """Append-only rows filled by the recorder.

    While recording, each table is one flat ``array('q')`` with a fixed number
    of fields per row (one ``extend`` per row is the cheapest append Python
    has); :meth:`Trace._freeze` splits them into typed columns.
    """

    OP_FIELDS = tuple(_OP_COLS)
    OUT_FIELDS = tuple(_OUT_COLS)
    ST_FIELDS = tuple(_ST_COLS)

    def __init__(self) -> None:
        self.opd = array("q")
        self.outd = array("q")
        self.std = array("q")
        self.pd = array("q")
        self.td = array("q")
        self.in_tensor = array("q")
        self.mod_class = array("q")
        self.tables: dict[str, _Interner] = {name: _Interner() for name in STRING_TABLES}

    def num_ops(self) -> int:
        return len(self.opd) // len(_OP_COLS)

    def num_storages(self) -> int:
        return len(self.std) // len(_ST_COLS)

    def st_set(self, sid: int, field: str, value: int) -> None:
        self.std[sid * len(_ST_COLS) + self.ST_FIELDS.index(field)] = value

    def st_get(self, sid: int, field: str) -> int:
        return self.std[sid * len(_ST_COLS) + self.ST_FIELDS.index(field)]

    def columns(self) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        groups = (
            (self.opd, _OP_COLS), (self.outd, _OUT_COLS), (self.std, _ST_COLS), (self.pd, _P_COLS),
            (self.td, _T_COLS),
        )  # fmt: skip
        for data, spec in groups:
            width = len(spec)
            rows = np.frombuffer(data, dtype=np.int64)[: len(data) // width * width].reshape(-1, width)
            for j, (name, code) in enumerate(spec.items()):
                cols[name] = rows[:, j].astype(_TYPECODE_DTYPE[code])
        cols["in_tensor"] = np.frombuffer(self.in_tensor, dtype=np.int64).copy()
        cols["mod_class"] = np.frombuffer(self.mod_class, dtype=np.int64).astype(np.int32)
        return cols


class Trace:
    """A recorded run: ops, their outputs, and the storages they live in.

    Columns are filled while recording; the DataFrame views (:attr:`ops`,
    :attr:`outputs`, :attr:`storages`) are built on demand and are valid also on
    a partial trace (after an error inside :func:`fakeviz.record`).
    """

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta: dict[str, Any] = dict(meta or {})
        self._b: _Builder | None = _Builder()
        self._cols: dict[str, np.ndarray] = {}
        self._strings: dict[str, list[str]] = {}
        self._cache: dict[str, Any] = {}
        self._frozen_at = -1  # number of ops when _cols was last built
        self.error: dict[str, Any] | None = None

    # ------------------------------------------------------------------ columns
    def _freeze(self) -> None:
        """Build NumPy columns from the builder (cheap copy; repeated as the trace grows)."""
        b = self._b
        if b is None:
            return
        n = b.num_ops()
        if n == self._frozen_at and self._cols:
            return
        self._cols = b.columns()
        self._strings = {k: list(v.strings) for k, v in b.tables.items()}
        self._cache = {}
        self._frozen_at = n

    def _finish(self) -> None:
        """Called when recording ends: drop the builder, keep NumPy columns."""
        self._frozen_at = -1
        self._freeze()
        self._b = None

    def col(self, name: str) -> np.ndarray:
        """One raw column as a NumPy array (see ``_trace.py`` for the list)."""
        self._freeze()
        return self._cols[name]

    def strings(self, table: str) -> list[str]:
        """One string table (ops, modules, lines, args, shapes, strides, dtypes, devices, names)."""
        self._freeze()
        return self._strings[table]

    def __len__(self) -> int:
        return self._b.num_ops() if self._b is not None else len(self._cols["op"])

    @property
    def num_ops(self) -> int:
        """Number of recorded ops."""
        return len(self)

    # --------------------------------------------------------------- DataFrames
    @staticmethod
    def _cat(codes: np.ndarray, categories: list[str]) -> Any:
        import pandas as pd

        return pd.Categorical.from_codes(codes.astype(np.int32), categories=_unique_cats(categories))

    @property
    def ops(self) -> Any:
        """pandas DataFrame, one row per recorded op.

        Columns: seq, op, phase, module, user_line, args, n_inputs, n_outputs,
        is_view, inplace, and the first output's shape, dtype, device, stride,
        storage, storage_offset, plus ``nbytes`` (all outputs together).
        """
        if "ops" in self._cache:
            return self._cache["ops"]
        import pandas as pd

        self._freeze()
        c, s = self._cols, self._strings
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
        df = pd.DataFrame(
            {
                "seq": np.arange(n, dtype=np.int64),
                "op": self._cat(c["op"], s["ops"]),
                "phase": pd.Categorical.from_codes(c["phase"].astype(np.int32), categories=list(PHASES)),
                "module": self._cat(c["module"], s["modules"]),
                "user_line": self._cat(c["line"], s["lines"]),
                "args": self.args_strings(),
                "n_inputs": (in_end - in_start).astype(np.int32),
                "n_outputs": n_out.astype(np.int32),
                "is_view": (c["flags"] & FLAG_VIEW) != 0,
                "inplace": (c["flags"] & FLAG_INPLACE) != 0,
                "shape": self._cat(first_col("out_shape"), s["shapes"]),
                "dtype": self._cat(first_col("out_dtype"), s["dtypes"]),
                "device": self._cat(first_col("out_device"), s["devices"]),
                "stride": self._cat(first_col("out_stride"), s["strides"]),
                "storage": first_col("out_storage"),
                "storage_offset": first_col("out_offset"),
                "nbytes": nbytes_full,
            }
        )
        self._cache["ops"] = df
        return df

    @property
    def outputs(self) -> Any:
        """pandas DataFrame, one row per output tensor of every op."""
        if "outputs" in self._cache:
            return self._cache["outputs"]
        import pandas as pd

        self._freeze()
        c, s = self._cols, self._strings
        n_out = np.diff(np.concatenate([[0], c["out_end"]])).astype(np.int64)
        df = pd.DataFrame(
            {
                "seq": np.repeat(np.arange(len(c["op"]), dtype=np.int64), n_out),
                "tensor": c["out_tensor"],
                "shape": self._cat(c["out_shape"], s["shapes"]),
                "stride": self._cat(c["out_stride"], s["strides"]),
                "dtype": self._cat(c["out_dtype"], s["dtypes"]),
                "device": self._cat(c["out_device"], s["devices"]),
                "storage": c["out_storage"],
                "storage_offset": c["out_offset"],
                "nbytes": c["out_nbytes"],
            }
        )
        self._cache["outputs"] = df
        return df

    @property
    def storages(self) -> Any:
        """pandas DataFrame, one row per storage (the unit of memory and aliasing).

        Columns: storage, device, nbytes, category (see :data:`CATEGORIES`), roles
        (what the recorder saw it used as, ``"|"``-joined :data:`ROLES`), name
        (parameter/buffer FQNs), alloc_seq / free_seq (lifetime in op seqs, -1 =
        before recording / still alive), owner (tensor id of the parameter whose
        gradient or optimizer state it is), and the creating op's op, phase,
        module and user_line.
        """
        if "storages" in self._cache:
            return self._cache["storages"]
        import pandas as pd

        from ._memory import storage_categories

        self._freeze()
        c, s = self._cols, self._strings
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
        df = pd.DataFrame(
            {
                "storage": np.arange(len(c["st_device"]), dtype=np.int64),
                "device": self._cat(c["st_device"], s["devices"]),
                "nbytes": c["st_nbytes"],
                "category": pd.Categorical.from_codes(storage_categories(self), categories=list(CATEGORIES)),
                "roles": role_names[c["st_roles"].astype(np.int64) & ((1 << len(ROLES)) - 1)],
                "name": self._cat(c["st_name"], s["names"]),
                "alloc_seq": alloc,
                "free_seq": c["st_free"],
                "owner": c["st_owner"],
                "op": self._cat(creator("op"), s["ops"]),
                "phase": pd.Categorical.from_codes(phase.astype(np.int32), categories=list(PHASES)),
                "module": self._cat(creator("module"), s["modules"]),
                "user_line": self._cat(creator("line"), s["lines"]),
            }
        )
        self._cache["storages"] = df
        return df

    # ----------------------------------------------------------------- op log
    def args_strings(self) -> list[str]:
        """Each op's arguments as text, tensors written as ``$id``."""
        self._freeze()
        c, s = self._cols, self._strings
        templates = s["args"]
        tids = c["in_tensor"]
        in_end = c["in_end"]
        out: list[str] = []
        start = 0
        for a, end in zip(c["args"].tolist(), in_end.tolist()):
            t = templates[a]
            if end > start:
                t = t.format(*[f"${i}" for i in tids[start:end].tolist()])
            out.append(t)
            start = end
        return out

    def oplog(self, *, limit: int | None = None, start: int = 0) -> str:
        """The op log, one line per op in the logging-tensor form.

        ``$3: bf16[8, 4096] cuda:0 = aten.mm.default($1, $2)``. Multi-output ops
        list every output; ops with no tensor output start with ``_``.
        """
        return "\n".join(self.oplog_lines(limit=limit, start=start))

    def oplog_lines(self, *, limit: int | None = None, start: int = 0) -> list[str]:
        self._freeze()
        c, s = self._cols, self._strings
        n = len(c["op"])
        stop = n if limit is None else min(n, start + limit)
        args = self.args_strings()
        shapes, devices, dtypes, ops = s["shapes"], s["devices"], s["dtypes"], s["ops"]
        out_end = c["out_end"].tolist()
        ot, osh, odt, odev = (c[k].tolist() for k in ("out_tensor", "out_shape", "out_dtype", "out_device"))
        lines = []
        for i in range(start, stop):
            o0 = out_end[i - 1] if i > 0 else 0
            outs = []
            for j in range(o0, out_end[i]):
                dt = _DTYPE_ABBR.get(dtypes[odt[j]], dtypes[odt[j]])
                outs.append(f"${ot[j]}: {dt}[{shapes[osh[j]]}] {devices[odev[j]]}")
            lhs = ", ".join(outs) if outs else "_"
            lines.append(f"{lhs} = {ops[c['op'][i]]}({args[i]})")
        return lines

    # ------------------------------------------------------------- memory (raw)
    def live_bytes(self) -> dict[str, np.ndarray]:
        """Live storage bytes per device after each op (index = op seq).

        Storages count from the op that first produced them (or from the start
        if they existed before recording) until the op after which they were
        freed. Symbolic-size storages are not counted.
        """
        from ._memory import live_curve

        self._freeze()
        dev_col = self._cols["st_device"]
        devices = self._strings["devices"]
        return {devices[d]: live_curve(self, dev_col == d) for d in np.unique(dev_col).tolist()}

    def peak_bytes(self) -> dict[str, dict[str, Any]]:
        """Per device: peak live storage bytes and the op seq where it was first reached."""
        out = {}
        ops = self.strings("ops")
        for dev, curve in self.live_bytes().items():
            if len(curve) == 0:
                continue
            seq = int(np.argmax(curve))
            out[dev] = {"bytes": int(curve[seq]), "seq": seq, "op": ops[int(self._cols["op"][seq])]}
        return out

    @property
    def modules(self) -> Any:
        """The layer tree, one row per module with inclusive figures: see :mod:`fakeviz._tree`."""
        if "modules" not in self._cache:
            from ._tree import module_table

            self._cache["modules"] = module_table(self)
        return self._cache["modules"]

    def folded_modules(self) -> Any:
        """The layer tree with repeated numbered blocks folded (``layers.0-79 x80``), odd ones flagged."""
        if "folded" not in self._cache:
            from ._tree import fold_modules

            self._cache["folded"] = fold_modules(self, self.modules)
        return self._cache["folded"]

    @property
    def tensors(self) -> Any:
        """One row per tensor id: storage, creating op, view base, names, writes (see :mod:`fakeviz._alias`)."""
        from ._alias import tensor_table

        return tensor_table(self)

    def aliases(self, x: Any) -> Any:
        """Every tensor sharing storage with ``x`` (a ``$N`` id, a parameter name or a recorded tensor)."""
        from ._alias import aliases

        return aliases(self, x)

    def alias_graph(self, around: Any = None, *, max_nodes: int = 400) -> tuple[Any, Any]:
        """``(nodes, edges)`` DataFrames of storages, tensors, views, writes and tied names."""
        from ._alias import alias_graph

        return alias_graph(self, around, max_nodes=max_nodes)

    def flop_coverage(self) -> Any:
        """One row per distinct op: op, kind (registry/added/zero/unknown), count, flops.

        ``kind == "unknown"`` lists every op without a FLOP formula (counted as no
        figure, never as 0); see :mod:`fakeviz._flops` for the conventions.
        """
        from ._flops import coverage

        ops = self.ops
        counts = ops.op.value_counts()
        cov = coverage(list(counts.index.astype(str)), counts.tolist())
        flops = self.col("flops")
        per_op = ops.assign(_f=np.where(flops > 0, flops, 0)).groupby("op", observed=True)["_f"].sum()
        cov["flops"] = cov.op.map(per_op).fillna(0).astype(np.int64)
        return cov

    def flops(self) -> dict[str, int]:
        """Total FLOPs per phase (ops without a formula are left out: see :meth:`flop_coverage`)."""
        f = self.col("flops")
        ph = self.col("phase")
        return {p: int(f[(ph == i) & (f > 0)].sum()) for i, p in enumerate(PHASES)}

    def fidelity(self) -> dict[str, Any]:
        """How each op was faked and what limited fidelity: see :func:`fakeviz._fidelity.fidelity_report`."""
        from ._fidelity import fidelity_report

        return fidelity_report(self)

    def export_memory_snapshot(self, path: str | Path | None = None, *, capacity: Any = None) -> dict[str, Any]:
        """PyTorch's memory snapshot of this run (caching-allocator model), for ``torch.cuda._memory_viz``.

        ``python -m torch.cuda._memory_viz trace_plot FILE -o out.html`` and
        https://pytorch.org/memory_viz open the written file. See :mod:`fakeviz._snapshot`.
        """
        from ._snapshot import export_memory_snapshot

        return export_memory_snapshot(self, path, capacity=capacity)

    def memory(self, *, device: str | None = None, allocator: bool = True) -> Any:
        """Live bytes per device and category after every op: see :func:`fakeviz._memory.memory_timeline`."""
        from ._memory import memory_timeline

        return memory_timeline(self, device=device, allocator=allocator)

    def peak(self, *, top: int = 10) -> dict[str, Any]:
        """Per device, a :class:`~fakeviz._memory.Peak`: bytes, op, module, line, what was alive."""
        from ._memory import peaks

        return peaks(self, top=top)

    def nbytes(self) -> int:
        """Approximate memory held by the trace: columns plus string tables."""
        self._freeze()
        cols = sum(int(a.nbytes) for a in self._cols.values())
        strings = sum(len(x) + 49 for table in self._strings.values() for x in table)
        return cols + strings

    def verdict(self, capacity: str | int | float) -> dict[str, Any]:
        """Does every accelerator fit ``capacity`` (bytes, "80GB" or a GPU name)?

        On cuda devices the caching-allocator model (``fakeviz._allocator``) is run
        with that capacity: the device fits when the model never runs out of memory
        (it frees cached segments first, as PyTorch does); ``peak`` is the reserved
        peak (what the GPU must hold), ``allocated`` and ``raw`` the allocated and
        raw tensor-byte peaks. Other non-cpu devices are judged on raw bytes.

        Returns ``{"fits": bool, "capacity": bytes, "devices": {dev: {"peak", "allocated",
        "raw", "headroom", "fits"}}, "text"}``.
        """
        from ._gpus import parse_capacity
        from ._memory import allocator_run

        cap = parse_capacity(capacity)
        devices = {}
        for dev, pk in self.peak_bytes().items():
            if dev == "cpu" or dev.startswith("meta"):
                continue
            raw = pk["bytes"]
            if dev.startswith("cuda"):
                run = allocator_run(self, dev, cap)
                peak, allocated, fits = int(run.peak_reserved), int(run.peak_allocated), run.oom_seq < 0
                oom = int(run.oom_seq)
                if not fits:  # how much would have been needed: the model without a limit
                    peak = int(allocator_run(self, dev).peak_reserved)
            else:
                peak, allocated, fits, oom = raw, raw, raw <= cap, -1
            devices[dev] = {
                "peak": peak, "allocated": allocated, "raw": raw, "headroom": cap - peak, "fits": fits, "oom_seq": oom,
            }  # fmt: skip
        fits = all(d["fits"] for d in devices.values())
        if not devices:
            text = "no accelerator memory was used"
        elif fits:
            worst = min(devices.items(), key=lambda kv: kv[1]["headroom"])
            text = f"fits: {worst[0]} peaks at {_fmt_bytes(worst[1]['peak'])} of {_fmt_bytes(cap)}"
        else:
            over = [
                f"{d} over by {_fmt_bytes(-v['headroom'])}"
                if v["headroom"] < 0
                else f"{d} runs out at op {v['oom_seq']} (fragmentation: {_fmt_bytes(v['peak'])} reserved at peak)"
                for d, v in devices.items()
                if not v["fits"]
            ]
            text = f"does not fit {_fmt_bytes(cap)}: " + ", ".join(over)
        return {"fits": fits, "capacity": cap, "devices": devices, "text": text}

    # ------------------------------------------------------------ presentation
    def explore(self, capacity: Any = None, **selection: Any) -> Any:
        """The explorer widget: layer tree, memory bars, timeline, alias graph and ops table, linked.

        ``capacity`` is a GPU name ("H100") or a size ("80GB"); ``selection`` may preset
        ``selected_module``, ``device``, ``phase`` or ``search``. Needs ipywidgets/anywidget.
        """
        from ._widget import Explorer

        return Explorer.from_trace(self, capacity, **selection)

    def to_html(self, path: str | Path, capacity: Any = None, *, title: str | None = None) -> Path:
        """Write one self-contained interactive HTML report (works offline): see :mod:`fakeviz._report`."""
        from ._report import to_html

        return to_html(self, path, capacity, title=title)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The explorer widget plus ``text/plain`` and a compact ``text/html`` summary.

        The HTML summary is what GitHub and nbviewer show for an executed notebook; a
        front end with widgets shows the explorer. Without ipywidgets, or before the
        JS bundle is built, the widget part is left out.
        """
        bundle: dict[str, Any] = {"text/plain": repr(self), "text/html": self._repr_html_()}
        if self._b is None and len(self):
            try:
                from ._widget import Explorer

                widget_bundle = Explorer.from_trace(self)._repr_mimebundle_()
                data = widget_bundle[0] if isinstance(widget_bundle, tuple) else widget_bundle
                if data:
                    bundle.update({k: v for k, v in data.items() if k not in ("text/plain",)})
            except Exception:  # noqa: BLE001 - no widgets here: the text and HTML parts still show
                pass
        return bundle

    def phase_counts(self) -> dict[str, int]:
        counts = np.bincount(self.col("phase").astype(np.int64), minlength=len(PHASES))
        return {p: int(n) for p, n in zip(PHASES, counts)}

    def __repr__(self) -> str:
        n = len(self)
        state = "recording" if self._b is not None else "done"
        err = f", error={self.error['type']}" if self.error else ""
        devs = self.strings("devices") if n < 2_000_000 else []
        verdict = ""
        if self.meta.get("capacity") and n < 2_000_000:
            verdict = f", {self.verdict(self.meta['capacity'])['text']}"
        return f"<fakeviz.Trace {n} ops, {state}, devices={devs}{err}{verdict}>"

    def _repr_html_(self) -> str:
        rows = []
        for dev, pk in self.peak_bytes().items():
            rows.append(
                f"<tr><td>{html.escape(dev)}</td><td>{_fmt_bytes(pk['bytes'])}</td>"
                f"<td>{html.escape(pk['op'])}</td></tr>"
            )
        phases = ", ".join(f"{k} {v}" for k, v in self.phase_counts().items() if v)
        err = ""
        if self.error:
            err = (
                f"<p class='fv-error'><b>Stopped by an error</b> in {html.escape(str(self.error.get('op')))}: "
                f"{html.escape(str(self.error.get('message'))[:500])}</p>"
            )
        verdict = ""
        if self.meta.get("capacity"):
            v = self.verdict(self.meta["capacity"])
            cls = "fv-fits" if v["fits"] else "fv-over"
            spec = html.escape(str(self.meta.get("capacity_spec") or ""))
            verdict = f"<p class='{cls}'><b>{html.escape(v['text'])}</b> {spec}</p>"
        return (
            f"<div class='fv-trace'><b>fakeviz trace</b>: {len(self)} ops ({html.escape(phases)}){err}{verdict}"
            "<table><tr><th>device</th><th>peak live</th><th>at op</th></tr>" + "".join(rows) + "</table></div>"
        )

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the trace to ``path`` (``.fvz``, see the module docstring)."""
        self._freeze()
        path = Path(path)
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "meta": _jsonable(self.meta),
            "error": _jsonable(self.error),
            "strings": self._strings,
            "columns": {k: {"dtype": np.dtype(_TYPECODE_DTYPE[_ALL_COLS[k]]).str, "length": len(v)}
                        for k, v in self._cols.items()},
        }  # fmt: skip
        tmp = path.with_name(path.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr("fakeviz.json", json.dumps(header))
            for name, arr in self._cols.items():
                buf = io.BytesIO()
                np.save(buf, arr, allow_pickle=False)
                zf.writestr(f"columns/{name}.npy", buf.getvalue())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by :meth:`save`. Raises :class:`TraceFormatError` if unreadable."""
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
                    if name not in _ALL_COLS:
                        raise TraceFormatError(f"{path}: unknown column {name!r}")
                    arr = np.load(io.BytesIO(zf.read(f"columns/{name}.npy")), allow_pickle=False)
                    want = np.dtype(_TYPECODE_DTYPE[_ALL_COLS[name]])
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
        except Exception as exc:  # noqa: BLE001 - zlib, zipfile, numpy, json: any damage means "unreadable"
            raise TraceFormatError(f"{path}: not a readable fakeviz trace ({type(exc).__name__}: {exc})") from exc
        missing = set(_ALL_COLS) - set(cols)
        if missing:
            raise TraceFormatError(f"{path}: missing columns {sorted(missing)}")
        t = cls(meta=header.get("meta") or {})
        t._b = None
        t._cols = cols
        t._strings = {k: list(header["strings"][k]) for k in STRING_TABLES}
        t.error = header.get("error")
        t._frozen_at = len(cols["op"])
        _check_refs(path, t)
        return t


def load(path: str | Path) -> Trace:
    """Read a ``.fvz`` trace file written by :meth:`Trace.save` (never unpickles)."""
    return Trace.load(path)


def _check_header(path: Path, header: Any) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise TraceFormatError(f"{path}: not a fakeviz trace (format field is {header.get('format')!r})")
    if header.get("version") != FORMAT_VERSION:
        raise TraceFormatError(
            f"{path}: trace format version {header.get('version')!r}; this fakeviz reads version {FORMAT_VERSION}"
        )
    strings = header.get("strings")
    if not isinstance(strings, dict) or any(
        not isinstance(strings.get(k), list) or not all(isinstance(x, str) for x in strings[k]) for k in STRING_TABLES
    ):
        raise TraceFormatError(f"{path}: string tables are missing or malformed")


def _check_refs(path: Path, t: Trace) -> None:
    c, s = t._cols, t._strings
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
    for col in _OP_COLS:
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
    n_st = len(c["st_device"])
    for col in _ST_COLS:
        if len(c[col]) != n_st:
            raise TraceFormatError(f"{path}: column {col!r} has {len(c[col])} rows, expected {n_st}")
    if len(c["t_tensor"]) != len(c["t_storage"]):
        raise TraceFormatError(f"{path}: input tensor columns differ in length")
    n_p = len(c["p_name"])
    for col in _P_COLS:
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


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"
