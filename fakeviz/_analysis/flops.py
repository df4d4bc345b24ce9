"""FLOPs of a record: totals per phase, and which ops have a formula (coverage).

The per-op formulas are the engine's (:mod:`fakeviz._engine.flops`): the recorder stores each op's
FLOPs in the ``flops`` column as it records, ``-1`` where there is no formula.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._core.record import Record
from .._core.schema import PHASES
from .._engine.flops import FLOP_KINDS, flop_kind
from .tables import ops_table

__all__ = ["coverage", "flop_coverage", "flops_by_phase"]


def coverage(op_names: Iterable[str], counts: Iterable[int] | None = None) -> Any:
    """One row per distinct op: its name, flop kind and number of calls.

    ``coverage(trace.ops["op"])`` tallies the calls of a trace; with
    ``counts`` (same length as ``op_names``), ``counts[i]`` calls are added for
    ``op_names[i]``. Rows are sorted unknown first (the ops a FLOP total leaves
    out), then added, registry and zero, each by decreasing count.

    Args:
        op_names: op names as recorded (``"aten.mm.default"``); custom or
            unresolvable names are ``"unknown"``.
        counts: calls per name, or ``None`` for one call per name.

    Returns:
        A DataFrame with columns ``op`` (str), ``kind`` (str), ``count`` (int64).
    """
    import pandas as pd

    tally: dict[str, int] = {}
    if counts is None:
        for name in op_names:
            tally[name] = tally.get(name, 0) + 1
    else:
        names, numbers = list(op_names), list(counts)
        if len(names) != len(numbers):
            raise ValueError(f"coverage: {len(names)} op names but {len(numbers)} counts")
        for name, n in zip(names, numbers):
            tally[name] = tally.get(name, 0) + int(n)
    order = {k: i for i, k in enumerate(FLOP_KINDS)}
    rows = sorted(
        ((str(name), flop_kind(str(name)), n) for name, n in tally.items()),
        key=lambda r: (order[r[1]], -r[2], r[0]),
    )
    return pd.DataFrame(
        {
            "op": pd.Series([r[0] for r in rows], dtype=object),
            "kind": pd.Series([r[1] for r in rows], dtype=object),
            "count": pd.Series([r[2] for r in rows], dtype="int64"),
        }
    )


def flop_coverage(trace: Record) -> Any:
    """One row per distinct op: op, kind (registry/added/zero/unknown), count, flops.

    ``kind == "unknown"`` lists every op without a FLOP formula (counted as no
    figure, never as 0); see :mod:`fakeviz._engine.flops` for the conventions.
    """
    ops = ops_table(trace)
    counts = ops.op.value_counts()
    cov = coverage(list(counts.index.astype(str)), counts.tolist())
    flops = trace.col("flops")
    per_op = ops.assign(_f=np.where(flops > 0, flops, 0)).groupby("op", observed=True)["_f"].sum()
    cov["flops"] = cov.op.map(per_op).fillna(0).astype(np.int64)
    return cov


def flops_by_phase(trace: Record) -> dict[str, int]:
    """Total FLOPs per phase (ops without a formula are left out: see :func:`flop_coverage`)."""
    f = trace.col("flops")
    ph = trace.col("phase")
    return {p: int(f[(ph == i) & (f > 0)].sum()) for i, p in enumerate(PHASES)}
