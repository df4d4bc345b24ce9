"""What a selection in the explorer owns: storages per module, the most aliased storages, bounded alias graphs.

Pure functions of a record; the explorer (:mod:`fakeviz._views.explorer`) packs what they pick.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.record import Record
from .._core.schema import ROLE_BUFFER, ROLE_GRAD, ROLE_OPT, ROLE_PARAM
from .alias import alias_graph, graph_tensors, tensor_table
from .tree import folded_modules

__all__ = [
    "alias_universe", "aliased_storages", "bounded_alias_graph", "fit_storages", "module_ids", "module_storages",
    "storage_modules",
]  # fmt: skip


def storage_modules(trace: Record) -> np.ndarray:
    """The module each storage belongs to (module id, -1 none): what a selection in the tree owns.

    Parameters and buffers belong to the module that holds them (the first name
    of a tied tensor), gradients and optimizer state to their parameter's module,
    everything else to the module of the op that created it.
    """
    return trace.cached("storage_modules", lambda: _storage_modules(trace))


def _storage_modules(trace: Record) -> np.ndarray:
    c = trace.columns()
    n_st = len(c["st_device"])
    n_ops = len(c["op"])
    out = np.full(n_st, -1, np.int64)
    alloc = c["st_alloc"]
    made = (alloc >= 0) & (alloc < n_ops)
    out[made] = c["module"][alloc[made]]
    # gradient / optimizer state: the owner parameter's module (first name row of that tensor)
    p_tensor, p_module, p_storage = c["p_tensor"], c["p_module"].astype(np.int64), c["p_storage"]
    if len(p_tensor):
        t_sorted, first = np.unique(p_tensor, return_index=True)
        owner = c["st_owner"]
        has = owner >= 0
        pos = np.searchsorted(t_sorted, owner[has])
        ok = (pos < len(t_sorted)) & (t_sorted[np.minimum(pos, len(t_sorted) - 1)] == owner[has])
        idx = np.flatnonzero(has)[ok]
        out[idx] = p_module[first[pos[ok]]]
        # parameters and buffers: their own module (first row wins for tied/shared storages)
        s_sorted, s_first = np.unique(p_storage, return_index=True)
        sel = (s_sorted >= 0) & (s_sorted < n_st)
        out[s_sorted[sel]] = p_module[s_first[sel]]
    return out


def module_ids(trace: Record, path: str) -> np.ndarray:
    """Ids of the modules at or under ``path``: a module path of the trace, or a folded
    tree path (``layers.0-79.mlp``: its first member, ``layers.0.mlp``)."""
    if not path:
        return np.zeros(0, np.int64)
    folded = folded_modules(trace)
    row = folded.index[folded["path"].astype(str) == path] if len(folded) else []
    if len(row):
        path = str(folded["members"].loc[row[0]]).split("|")[0]
    pre = path + "."
    return np.array([i for i, m in enumerate(trace.strings("modules")) if m == path or m.startswith(pre)], np.int64)


def module_storages(trace: Record, storage_module: np.ndarray, ids: np.ndarray, limit: int = 40) -> list[int]:
    """Storages a module owns, most telling first: parameters and buffers, their gradients and
    optimizer state, then the largest storages its ops made; at most ``limit``."""
    c = trace.columns()
    own = np.flatnonzero(np.isin(storage_module, ids))
    if not len(own):
        return []
    roles = c["st_roles"][own]
    nbytes = c["st_nbytes"][own].astype(np.float64)
    rank = np.where(roles & (ROLE_PARAM | ROLE_BUFFER), 0, np.where(roles & (ROLE_GRAD | ROLE_OPT), 1, 2))
    order = np.lexsort((-nbytes, rank))
    return own[order[:limit]].tolist()


def fit_storages(trace: Record, sids: list[int], max_nodes: int) -> list[int]:
    """The first storages of ``sids`` (in their order of importance) whose graph nodes
    (the storage, its tensors and their names) fit in ``max_nodes``; at least one."""
    cost = trace.cached("alias_cost", lambda: _alias_cost(trace))
    out, used = [], 0
    for s in sids:
        c = cost.get(s, 1)
        if out and used + c > max_nodes:
            continue  # a smaller storage further down may still fit
        out.append(s)
        used += c
    return out


def aliased_storages(trace: Record, limit: int = 40) -> list[int]:
    """The storages with the most aliasing: tied parameters first, then most tensors and writes."""
    return trace.cached("aliased_storages", lambda: _aliased_storages(trace))[:limit]


def _aliased_storages(trace: Record) -> list[int]:
    tt = tensor_table(trace)
    tt = tt[tt.storage >= 0]
    if tt.empty:
        return []
    tied = tt.names.astype(str).str.contains("|", regex=False).to_numpy()
    df = tt.assign(_tied=tied.astype(np.int64), _n=1)[["storage", "_tied", "_n", "writes"]]
    g = df.groupby("storage", sort=True).sum()
    score = g._tied.to_numpy() * 1_000_000 + g.writes.to_numpy() * 10 + g._n.to_numpy()
    order = np.lexsort((g.index.to_numpy(), -score))
    ranked = g.index.to_numpy()[order].tolist()
    return ranked


def alias_universe(trace: Record, around: Any) -> int:
    """Storage and tensor nodes the unbounded alias graph would have (what ``max_nodes`` cuts)."""
    tt = graph_tensors(trace, around)
    return int(len(tt) + tt.storage.nunique())


def bounded_alias_graph(trace: Record, max_nodes: int, around: Any) -> tuple[Any, Any, int]:
    """``alias_graph`` with at most ``max_nodes`` nodes in all (its bound leaves out name nodes).

    The storage/tensor budget passed to ``alias_graph`` shrinks in proportion
    until the name nodes fit too (a few calls at most).
    """
    budget = max(2, int(max_nodes))
    nodes, edges = alias_graph(trace, around, max_nodes=budget)
    for _ in range(8):
        if len(nodes) <= max_nodes or budget <= 2:
            break
        budget = max(2, budget * max_nodes // len(nodes) - 1)
        nodes, edges = alias_graph(trace, around, max_nodes=budget)
    return nodes, edges, budget


def _alias_cost(trace: Record) -> dict[int, int]:
    tt = tensor_table(trace)
    tt = tt[tt.storage >= 0]
    n_names = tt.names.astype(str).map(lambda x: len(x.split("|")) if x else 0).to_numpy()
    return (tt.assign(_c=1 + n_names).groupby("storage")._c.sum() + 1).to_dict()
