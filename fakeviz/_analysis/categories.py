"""Memory categories: which one each storage belongs to, from its roles and the phase that made it.

Categories
----------
Each storage gets exactly one category, from what the recorder saw it used as
(``ROLES``) and the phase of the op that created it, in this order:

==================  ==========================================================
Parameter           a parameter of a module seen in the run
Buffer              a registered buffer
Gradient            the ``.grad`` of a leaf after a backward (or at an optimizer step)
Optimizer state     a tensor in ``optimizer.state`` after a step
KV cache            held by a KV cache (a transformers ``Cache``: its layers' keys and
                    values) at a top-level model call, as ``fakeviz._engine.kv_cache``
                    finds them (Note: [KV cache storages])
Input               an argument of a top-level module call (not a parameter)
Activation          saved for backward, as autograd's saved-tensor hooks report it
Temporary           anything else created once the run started: in forward,
                    backward or optimizer ops, or at top level after the first
                    forward (the loss, its ``ones_like`` seed)
Other               anything else (created at init, before the first forward,
                    or before recording)
==================  ==========================================================

A storage carried into a ``%%fake`` cell from an earlier cell of the same fake
session (``st_carried``) keeps its roles and the phase of the op that made it
there, so it has the category it would have in one recording of both cells.

The category holds for the storage's whole life. This is where we differ from
PyTorch's MemTracker on purpose: MemTracker labels a tensor when it first sees
it, so a gradient produced by a backward op is counted as "Temp" until the
AccumulateGrad that makes it ``.grad``, and stays "Temp" in the snapshot at the
backward peak. The bytes are the same storage before and after; we call them
Gradient all along (``tests/analysis/test_memory.py`` shows it on GPT-2).

Activations are the storages autograd saved for backward (MemTracker's "Act"
is every tensor created in a module's forward). A view of a parameter saved for
backward stays a Parameter; checkpointed regions save nothing, so their
recomputed tensors are Temporary.

A KV cache storage is KV cache even when it was also an input (the cache passed
back to the model at each decode step) or saved for backward: what holds it
across calls is the cache.
"""

from __future__ import annotations

import numpy as np

from .._core.record import Record
from .._core.schema import (
    CATEGORIES,
    PHASES,
    ROLE_BUFFER,
    ROLE_GRAD,
    ROLE_INPUT,
    ROLE_KV,
    ROLE_OPT,
    ROLE_PARAM,
    ROLE_SAVED,
)

__all__ = ["C_ACT", "C_KV", "storage_categories"]

C_PARAM, C_BUFFER, C_GRAD, C_OPT, C_ACT, C_KV, C_TEMP, C_INPUT, C_OTHER = range(len(CATEGORIES))
_P_FORWARD, _P_BACKWARD, _P_OPTIMIZER, _P_OTHER = (
    PHASES.index(p) for p in ("forward", "backward", "optimizer", "other")
)
assert (CATEGORIES[C_ACT], CATEGORIES[C_KV], CATEGORIES[C_OTHER]) == ("Activation", "KV cache", "Other")
# (role bit, category) in priority order
_ROLE_ORDER = (
    (ROLE_PARAM, C_PARAM),
    (ROLE_BUFFER, C_BUFFER),
    (ROLE_GRAD, C_GRAD),
    (ROLE_OPT, C_OPT),
    (ROLE_KV, C_KV),
    (ROLE_INPUT, C_INPUT),
    (ROLE_SAVED, C_ACT),
)


def storage_categories(trace: Record) -> np.ndarray:
    """One category code (index into :data:`CATEGORIES`) per storage."""
    roles = trace.col("st_roles").astype(np.int64)
    alloc = trace.col("st_alloc")
    phase_col = trace.col("phase")
    n_ops = len(phase_col)
    made = (alloc >= 0) & (alloc < n_ops)
    phase = np.full(len(alloc), -1, np.int64)
    if n_ops:
        phase[made] = phase_col[alloc[made]]
    carried = trace.col("st_carried")  # kept from the earlier cell that made it (its roles are carried too)
    phase = np.where(carried >= 0, carried, phase)
    in_run = (phase == _P_FORWARD) | (phase == _P_BACKWARD) | (phase == _P_OPTIMIZER) | (phase == _P_OTHER)
    cat = np.where(in_run, C_TEMP, C_OTHER).astype(np.int8)
    for bit, code in reversed(_ROLE_ORDER):  # highest priority written last
        cat[(roles & bit) != 0] = code
    return cat
