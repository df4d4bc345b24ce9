"""Fidelity report: how far each recorded op's fake result can be trusted.

A fake run is only as good as the shape rules behind each op. For every op in a
trace this module says which rule FakeTensorMode used for it (in the order
``FakeTensorMode._dispatch_impl`` tries them, torch 2.x):

================  =============================================================
fakeviz rule      fakeviz's own rule, for ops whose torch rule is not the real
                  kernel's (``aten._grouped_mm``: Note: [grouped_mm under fake
                  tensors] in ``fakeviz._engine.moe``)
python meta       a Python meta function (``torch._decomp.meta_table``)
decomposition     a Python decomposition into other ops (``torch._decomp``)
composite         a CompositeImplicitAutograd decomposition
fake impl         FakeTensorMode's own implementation (constructors, ops with
                  data-dependent outputs, index ops: ``fake_impls``) or a
                  custom op's registered fake kernel
meta kernel       a C++ meta kernel (structured kernels, ``Meta`` dispatch key)
fallback kernel   no meta kernel at all: FakeTensorMode runs the *real* kernel on
                  zero-filled tensors and copies the output's metadata (slow,
                  and only valid when the output shape does not depend on data)
no rule           none of the above: the op fails under fake tensors
================  =============================================================

plus what happened at run time: fallback kernels actually run (captured while
recording), ops whose output size depends on data (unbacked symbolic sizes),
the data-dependent error that stopped the run, attention calls whose
backend fakeviz chose (``fakeviz._engine.attention``), and the assumptions
behind the record where a value was not known (``assumptions``, see
:func:`fidelity_report`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core.record import Record
from .._core.schema import FLAG_DATA_DEPENDENT
from .tables import ops_table

__all__ = ["fidelity_report", "op_rule"]

_RULE_CACHE: dict[str, str] = {}


def op_rule(name: str) -> str:
    """Which rule FakeTensorMode uses for op ``name`` (see the module docstring)."""
    hit = _RULE_CACHE.get(name)
    if hit is not None:
        return hit
    import torch
    from torch._decomp import decomposition_table, meta_table
    from torch._subclasses import fake_impls

    from .._engine.ctc import FAKE_RULE_OPS as CTC_RULE_OPS
    from .._engine.flops import resolve_op
    from .._engine.moe import FAKE_RULE_OPS
    from .._engine.quant_kernels import FAKE_RULE_OPS as QUANT_RULE_OPS

    func = resolve_op(name)
    if func is not None and not torch._C._dispatch_has_kernel(func.name()):
        func = None  # a Python-only overload (aten.__and__.bool): nothing to dispatch
    if func is None:
        rule = "unknown op"
    elif name in FAKE_RULE_OPS or name in CTC_RULE_OPS or name in QUANT_RULE_OPS:
        rule = "fakeviz rule"
    elif func in meta_table:
        rule = "python meta"
    elif func not in _cpp_meta_symint() and func in decomposition_table and _torch_decomp(func):
        rule = "decomposition"
    elif func not in _cpp_meta_symint() and torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd"
    ):
        rule = "composite"
    elif torch._library.simple_registry.singleton.find(func.name()).fake_impl.kernel is not None or any(
        check(func) for check, _ in fake_impls.op_implementations_checks
    ):
        rule = "fake impl"
    elif torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), "Meta"):
        # a kernel for Meta exists (own or via an alias key); some of them still raise
        # NotImplementedError, and the fallback kernel runs: see fallback_runs
        rule = "meta kernel"
    elif func.namespace in ("aten", "prims", "quantized"):
        rule = "fallback kernel"
    else:
        rule = "no rule"
    _RULE_CACHE[name] = rule
    return rule


def _cpp_meta_symint() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return getattr(FakeTensorMode, "_cpp_meta_supports_symint", ())


def _torch_decomp(func: Any) -> bool:
    try:
        from torch._subclasses.fake_tensor import torch_decomp_decompositions

        return bool(torch_decomp_decompositions(func))
    except Exception:  # noqa: BLE001 - private helper moved: assume a decomposition is used
        return True


def fidelity_report(trace: Record) -> dict[str, Any]:
    """How each op of ``trace`` was faked, and what limited fidelity at run time.

    Returns a dict with

    * ``ops``: DataFrame, one row per distinct op: op, count, rule, first_seq,
      module, user_line (of its first call), fallback_runs (fallback kernels run
      while recording), data_dependent (calls with a data-dependent output size);
    * ``without_meta``: the subset of ``ops`` whose rule is not a meta function
      (fallback kernel, no rule, unknown op);
    * ``fallbacks``: DataFrame of fallback-kernel runs (seq, op);
    * ``data_dependent``: DataFrame of calls with data-dependent output sizes;
    * ``attention``: DataFrame of attention calls and the backend chosen (fake cuda);
    * ``deepcopies``: DataFrame (seq, tensor) of tensors made by ``copy.deepcopy`` while recording: a fake
      deepcopy clones (``aten.clone``) where a real one copies the storage outside any aten op or goes
      through ``Parameter.__deepcopy__`` (``detach``, ``clone``), so the op logs differ there while the
      storages and their bytes are the same (Note: [deepcopy of recorded tensors]);
    * ``assumptions``: DataFrame (seq, op, assumption, calls, module, user_line; seq -1 for the whole run):
      what the record assumed, including what the fake ``torch.cuda`` API answered without a GPU
      (``Event.elapsed_time``, ``empty_cache``) and where ``torch.tensor(..., device="cuda")`` logs other ops than
      a GPU does (Note: [torch.tensor on fake cuda without a GPU]); otherwise
      where a value it needed was not known, one row per assumption, in op order. Two sources: the engine
      appends ``[seq, op, assumption, module, user_line]`` rows to ``trace.meta["assumptions"]`` while
      recording (one call each, ``calls`` 1; module and line may be left off), and ops whose record rests on
      an assumption stated once for the op (the routing of mixture-of-experts ops,
      :func:`fakeviz._engine.moe.op_assumption`) get one row at their first call (its module and line), with
      ``calls`` the number of calls it covers;
    * ``error``: the error that stopped the run, if any, and ``fake``: whether the
      run was fake (a real run's rules say how a fake run *would* fake it).
    """
    import pandas as pd

    ops = ops_table(trace)
    n = len(ops)
    flags = trace.col("flags")
    dd = (flags & FLAG_DATA_DEPENDENT) != 0
    fallbacks = pd.DataFrame(trace.meta.get("fallback_kernels") or [], columns=["seq", "op"])
    attention = pd.DataFrame(trace.meta.get("attention_calls") or [], columns=["seq", "backend", "setting", "reason"])
    if n:
        first = ops.drop_duplicates("op")[["op", "seq", "module", "user_line"]].rename(columns={"seq": "first_seq"})
        counts = ops.op.value_counts()
        ddc = ops[dd].op.value_counts()
        fbc = fallbacks.op.value_counts() if len(fallbacks) else pd.Series(dtype=np.int64)
        names = first.op.astype(str).tolist()
        table = pd.DataFrame(
            {
                "op": names,
                "count": [int(counts[o]) for o in names],
                # a fallback that ran overrides the static rule
                "rule": ["fallback kernel" if fbc.get(o, 0) else op_rule(o) for o in names],
                "first_seq": first.first_seq.to_numpy(),
                "module": first.module.astype(object).to_numpy(),
                "user_line": first.user_line.astype(object).to_numpy(),
                "fallback_runs": [int(fbc.get(o, 0)) for o in names],
                "data_dependent": [int(ddc.get(o, 0)) for o in names],
            }
        )
    else:
        table = pd.DataFrame(
            columns=["op", "count", "rule", "first_seq", "module", "user_line", "fallback_runs", "data_dependent"]
        )
    without = table[table.rule.isin(["fallback kernel", "no rule", "unknown op"]) | (table.fallback_runs > 0)]
    dd_calls = ops[dd][["seq", "op", "module", "user_line", "shape"]].reset_index(drop=True)
    return {
        "fake": bool(trace.meta.get("fake", True)),
        "ops": table.reset_index(drop=True),
        "without_meta": without.reset_index(drop=True),
        "fallbacks": fallbacks,
        "data_dependent": dd_calls,
        "attention": attention,
        "deepcopies": pd.DataFrame(trace.meta.get("deepcopies") or [], columns=["seq", "tensor"]),
        "assumptions": _assumptions(trace, table),
        "error": trace.error,
    }


def _assumptions(trace: Record, table: Any) -> Any:
    """The ``assumptions`` table of :func:`fidelity_report` (``table``: its ``ops`` table)."""
    import pandas as pd

    from .._engine.moe import op_assumption
    from .._engine.quant_kernels import op_assumption as kernel_assumption
    from .._engine.torchao_patches import op_assumption as torchao_assumption

    rows = []
    for seq, op, text, *where in trace.meta.get("assumptions") or []:
        module, line = (list(where) + [None, None])[:2]
        rows.append((int(seq), str(op), str(text), 1, module, line))
    for op, first, count, module, line in zip(
        table.op.tolist(), table.first_seq.tolist(), table["count"].tolist(), table.module.tolist(), table.user_line
    ):
        text = op_assumption(op) or kernel_assumption(op)  # Note: [quantized kernels through fake rules]
        text = text or torchao_assumption(op)  # torchao's CUDA-only kernels (fakeviz._engine.torchao_patches)
        if text is not None:
            rows.append((int(first), op, text, int(count), module, line))
    rows.extend(_cuda_api_rows(trace.meta.get("cuda_api") or {}))
    rows.extend(_lift_rows(trace))
    rows.sort(key=lambda r: r[0])
    return pd.DataFrame(rows, columns=["seq", "op", "assumption", "calls", "module", "user_line"])


def _cuda_api_rows(notes: dict[str, Any]) -> list[tuple[int, str, str, int, Any, Any]]:
    """What the fake ``torch.cuda`` API answered without a GPU behind it (``fakeviz._engine.cuda_api``)."""
    rows: list[tuple[int, str, str, int, Any, Any]] = []
    if notes.get("elapsed_time"):
        rows.append((-1, "torch.cuda.Event.elapsed_time",
                     "no kernel runs under fake tensors: every elapsed_time() answered 0.0 ms",
                     int(notes["elapsed_time"]), None, None))  # fmt: skip
    for seq in notes.get("empty_cache") or []:
        rows.append((int(seq), "torch.cuda.empty_cache",
                     "the allocator model releases no cached segment here: reserved memory after this point can "
                     "be above a real run's (allocated memory is unaffected)", 1, None, None))  # fmt: skip
    return rows


LIFT_ON_CPU = (
    "torch.tensor(data, device='cuda...') without a GPU: FakeTensorMode makes the tensor on cpu, lifts it there "
    "(lift_fresh on cpu) and copies it to the device (_to_copy), where a GPU's log has one lift_fresh of the cuda "
    "tensor: one op and one small cpu tensor more per call, and the $N ids after it one higher; the cuda tensor "
    "is the same"
)


def _lift_rows(trace: Record) -> list[tuple[int, str, str, int, Any, Any]]:
    """Note: [torch.tensor on fake cuda without a GPU]
    ``torch.tensor(data, device="cuda")`` makes the data on cpu and moves it with every mode off, then lifts the
    device tensor: a GPU's log has ``$5: f32[] cuda:0 = aten.lift_fresh.default($5)``. Where torch cannot make a
    cuda tensor (a CPU-only build, a CUDA build without a GPU: ``FakeTensorMode.avoid_device_init``), torch lifts
    on cpu and then copies (``torch._C._set_only_lift_cpu_tensors``): ``$5: f32[] cpu = aten.lift_fresh($5)``,
    ``$6: f32[] cuda:0 = aten._to_copy($5, device=cuda:0)``. A fake record on fakeviz's shim lifts on the device as
    a GPU does for ``torch.tensor``, ``torch.as_tensor`` and ``Tensor.new_tensor`` of Python data (patch
    ``tensor-lift``, ``recorder/modes.py``); what is left is torch's way (data holding tensors, torch's builtin
    bound before the record). One row, at the first such pair, counts them: a
    ``lift_fresh`` on cpu whose output the next op, a ``_to_copy``, copies to a cuda device, in a fake record on
    fakeviz's shim (a user's own ``torch.tensor(x).cuda()`` on one line reads the same, and is counted too)."""
    if not trace.meta.get("fake", True) or trace.meta.get("fake_cuda") != "shim":
        return []
    c, s = trace.columns(), trace.string_tables()
    names = list(s["ops"])
    if "aten.lift_fresh.default" not in names or "aten._to_copy.default" not in names:
        return []
    op = c["op"]
    lift, copy = names.index("aten.lift_fresh.default"), names.index("aten._to_copy.default")
    pairs = np.nonzero((op[:-1] == lift) & (op[1:] == copy))[0]
    if not len(pairs):
        return []
    out_end, in_end = c["out_end"], c["in_end"]
    devices = [str(d) for d in s["devices"]]
    hits = []
    for i in pairs.tolist():
        o_lift = int(out_end[i - 1]) if i else 0
        o_copy, i_copy = int(out_end[i]), int(in_end[i])
        if int(out_end[i]) - o_lift != 1 or int(out_end[i + 1]) - o_copy != 1 or int(in_end[i + 1]) == i_copy:
            continue
        if (devices[int(c["out_device"][o_lift])] == "cpu" and devices[int(c["out_device"][o_copy])].startswith("cuda")
                and int(c["in_tensor"][i_copy]) == int(c["out_tensor"][o_lift])):  # fmt: skip
            hits.append(i)
    if not hits:
        return []
    ops = ops_table(trace)
    first = hits[0]
    return [
        (first, "aten.lift_fresh.default", LIFT_ON_CPU, len(hits), ops.module.iloc[first], ops.user_line.iloc[first])
    ]
