"""The explorer's payload: everything :class:`~fakeviz._views.explorer.Explorer` shows, computed once in Python from
a record and shipped as JSON plus a few compact binary buffers (also inlined by the HTML report).

Data traits
-----------
``summary`` (JSON)
    devices, categories, phases, op count, capacity and verdict (the capacity applies to the devices the verdict
    judges: not the host's), one peak per device (bytes, seq, phase, op, module, user line, by category, allocator
    peaks), and ``palette``, the colours the panel draws with: :func:`fakeviz._core.palette.palette` (categories
    and phases in schema order, alias-graph edges, the colour cycle, the neutral colour) plus ``tree``, the colour
    of each device / dtype key of the layer tree (as :func:`fakeviz.views.layer_tree_figure` colours them) and of each
    precision of the weights (the tree pack's ``precision`` strings, Note: [weight precision]). The browser
    sets them as CSS custom properties of the panel: no colour is defined in ``js/``.
``tree``, ``memory``, ``ops``, ``alias`` (bytes)
    one *pack* each (see below): the folded layer tree; the memory timeline per device, min-max decimated, with
    the peak attribution and the phase runs; the ops table columns; the alias-graph neighbourhood: with no
    selection, the most aliased storages (tied first); around a selected module, that module's parameters,
    buffers, their gradients and optimizer state and its largest activations (:func:`alias_pack`).
``time`` (bytes)
    one pack, or empty when left out (``gpu=False``): every op's estimated time on one GPU (Note: [time model] in
    :mod:`fakeviz._analysis.timing`), for the timeline's time axis and its hover (:func:`time_pack`): ``end_s``
    (float32, one per op: its end on the step's critical path, ``Trace.time(gpu)["end_s"]``), ``code`` (int8, one
    per op: kernel class * 4 + bound) and ``est_s`` (float32, the op's own time, only for the ops whose class is
    not ``none``: views and metadata ops take no time). On a Llama-3-70B fwd+bwd record (20,017 ops) it adds
    about 144 kB (7.2 bytes per op) to the 405 kB of the other packs.

Pack format (``FVPK``, version 1, little-endian)
------------------------------------------------
::

    bytes 0..3   b"FVPK"
    bytes 4..7   uint32, length H of the header
    bytes 8..    H bytes of UTF-8 JSON: {"v": 1, "meta": {...}, "strings": {name: [str, ...]},
                                         "arrays": {name: spec}}
    zero padding to a multiple of 8, then the data section; every array starts
    at a multiple of 8 bytes from the data section's start.

An array ``spec`` is one of

* ``{"enc": "raw", "dtype": D, "offset": o, "length": n}``: ``n`` values of
  dtype ``D`` (``i1 u1 i2 u2 i4 u4 f4 f8``) at data offset ``o`` (``f4`` only for arrays given as float32);
* ``{"enc": "range", "start": s, "length": n}``: ``s, s+1, ..., s+n-1``;
* ``{"enc": "const", "value": v, "length": n}``: ``n`` copies of ``v``;
* ``{"enc": "dict", "index": RAW, "values": RAW}``: ``values[index[i]]``.

Integers travel in the narrowest signed type that holds them, byte counts and
FLOPs as float64 (exact below 2**53, as JavaScript numbers are) unless they have
few distinct values, which are dictionary-encoded; other floats as float64, or
float32 when given as float32 (estimated seconds). :func:`pack` and
:func:`unpack` are the Python side; ``js/src/decode.js`` reads the same format.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from .._analysis.alias import tensor_table
from .._analysis.memory import decimate_minmax, memory_timeline
from .._analysis.memory import peaks as peaks_of
from .._analysis.selection import (
    alias_universe,
    aliased_storages,
    bounded_alias_graph,
    fit_storages,
    module_ids,
    module_storages,
    storage_modules,
)
from .._analysis.tables import ops_table, storages_table
from .._analysis.timing import ACHIEVED_SOURCE, op_times
from .._analysis.timing import step_time as step_time_of
from .._analysis.tree import FIGURES, folded_modules
from .._analysis.verdict import verdict as verdict_of
from .._core.errors import ArgumentError
from .._core.gpu_specs import GPUSpec, gpu_spec
from .._core.gpus import Capacity, capacity_of
from .._core.palette import palette
from .._core.record import Record
from .._core.schema import CATEGORIES, PHASES, dtype_abbr
from .style import color_map
from .tree import NO_PARAMETERS, color_keys, param_split

__all__ = [
    "EDGE_KINDS", "NODE_KINDS", "SIZE_BY", "TIME_GPU", "alias_pack", "build_state", "pack", "time_gpu", "time_pack",
    "unpack",
]  # fmt: skip

MAGIC = b"FVPK"
PACK_VERSION = 1
NODE_KINDS = ("storage", "tensor", "name")
EDGE_KINDS = ("storage", "view", "write", "name", "tied")
# icicle sizes the panel offers (columns of the folded tree)
SIZE_BY = ("param_bytes", "act_bytes", "act_saved_bytes", "grad_bytes", "flops", "ops", "params")
_INT_TYPES = (np.int8, np.int16, np.int32)
TIME_GPU = "H100"  # the time axis's GPU when neither the caller, the capacity nor the record names one


# --------------------------------------------------------------------------- packing
def _encode(arr: np.ndarray, data: bytearray) -> dict[str, Any]:
    """Append ``arr`` to ``data`` in its most compact encoding; return the array spec."""
    arr = np.asarray(arr)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int8)
    n = int(arr.size)
    if n == 0:
        return _raw(np.zeros(0, np.int8), data)
    integral = arr.dtype.kind in "iu" or (
        arr.dtype.kind == "f" and bool(np.isfinite(arr).all()) and bool((arr == np.round(arr)).all())
    )
    if not integral:
        return _raw(arr if arr.dtype == np.float32 else arr.astype(np.float64), data)
    ints = arr.astype(np.int64)
    lo, hi = int(ints.min()), int(ints.max())
    if lo == hi:
        return {"enc": "const", "value": lo, "length": n}
    if int(ints[0]) + n - 1 == hi and bool((np.diff(ints) == 1).all()):
        return {"enc": "range", "start": int(ints[0]), "length": n}
    narrow = next((t for t in _INT_TYPES if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max), np.float64)
    size = np.dtype(narrow).itemsize
    if size > 1:  # few distinct values: an index into a table of them may be smaller
        values, index = np.unique(ints, return_inverse=True)
        if len(values) <= 0xFFFF:
            idx_t = np.uint8 if len(values) <= 0xFF else np.uint16
            if n * np.dtype(idx_t).itemsize + len(values) * 8 < n * size:
                return {
                    "enc": "dict",
                    "index": _raw(index.reshape(-1).astype(idx_t), data),
                    "values": _raw(values.astype(np.float64), data),
                }
    return _raw(ints.astype(narrow), data)


def _raw(arr: np.ndarray, data: bytearray) -> dict[str, Any]:
    """Append ``arr`` as little-endian raw values at the next multiple of 8 bytes; return its spec."""
    dt = arr.dtype.newbyteorder("<")
    data.extend(b"\0" * (-len(data) % 8))
    spec = {"enc": "raw", "dtype": dt.str[1:], "offset": len(data), "length": int(arr.size)}
    data.extend(np.ascontiguousarray(arr, dtype=dt).tobytes())
    return spec


def pack(arrays: dict[str, Any], *, strings: dict[str, list[str]] | None = None,
         meta: dict[str, Any] | None = None) -> bytes:  # fmt: skip
    """Pack named 1-D arrays, string tables and JSON metadata into one ``FVPK`` buffer."""
    data = bytearray()
    specs = {name: _encode(np.asarray(a).reshape(-1), data) for name, a in arrays.items()}
    header = json.dumps(
        {"v": PACK_VERSION, "meta": meta or {}, "strings": strings or {}, "arrays": specs},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")
    head = MAGIC + struct.pack("<I", len(header)) + header
    head += b"\0" * (-len(head) % 8)
    return bytes(head) + bytes(data)


def _decode_spec(spec: dict[str, Any], data: memoryview) -> np.ndarray:
    """The values one array spec describes, read from the data section."""
    enc = spec["enc"]
    if enc == "raw":
        dt = np.dtype("<" + spec["dtype"])
        start = spec["offset"]
        return np.frombuffer(data[start : start + spec["length"] * dt.itemsize], dtype=dt).copy()
    if enc == "range":
        return np.arange(spec["start"], spec["start"] + spec["length"], dtype=np.int64)
    if enc == "const":
        return np.full(spec["length"], spec["value"])
    if enc == "dict":
        return _decode_spec(spec["values"], data)[_decode_spec(spec["index"], data).astype(np.int64)]
    raise ValueError(f"unknown array encoding {enc!r}")


def unpack(buf: bytes | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, list[str]]]:
    """Read an ``FVPK`` buffer: ``(meta, arrays, strings)``; arrays come back as NumPy arrays."""
    view = memoryview(bytes(buf))
    if bytes(view[:4]) != MAGIC:
        raise ValueError("not a fakeviz pack (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    header = json.loads(bytes(view[8 : 8 + hlen]).decode("utf-8"))
    if header.get("v") != PACK_VERSION:
        raise ValueError(f"pack version {header.get('v')!r}; this fakeviz reads version {PACK_VERSION}")
    data = view[8 + hlen + (-(8 + hlen) % 8) :]
    arrays = {name: _decode_spec(spec, data) for name, spec in header["arrays"].items()}
    return header["meta"], arrays, header["strings"]


# ---------------------------------------------------------------------- the state
def build_state(trace: Record, capacity: Any = None, *, max_points: int = 4000, alias_nodes: int = 200,
                around: Any = None, max_ops: int = 1_000_000, gpu: Any = None) -> dict[str, Any]:  # fmt: skip
    """The data traits of :class:`~fakeviz._views.explorer.Explorer` for ``trace`` (see the module docstring).

    ``capacity`` (bytes, ``"80GB"`` or a GPU name) defaults to the record's own
    (:func:`~fakeviz._core.gpus.capacity_of`). ``gpu``: the GPU of the timeline's estimated times
    (:func:`time_gpu`); ``False`` leaves the times out.
    """
    devices = list(trace.strings("devices"))
    modules = list(trace.strings("modules"))
    peaks = peaks_of(trace)
    cap = capacity_of(trace.meta, capacity)
    verdict = verdict_of(trace, cap) if cap is not None else None
    storage_module = storage_modules(trace)
    tree, module_node, tree_colors = _tree_pack(trace, modules)
    summary = {
        "devices": devices,
        "categories": list(CATEGORIES),
        "phases": list(PHASES),
        "n_ops": int(trace.num_ops),
        "capacity": cap.bytes if cap is not None else None,
        "capacity_spec": _capacity_spec(trace, capacity),
        "verdict": _jsonable(verdict),
        "peaks": {dev: _peak_dict(pk) for dev, pk in peaks.items()},
        "error": _jsonable({k: trace.error.get(k) for k in ("type", "message", "op")} if trace.error else None),
        "meta": {k: trace.meta[k] for k in ("device", "fake", "torch", "attention", "symbolic") if k in trace.meta},
        "palette": {**palette(), "tree": tree_colors},
    }
    return {
        "summary": _jsonable(summary),
        "tree": tree,
        "memory": _memory_pack(trace, peaks, storage_module, max_points),
        "ops": _ops_pack(trace, modules, module_node, peaks, max_ops),
        "alias": alias_pack(trace, storage_module, alias_nodes, around),
        "time": b"" if gpu is False else time_pack(trace, time_gpu(trace, gpu, capacity)),
    }


def time_gpu(trace: Record, gpu: Any = None, capacity: Any = None) -> GPUSpec:
    """The GPU the timeline's times are estimated on: ``gpu`` if given (any name :func:`~fakeviz._core.gpu_specs.
    gpu_spec` takes), else the GPU ``capacity`` names (``"A100"``, not ``"80GB"``), else the record's GPU
    (``record(gpu=...)``, ``%%fake --gpu``), else :data:`TIME_GPU`.

    Raises:
        ArgumentError: ``gpu`` is not a GPU fakeviz knows the speed of.
    """
    if gpu is not None:
        return gpu_spec(gpu)
    for name in (capacity, trace.meta.get("gpu")):
        if name is None or isinstance(name, (int, float)):
            continue
        try:
            cap = name if isinstance(name, Capacity) else Capacity.parse(str(name))
            if cap.gpu is not None:
                return gpu_spec(cap)
        except (ArgumentError, ValueError):  # a size, or a GPU without a speed: look further
            continue
    return gpu_spec(TIME_GPU)


def time_pack(trace: Record, gpu: GPUSpec | str) -> bytes:
    """Every op's estimated time on ``gpu`` (:meth:`fakeviz.Trace.time`) as the ``time`` pack (module docstring).

    ``meta``: the GPU's name, the step's time, which step that is (``timed``, ``step_start``: Note: [one step] in
    :mod:`fakeviz._analysis.timing`: never the set-up, the last of several training steps) and what bounds it
    (:class:`~fakeviz._analysis.timing.StepTime`),
    the kernel classes and bounds the ``code`` column indexes, and where the model's constants come from.
    """
    spec = gpu_spec(gpu)
    df = op_times(trace, spec)
    step = step_time_of(trace, spec)
    cls = df["cls"].cat.codes.to_numpy().astype(np.int64)
    bound = df["bound"].cat.codes.to_numpy().astype(np.int64)
    bounds = [str(b) for b in df["bound"].cat.categories]
    timed = cls != list(df["cls"].cat.categories).index("none")
    arrays = {
        "end_s": df["end_s"].to_numpy().astype(np.float32),
        "code": (cls * len(bounds) + bound).astype(np.int8),
        "est_s": df["est_s"].to_numpy()[timed].astype(np.float32),
    }
    meta = {
        "gpu": spec.name,
        "n_ops": int(len(df)),
        "step_s": float(step.step_s),
        "timed": step.timed,
        "step_start": int(step.start),
        "gpu_s": float(step.gpu_s),
        "host_s": float(step.host_s),
        "comm_s": float(step.comm_s),
        "exposed_comm_s": float(step.exposed_comm_s),
        "bound": step.bound,
        "classes": [str(c) for c in df["cls"].cat.categories],
        "bounds": bounds,
        "untimed": "none",  # the class whose ops have no est_s entry (they take no time)
        "source": ACHIEVED_SOURCE,
    }
    return pack(arrays, meta=meta)


def _capacity_spec(trace: Record, capacity: Any) -> str | None:
    """How the capacity was asked for ("H100", "80GB"), for the panel's label."""
    if capacity is not None:
        return str(capacity)
    if trace.meta.get("capacity") is None:
        return None
    return str(trace.meta.get("capacity_spec") or trace.meta["capacity"])


def _peak_dict(pk: Any) -> dict[str, Any]:
    """A :class:`~fakeviz._analysis.memory.Peak` as JSON-ready fields (what the panel reads)."""
    return {
        k: getattr(pk, k)
        for k in ("bytes", "seq", "phase", "op", "module", "user_line", "by_category", "allocated",
                  "allocated_seq", "reserved", "reserved_seq")
    }  # fmt: skip


def _jsonable(obj: Any) -> Any:
    """``obj`` through JSON: NumPy scalars as numbers, anything else unknown as text."""
    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _tree_pack(trace: Record, modules: list[str]) -> tuple[bytes, np.ndarray, dict[str, list[str]]]:
    """The folded tree's pack, the tree row of each module (-1: none), and the colour of each colour key."""
    folded = folded_modules(trace)
    n = len(folded)
    module_node = np.full(len(modules), -1, np.int64)
    mod_id = {p: i for i, p in enumerate(modules)}
    paths = folded["path"].astype(str).tolist() if n else []
    row_of = {p: i for i, p in enumerate(paths)}
    parent = np.array([row_of.get(p, -1) if isinstance(p, str) else -1 for p in folded["parent"]] if n else [],
                      np.int64)  # fmt: skip
    for row, members in enumerate(folded["members"].tolist() if n else []):
        for m in str(members).split("|"):
            i = mod_id.get(m)
            if i is not None:
                module_node[i] = row
    arrays: dict[str, Any] = {
        "parent": parent,
        "depth": folded["depth"].to_numpy() if n else np.zeros(0),
        "count": folded["count"].to_numpy() if n else np.zeros(0),
        "odd": folded["odd"].to_numpy() if n else np.zeros(0),
        "tied": folded["tied"].to_numpy() if n else np.zeros(0),
        "module_node": module_node,
    }
    for k in FIGURES:
        arrays[k] = folded[k].to_numpy() if n else np.zeros(0)
    strings = {
        "path": paths,
        "name": folded["name"].astype(str).tolist() if n else [],
        "class": folded["class"].astype(str).tolist() if n else [],
        # the precision of the weights (Note: [weight precision] in fakeviz/_engine/precision.py); "" none
        "precision": folded["precision"].astype(str).tolist() if n else [],
    }
    # colour keys: the device and the dtype holding most of each module's parameter bytes, and the precision
    split = param_split(trace, folded.reset_index(drop=True), True) if n else None
    colors: dict[str, list[str]] = {}
    for color in ("device", "dtype", "precision"):
        if color == "precision":
            keys = [p or NO_PARAMETERS for p in strings["precision"]]
        else:
            keys = color_keys(split, strings["class"], color) if n else []
        table = list(dict.fromkeys(keys))
        arrays[f"color_{color}"] = np.array([table.index(k) for k in keys], np.int64)
        strings[f"color_{color}"] = table
        cmap = color_map(table, none_key=NO_PARAMETERS)
        colors[color] = [cmap[k] for k in table]
    meta = {"rows": n, "figures": list(FIGURES), "size_by": list(SIZE_BY), "modules": len(modules)}
    return pack(arrays, strings=strings, meta=meta), module_node, colors


def _memory_pack(trace: Record, peaks: dict[str, Any], storage_module: np.ndarray, max_points: int) -> bytes:
    """Per device the decimated timeline by category (and allocator curves), what is alive at its peak by module and
    category; the phase runs of the whole run."""
    mem = memory_timeline(trace)
    n_ops = int(trace.num_ops)
    arrays: dict[str, Any] = {}
    meta_devices = []
    # phase runs of the whole run: [phase, start, stop)
    phase = trace.col("phase").astype(np.int64)
    if n_ops:
        cuts = np.flatnonzero(np.diff(phase)) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [n_ops]])
        arrays.update({"phase_runs/phase": phase[starts], "phase_runs/start": starts, "phase_runs/stop": stops})
    else:
        arrays.update({k: np.zeros(0, np.int64) for k in ("phase_runs/phase", "phase_runs/start", "phase_runs/stop")})
    st = storages_table(trace)
    cats = st["category"].cat.codes.to_numpy().astype(np.int64)
    nbytes = st["nbytes"].to_numpy()
    alloc, free = st["alloc_seq"].to_numpy(), st["free_seq"].to_numpy()
    st_dev = st["device"].astype(str).to_numpy()
    for dev, pk in peaks.items():
        rows = mem[mem["device"] == dev]
        total = rows["total"].to_numpy()
        keep = [pk.seq]
        has_alloc = "allocated" in rows and rows["allocated"].notna().all()
        if has_alloc:
            keep += [pk.allocated_seq, pk.reserved_seq]
        idx = decimate_minmax(total, max_points, keep=tuple(k for k in keep if k is not None))
        arrays[f"{dev}/seq"] = rows["seq"].to_numpy()[idx]
        for cat in CATEGORIES:
            arrays[f"{dev}/{cat}"] = rows[cat].to_numpy()[idx]
        if has_alloc:
            arrays[f"{dev}/allocated"] = rows["allocated"].to_numpy()[idx].astype(np.int64)
            arrays[f"{dev}/reserved"] = rows["reserved"].to_numpy()[idx].astype(np.int64)
        # what is alive at the peak, by (module, category)
        alive = ((st_dev == dev) & (np.maximum(alloc, 0) <= pk.seq) & ((free < 0) | (free > pk.seq))
                 & (nbytes > 0))  # fmt: skip
        key = storage_module[alive] * len(CATEGORIES) + cats[alive]
        uniq, inv = np.unique(key, return_inverse=True)
        exact = np.zeros(len(uniq), np.int64)
        np.add.at(exact, inv.reshape(-1), nbytes[alive].astype(np.int64))
        arrays[f"{dev}/attr_module"] = np.floor_divide(uniq, len(CATEGORIES))
        arrays[f"{dev}/attr_category"] = np.mod(uniq, len(CATEGORIES))
        arrays[f"{dev}/attr_bytes"] = exact
        meta_devices.append(
            {"device": dev, "points": int(len(idx)), "allocator": bool(has_alloc), "peak_seq": int(pk.seq)}
        )
    meta = {"devices": meta_devices, "categories": list(CATEGORIES), "phases": list(PHASES), "n_ops": n_ops,
            "max_points": int(max_points)}  # fmt: skip
    return pack(arrays, meta=meta)


def _ops_window(n: int, peaks: dict[str, Any], max_ops: int) -> tuple[int, int]:
    """``[start, stop)``: every op, or the ``max_ops`` consecutive ones centred on the highest peak."""
    if n <= max_ops:
        return 0, n
    top = max(peaks.values(), key=lambda p: p.bytes) if peaks else None
    centre = top.seq if top is not None else n // 2
    start = min(max(0, centre - max_ops // 2), n - max_ops)
    return start, start + max_ops


def _ops_pack(trace: Record, modules: list[str], module_node: np.ndarray, peaks: dict[str, Any],
              max_ops: int) -> bytes:  # fmt: skip
    """The ops table's columns (first output's device, shape, dtype) over :func:`_ops_window`, with string tables."""
    c = trace.columns()
    n = int(trace.num_ops)
    start, stop = _ops_window(n, peaks, max_ops)
    out_end = c["out_end"]
    out_start = np.concatenate([[0], out_end[:-1]]).astype(np.int64) if n else np.zeros(0, np.int64)
    has = (out_end - out_start) > 0

    def first(name: str) -> np.ndarray:
        """Per op, output column ``name`` of its first output (-1 without one)."""
        col = c[name]
        if len(col) == 0:
            return np.full(n, -1, np.int64)
        return np.where(has, col[np.minimum(out_start, len(col) - 1)], -1)

    nbytes = ops_table(trace)["nbytes"].to_numpy() if n else np.zeros(0, np.int64)
    sl = slice(start, stop)
    arrays = {
        "seq": np.arange(start, stop, dtype=np.int64),
        "op": c["op"][sl],
        "module": c["module"][sl],
        "phase": c["phase"][sl],
        "device": first("out_device")[sl],
        "line": c["line"][sl],
        "shape": first("out_shape")[sl],
        "dtype": first("out_dtype")[sl],
        "nbytes": nbytes[sl],
        "flops": c["flops"][sl],
    }
    strings = {
        "ops": list(trace.strings("ops")),
        "modules": modules,
        "lines": list(trace.strings("lines")),
        "shapes": list(trace.strings("shapes")),
        "dtypes": [dtype_abbr(d, strip=True) for d in trace.strings("dtypes")],
        "devices": list(trace.strings("devices")),
    }
    meta = {"n_ops": n, "start": start, "stop": stop, "truncated": stop - start < n, "phases": list(PHASES)}
    return pack(arrays, strings=strings, meta=meta)


def alias_pack(trace: Record, storage_module: np.ndarray, max_nodes: int, around: Any, *,
               module: str | None = None) -> bytes:  # fmt: skip
    """The alias-graph pack: around ``around`` if given, else around ``module``'s storages
    (:func:`~fakeviz._analysis.selection.module_ids`), else around the most aliased storages
    (:func:`~fakeviz._analysis.selection.aliased_storages`); at most ``max_nodes`` nodes.

    ``storage_module`` is :func:`~fakeviz._analysis.selection.storage_modules` of ``trace``.
    """
    if around is not None:
        focus, around_label = around, str(around)
    else:
        ids = module_ids(trace, module) if module else None
        if ids is not None and len(ids):
            sids = fit_storages(trace, module_storages(trace, storage_module, ids), max_nodes)
            focus, around_label = ("storages", sids), f"{module} ({len(sids)} storages: parameters, gradients, "
            around_label += "optimizer state, largest activations)"
        else:
            sids = fit_storages(trace, aliased_storages(trace), max_nodes)
            focus, around_label = ("storages", sids), "the most aliased storages (tied first)"
            if module:
                around_label = f"the most aliased storages ({module} owns none)"
    nodes, edges, budget = bounded_alias_graph(trace, max_nodes, focus)
    # out of how many: the caller's neighbourhood, or the whole trace for a chosen focus
    total_nodes = alias_universe(trace, around)
    n_shown = int((nodes["kind"] != "name").sum())
    truncated = n_shown < total_nodes
    if len(nodes) > max_nodes:  # still over after shrinking the budget: drop the tail (names last)
        nodes = nodes.iloc[:max_nodes]
        truncated = True
    index = {nid: i for i, nid in enumerate(nodes["id"].tolist())}
    ok = edges["src"].isin(index) & edges["dst"].isin(index)
    truncated = truncated or not bool(ok.all())
    edges = edges[ok]
    # module of each node, for linking with the tree
    c = trace.columns()
    name_module: dict[str, int] = {}
    names_table = trace.strings("names")
    for nid, m in zip(c["p_name"].tolist(), c["p_module"].tolist()):
        name_module.setdefault(names_table[nid], m)
    tt = tensor_table(trace)
    t_seq = dict(zip(tt["tensor"].tolist(), tt["seq"].tolist()))
    op_module = c["module"]
    kinds = nodes["kind"].tolist()
    refs = nodes["ref"].astype(np.int64).tolist()
    labels = nodes["label"].astype(str).tolist()
    node_names = [x if isinstance(x, str) else "" for x in nodes["names"].tolist()]
    module = []
    for kind, ref, label, nm in zip(kinds, refs, labels, node_names):
        if kind == "name":
            module.append(name_module.get(label, -1))
        elif kind == "storage":
            module.append(int(storage_module[ref]) if 0 <= ref < len(storage_module) else -1)
        else:
            first = nm.split("|")[0] if nm else ""
            if first in name_module:
                module.append(name_module[first])
            else:
                seq = t_seq.get(ref, -1)
                module.append(int(op_module[seq]) if 0 <= seq < len(op_module) else -1)
    cat_code = {c: i for i, c in enumerate(CATEGORIES)}
    op_id = {o: i for i, o in enumerate(trace.strings("ops"))}
    arrays = {
        "node_kind": np.array([NODE_KINDS.index(k) for k in kinds], np.int64),
        "node_ref": np.array(refs, np.int64),
        "node_nbytes": nodes["nbytes"].fillna(0).to_numpy().astype(np.int64),
        "node_category": np.array([cat_code.get(x, -1) for x in nodes["category"].tolist()], np.int64),
        "node_writes": nodes["writes"].fillna(0).to_numpy().astype(np.int64),
        "node_module": np.array(module, np.int64),
        "edge_src": np.array([index[s] for s in edges["src"].tolist()], np.int64),
        "edge_dst": np.array([index[d] for d in edges["dst"].tolist()], np.int64),
        "edge_kind": np.array([EDGE_KINDS.index(k) for k in edges["kind"].tolist()], np.int64),
        "edge_op": np.array([op_id.get(o, -1) if isinstance(o, str) else -1 for o in edges["op"].tolist()], np.int64),
        "edge_seq": edges["seq"].fillna(-1).to_numpy().astype(np.int64),
    }
    strings = {"label": labels, "names": node_names, "ops": list(trace.strings("ops"))}
    meta = {
        "node_kinds": list(NODE_KINDS),
        "edge_kinds": list(EDGE_KINDS),
        "categories": list(CATEGORIES),
        "max_nodes": int(max_nodes),
        "budget": int(budget),
        "total_nodes": int(total_nodes),  # storages + tensors before bounding (name nodes not counted)
        "truncated": bool(truncated),
        "around": around_label,
    }
    return pack(arrays, strings=strings, meta=meta)
