"""The collectives of a record (Note: [collectives in the record]): one row per collective op, with its group,
the bytes it reads and writes on this rank, and the bytes a ring algorithm sends and receives.

Wire bytes follow the ring algorithms NCCL uses for large messages (and its "bus bandwidth" convention), for
a group of ``n`` ranks: an all-gather of a shard of ``s`` bytes sends and receives ``(n - 1) * s``; a
reduce-scatter of ``b`` input bytes ``(n - 1) / n * b``; an all-reduce of ``b`` bytes ``2 (n - 1) / n * b``; an
all-to-all ``(n - 1) / n * b``; a send its bytes out, a recv its bytes in; a barrier nothing. A broadcast (its
root is not in the record's arguments) and other collectives are left empty (NaN).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .._core.record import Record

__all__ = ["KINDS", "collectives", "group_of", "ranks_text"]

# op name (without namespace and overload) -> kind
KINDS = {
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}  # fmt: skip
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
# ops whose first half of tensor inputs are written (outputs) and second half read: c10d's out-first ops
_OUT_FIRST = {"_allgather_base_", "_reduce_scatter_base_", "alltoall_base_", "allgather_into_tensor_coalesced_",
              "reduce_scatter_tensor_coalesced_", "alltoall_"}  # fmt: skip
_OUT_LAST = {"all_gather_into_tensor_out"}  # (input, ..., out=)
_GROUP = re.compile(r"group\('([^']*)'\)")
_STR = re.compile(r"'([^']*)'")


def _split(op: str) -> tuple[str, str]:
    parts = op.split(".")
    return parts[0], parts[1] if len(parts) > 1 else ""


def group_of(args: str, groups: dict[str, Any]) -> str | None:
    """The group name of a collective from its argument text: ``group('NAME')`` (c10d ops), else the last quoted
    string that names a known group (functional ops pass the name), else the last quoted string."""
    m = _GROUP.search(args)
    if m:
        return m.group(1)
    names = _STR.findall(args)
    for name in reversed(names):
        if name in groups:
            return name
    return names[-1] if names else None


def collectives(rec: Record) -> Any:
    """One row per collective op: seq, op, kind, phase, module, user_line, group, group_size, ranks (the group's
    global ranks), bytes_in (read on this rank), bytes_out (written on this rank), sent, received (ring
    algorithm, module docstring)."""
    return rec.cached("collectives", lambda: _collectives(rec))


def _collectives(rec: Record) -> Any:
    import pandas as pd

    from .tables import ops_table

    cols = ["seq", "op", "kind", "phase", "module", "user_line", "group", "group_size", "ranks", "bytes_in",
            "bytes_out", "sent", "received"]  # fmt: skip
    c = rec.columns()
    ops = rec.strings("ops")
    code_kind = {}
    for code, name in enumerate(ops):
        ns, base = _split(name)
        if ns in NAMESPACES and base in KINDS:
            code_kind[code] = (base, KINDS[base])
    if not code_kind:
        return pd.DataFrame({k: [] for k in cols})
    op_codes = c["op"]
    seqs = np.flatnonzero(np.isin(op_codes, list(code_kind)))
    # bytes of every tensor id: its last recorded output row, else (an input never produced) its storage
    nbytes: dict[int, int] = {}
    for tid, nb in zip(c["out_tensor"].tolist(), c["out_nbytes"].tolist()):
        nbytes[tid] = nb
    st_nb = c["st_nbytes"]
    for tid, sid in zip(c["t_tensor"].tolist(), c["t_storage"].tolist()):
        if tid not in nbytes and 0 <= sid < len(st_nb):
            nbytes[tid] = int(st_nb[sid])
    in_end, out_end = c["in_end"], c["out_end"]
    in_t, out_nb = c["in_tensor"], c["out_nbytes"]
    table = ops_table(rec)
    meta = rec.meta.get("distributed") or {}
    groups = meta.get("groups", {})
    rank = meta.get("rank")
    rows = []
    for seq in seqs.tolist():
        base, kind = code_kind[int(op_codes[seq])]
        i0 = int(in_end[seq - 1]) if seq else 0
        ins = [max(nbytes.get(int(t), 0), 0) for t in in_t[i0 : int(in_end[seq])].tolist()]
        o0 = int(out_end[seq - 1]) if seq else 0
        outs = sum(max(int(x), 0) for x in out_nb[o0 : int(out_end[seq])].tolist())
        if base in _OUT_FIRST and len(ins) >= 2:
            half = len(ins) // 2
            b_out, b_in = sum(ins[:half]), sum(ins[half:])
        elif base in _OUT_LAST and len(ins) >= 2:
            b_in, b_out = sum(ins[:-1]), ins[-1]
        elif kind in ("all_reduce", "broadcast", "send", "recv", "barrier") or base.endswith("_"):
            b_in = b_out = sum(ins)  # in place: the tensors are read and written
        else:  # functional: the inputs are read, the op's outputs written
            b_in, b_out = sum(ins), outs
        args = str(table.args.iat[seq])
        g = group_of(args, groups)
        info = groups.get(g, {}) if g is not None else {}
        ranks = info.get("ranks")
        n = len(ranks) if ranks else np.nan
        sent, received = _wire(kind, b_in, b_out, n, rank, ranks)
        rows.append({
            "seq": seq, "op": ops[int(op_codes[seq])], "kind": kind, "phase": table.phase.iat[seq],
            "module": table.module.iat[seq], "user_line": table.user_line.iat[seq], "group": g,
            "group_size": n, "ranks": ranks_text(ranks), "bytes_in": b_in, "bytes_out": b_out,
            "sent": sent, "received": received,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _wire(kind: str, b_in: int, b_out: int, n: float, rank: Any, ranks: Any) -> tuple[float, float]:
    if kind == "send":
        return float(b_in), 0.0
    if kind == "recv":
        return 0.0, float(b_out)
    if n != n or n < 1:  # unknown group size
        return np.nan, np.nan
    if kind == "all_gather":
        v = (n - 1) * b_in
    elif kind == "reduce_scatter":
        v = (n - 1) / n * b_in
    elif kind == "all_reduce":
        v = 2 * (n - 1) / n * b_in
    elif kind == "all_to_all":
        v = (n - 1) / n * b_in
    elif kind == "broadcast":
        return np.nan, np.nan  # the root is not in the record's arguments
    elif kind == "barrier":
        return 0.0, 0.0
    else:
        return np.nan, np.nan
    return float(v), float(v)


def ranks_text(ranks: list[int] | None) -> str:
    """Ranks as runs: ``0-7``, ``1,3``, ``0-3,8-11``; ``?`` when unknown."""
    if not ranks:
        return "?"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ",".join(parts)
