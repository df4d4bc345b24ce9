"""Aliasing: storages, the tensors that view them, tied parameters and in-place writes.

Pure functions of a :class:`~fakeviz._core.record.Record`. A *tensor* is a recorded ``$N``
id; a *storage* is the memory it lives in. Tensors come from the first op that
produced them (its output row), from the parameter table, or from their first
use as an op input (tensors made before recording).

* a **view** edge links a tensor made by a view op (schema alias info without a
  write: ``view``, ``t``, ``transpose``, ``split`` ...) to the tensor it views;
* a **storage** edge links every tensor to its storage;
* a **write** edge links an in-place or ``out=`` op (``add_``, ``copy_`` ...) to
  the tensor it wrote, with the op's seq;
* a **name** edge links a parameter/buffer name to its tensor; when several
  names lead to one tensor (tied weights) those edges are **tied**.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.record import Record
from .._core.schema import FLAG_INPLACE, FLAG_VIEW, TID_MASK, dtype_abbr
from .tables import ops_table, outputs_table, storages_table

__all__ = ["alias_graph", "aliases", "graph_tensors", "tensor_table"]


def tensor_table(trace: Record) -> Any:
    """One row per tensor id: where it lives, what made it, and what it views.

    Columns: tensor, storage, seq (creating op, -1 made before recording), op,
    module, user_line, shape, stride, dtype, device, storage_offset, nbytes,
    base (the tensor it is a view of, -1), names (parameter/buffer names of
    this tensor, ``|``-joined), writes (number of in-place ops that wrote it).
    """
    return trace.cached("tensors", lambda: _tensor_table(trace))


def _tensor_table(trace: Record) -> Any:
    import pandas as pd

    out = outputs_table(trace)
    c, s = trace.columns(), trace.string_tables()
    flags = c["flags"]
    n_ops = len(flags)
    out_end = c["out_end"]
    out_start = np.concatenate([[0], out_end[:-1]]) if n_ops else np.zeros(0, np.int64)
    in_end = c["in_end"]
    in_start = np.concatenate([[0], in_end[:-1]]) if n_ops else np.zeros(0, np.int64)
    tids = out.tensor.to_numpy()
    first = ~pd.Series(tids).duplicated().to_numpy()
    made = out[first].copy()
    # base of views: the first tensor input of the view op
    seqs = made.seq.to_numpy()
    is_view = (flags[seqs] & FLAG_VIEW) != 0 if len(seqs) else np.zeros(0, bool)
    has_in = in_end[seqs] > in_start[seqs] if len(seqs) else np.zeros(0, bool)
    base = np.full(len(made), -1, np.int64)
    sel = is_view & has_in
    base[sel] = c["in_tensor"][in_start[seqs[sel]]]
    made["base"] = base
    # writes: in-place ops' outputs that already existed
    inplace_rows = np.repeat((flags & FLAG_INPLACE) != 0, out_end - out_start) if n_ops else np.zeros(0, bool)
    writes = pd.Series(tids[inplace_rows]).value_counts()
    ops = ops_table(trace)
    made["op"] = ops.op.to_numpy()[seqs] if len(seqs) else []
    made["module"] = ops.module.to_numpy()[seqs] if len(seqs) else []
    made["user_line"] = ops.user_line.to_numpy()[seqs] if len(seqs) else []
    # tensors never produced by a recorded op: parameters, inputs made before recording
    names = s["names"]
    p_tensor, p_storage, p_name = c["p_tensor"], c["p_storage"], c["p_name"]
    pre = {}
    for t, st in zip(c["t_tensor"].tolist(), c["t_storage"].tolist()):
        pre.setdefault(t, st)
    for t, st in zip(p_tensor.tolist(), p_storage.tolist()):
        pre.setdefault(t, st)
    known = set(made.tensor.tolist())
    extra = [(t, st) for t, st in pre.items() if t not in known]
    rows = pd.DataFrame(
        {
            "tensor": np.array([t for t, _ in extra], np.int64),
            "storage": np.array([st for _, st in extra], np.int64),
            "seq": np.full(len(extra), -1, np.int64),
            "base": np.full(len(extra), -1, np.int64),
        }
    )
    df = pd.concat([made.rename(columns={"tensor": "tensor"}), rows], ignore_index=True)
    tensor_names: dict[int, list[str]] = {}
    for t, n in zip(p_tensor.tolist(), p_name.tolist()):
        tensor_names.setdefault(t, []).append(names[n])
    df["names"] = pd.Categorical([("|".join(tensor_names[t]) if t in tensor_names else "") for t in df.tensor.tolist()])
    df["writes"] = df.tensor.map(writes).fillna(0).astype(np.int64)
    for col in ("op", "module", "user_line"):
        df[col] = pd.Categorical(df[col])
    df = df.sort_values("tensor", kind="stable").reset_index(drop=True)
    cols = ["tensor", "storage", "seq", "op", "module", "user_line", "shape", "stride", "dtype", "device",
            "storage_offset", "nbytes", "base", "names", "writes"]  # fmt: skip
    df = df[cols]
    return df


def _resolve(trace: Record, x: Any) -> tuple[str, int]:
    """``x`` as ("tensor", id) or ("storage", id)."""
    if isinstance(x, str):
        key = x.lstrip("$")
        if key.isdigit():
            return "tensor", int(key)
        tt = tensor_table(trace)
        hit = tt[tt.names.str.split("|").apply(lambda ns: any(n == x or n.endswith("." + x) for n in ns))]
        if hit.empty:
            raise KeyError(f"no parameter or buffer named {x!r} in this trace")
        return "tensor", int(hit.tensor.iloc[0])
    if isinstance(x, (int, np.integer)):
        return "tensor", int(x)
    tag = getattr(x, "__dict__", {}).get("_fakeviz_tid")
    if tag is not None:
        return "tensor", int(tag) & TID_MASK
    raise TypeError(
        f"aliases() takes a tensor id ($N or int), a parameter name or a tensor recorded in the trace, "
        f"not {type(x).__name__}"
    )


def aliases(trace: Record, x: Any) -> Any:
    """Every tensor that shares storage with ``x`` (itself included), in creation order.

    ``x`` is a tensor id (``12`` or ``"$12"``), a parameter/buffer name (full or a
    suffix such as ``"lm_head.weight"``), or a tensor object recorded in the trace.
    Tied parameters show up as one tensor with several ``names``.
    """
    tt = tensor_table(trace)
    kind, tid = _resolve(trace, x)
    row = tt[tt.tensor == tid]
    if row.empty:
        raise KeyError(f"tensor ${tid} is not in this trace")
    sid = int(row.storage.iloc[0])
    if sid < 0:
        return row.reset_index(drop=True)
    return tt[tt.storage == sid].sort_values(["seq", "tensor"]).reset_index(drop=True)


def graph_tensors(trace: Record, around: Any = None) -> Any:
    """The tensors the unbounded alias graph draws: all of them, or those aliasing ``around``."""
    tt = tensor_table(trace)
    if around is not None:
        if isinstance(around, tuple) and around and around[0] == "storage":
            sids = {int(around[1])}
        elif isinstance(around, tuple) and around and around[0] == "storages":
            sids = {int(x) for x in around[1]}
        else:
            sids = set(aliases(trace, around).storage.tolist())
        tt = tt[tt.storage.isin(sids)]
    return tt[tt.storage >= 0]


def alias_graph(trace: Record, around: Any = None, *, max_nodes: int = 400) -> tuple[Any, Any]:
    """The aliasing graph as ``(nodes, edges)`` DataFrames.

    ``nodes``: id (``"s12"`` for storage 12, ``"t34"`` for tensor $34), kind
    (storage/tensor/name), ref (the numeric id), label, nbytes, category (storages),
    names, writes. ``edges``: src, dst, kind (storage: tensor lives in storage; view:
    base -> view, with the view op; write: tensor -> storage, with the in-place op
    and its seq; name/tied: parameter name -> tensor), op, seq.

    With ``around`` (anything :func:`aliases` takes, ``("storage", id)`` or
    ``("storages", ids)``) only those storages and the tensors in them are returned; ``max_nodes``
    bounds the result, keeping the storages and the tensors closest to the
    selection (parameters and written tensors first), so a large model never
    yields a hairball.
    """
    import pandas as pd

    st = storages_table(trace)
    tt = graph_tensors(trace, around)
    if max_nodes and len(tt) + tt.storage.nunique() > max_nodes:
        # keep named tensors, written tensors and view roots first, then the earliest
        prio = (tt.names != "").astype(int) * 4 + (tt.writes > 0).astype(int) * 2 + (tt.base < 0).astype(int)
        keep_t = max(1, max_nodes - min(tt.storage.nunique(), max_nodes // 2))
        tt = tt.assign(_p=prio).sort_values(["_p", "seq"], ascending=[False, True]).head(keep_t).drop(columns="_p")
    if max_nodes:  # parameter-name nodes count too
        while len(tt) > 1:
            n_names = sum(len(x.split("|")) for x in tt.names.astype(str) if x)
            if len(tt) + tt.storage.nunique() + n_names <= max_nodes:
                break
            tt = tt.iloc[: max(1, int(len(tt) * 0.9))]
    sids = sorted(set(tt.storage.tolist()))
    srow = st.set_index("storage").loc[sids] if sids else st.iloc[:0].set_index("storage")
    s_nodes = pd.DataFrame(
        {
            "id": [f"s{i}" for i in sids],
            "kind": "storage",
            "ref": np.array(sids, np.int64),
            "label": [
                f"storage {i} ({d}, {n} B)" for i, d, n in zip(sids, srow.device.astype(str), srow.nbytes.tolist())
            ],
            "nbytes": srow.nbytes.to_numpy(),
            "category": srow.category.astype(str).to_numpy(),
            "names": srow.name.astype(object).where(srow.name.notna(), "").to_numpy(),
            "writes": 0,
        }
    )
    t_nodes = pd.DataFrame(
        {
            "id": [f"t{i}" for i in tt.tensor.tolist()],
            "kind": "tensor",
            "ref": tt.tensor.to_numpy(),
            "label": [
                f"${t}: {dtype_abbr(dt)}[{sh}]" + (f" = {op}" if isinstance(op, str) else "")
                for t, dt, sh, op in zip(tt.tensor.tolist(), tt.dtype.astype(str), tt["shape"].astype(str), tt.op)
            ],
            "nbytes": tt.nbytes.to_numpy(),
            "category": "",
            "names": tt.names.to_numpy(),
            "writes": tt.writes.to_numpy(),
        }
    )
    nodes = pd.concat([s_nodes, t_nodes], ignore_index=True)
    present = set(tt.tensor.tolist())
    edges = [(f"t{t}", f"s{s_}", "storage", None, -1) for t, s_ in zip(tt.tensor.tolist(), tt.storage.tolist())]
    for t, b, op, seq in zip(tt.tensor.tolist(), tt.base.tolist(), tt.op, tt.seq.tolist()):
        if b >= 0 and b != t and b in present:
            edges.append((f"t{b}", f"t{t}", "view", op, seq))
    # in-place writes, with the op that wrote
    c = trace.columns()
    flags = c["flags"]
    if len(flags):
        out = outputs_table(trace)
        rows = out[np.repeat((flags & FLAG_INPLACE) != 0, np.diff(np.concatenate([[0], c["out_end"]])))]
        rows = rows[rows.tensor.isin(present)]
        ops = ops_table(trace).op.to_numpy()
        for t, sid, seq in zip(rows.tensor.tolist(), rows.storage.tolist(), rows.seq.tolist()):
            edges.append((f"t{t}", f"s{sid}", "write", ops[seq], seq))
    # parameter names: one node per name; a tensor with several names is tied
    name_nodes = []
    for t, names in zip(tt.tensor.tolist(), tt.names.tolist()):
        ns = names.split("|") if names else []
        for n in ns:
            name_nodes.append((f"n:{n}", "name", t, n))
            edges.append((f"n:{n}", f"t{t}", "tied" if len(ns) > 1 else "name", None, -1))
    if name_nodes:
        extra = pd.DataFrame(name_nodes, columns=["id", "kind", "ref", "label"])
        extra["nbytes"], extra["category"], extra["names"], extra["writes"] = 0, "", extra.label, 0
        nodes = pd.concat([nodes, extra], ignore_index=True)
    edge_df = pd.DataFrame(edges, columns=["src", "dst", "kind", "op", "seq"])
    return nodes, edge_df
