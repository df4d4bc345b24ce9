"""The fidelity report: meta-less ops, fallback kernels, data-dependent ops, the stopping error."""

from __future__ import annotations

import pytest
import torch

import fakeviz as fv
from fakeviz._analysis.fidelity import op_rule


def test_rules_of_known_ops():
    assert op_rule("aten.mm.default") == "python meta"
    assert op_rule("aten.add.Tensor") == "meta kernel"
    assert op_rule("aten.empty.memory_format") == "fake impl"
    assert op_rule("aten.mish_backward.default") == "decomposition"
    assert op_rule("aten._add_relu.Scalar") == "meta kernel"  # statically; at run time it falls back
    assert op_rule("aten.masked_select.default") == "fake impl"
    assert op_rule("aten.no_such_op.default") == "unknown op"


def test_fallback_kernel_is_reported_with_its_line():
    with fv.record() as trace:
        x = torch.randn(4, 4)
        y = torch.ops.aten._add_relu(x, 1.0)  # no meta kernel: fake mode runs the real kernel on zeros
    assert y.shape == (4, 4) and fv.is_fake(y)
    rep = trace.fidelity()
    assert rep["fake"] is True
    wm = rep["without_meta"]
    assert list(wm.op) == ["aten._add_relu.Scalar"]
    assert wm.fallback_runs.iloc[0] == 1 and wm.rule.iloc[0] == "fallback kernel"
    assert "test_fidelity_report.py" in wm.user_line.iloc[0]
    assert list(rep["fallbacks"].op) == ["aten._add_relu.Scalar"]
    assert rep["fallbacks"].seq.iloc[0] == trace.ops[trace.ops.op == "aten._add_relu.Scalar"].seq.iloc[0]


def test_data_dependent_ops_are_listed():
    with fv.record(symbolic=True) as trace:
        x = torch.empty(8)  # values unknown (a small draw would be known: Note: [values under fake tensors])
        idx = torch.nonzero(x > 0)
        idx.sum()
    rep = trace.fidelity()
    dd = rep["data_dependent"]
    assert "aten.nonzero.default" in set(dd.op)
    assert "u0" in dd[dd.op == "aten.nonzero.default"]["shape"].iloc[0]
    assert rep["ops"].set_index("op").loc["aten.nonzero.default"].data_dependent == 1


def test_stopping_error_is_in_the_report():
    with pytest.raises(fv.DataDependentError):
        with fv.record() as trace:
            x = torch.empty(8)  # values unknown
            if x.sum() > 0:
                pass
    rep = trace.fidelity()
    assert rep["error"]["type"] == "DataDependentOutputException"
    assert rep["error"]["op"] == "aten._local_scalar_dense.default"


@pytest.mark.parametrize("name", ["llama", "t5", "convnet_channels_last"])
def test_zoo_ops_all_have_meta_rules(name):
    import zoo

    with fv.record() as trace:
        zoo.run(name)
    rep = trace.fidelity()
    assert rep["without_meta"].empty, rep["without_meta"]
    assert set(rep["ops"].rule) <= {"python meta", "decomposition", "composite", "fake impl", "meta kernel"}
    assert rep["ops"]["count"].sum() == trace.num_ops


def test_grouped_mm_has_fakeviz_rule():
    assert op_rule("aten._grouped_mm.default") == "fakeviz rule"  # Note: [grouped_mm under fake tensors]


def test_assumptions_list_engine_rows_and_per_op_assumptions():
    """``assumptions`` merges what the engine appended to ``trace.meta["assumptions"]`` while recording (one row
    per call) with the assumption an op's record rests on (one row at its first call, ``calls`` its calls)."""
    with fv.record() as plain:
        torch.randn(4, 4).sum()
    empty = plain.fidelity()["assumptions"]
    assert list(empty.columns) == ["seq", "op", "assumption", "calls", "module", "user_line"] and len(empty) == 0

    offs = torch.tensor([2, 5], dtype=torch.int32)
    with fv.record() as trace:
        a, b = torch.randn(5, 16), torch.randn(2, 16, 8)
        torch._grouped_mm(a, b, offs=offs)
        trace.meta.setdefault("assumptions", []).append([1, "aten.randn.default", "a value assumed for the test"])
        torch._grouped_mm(a, b, offs=offs)
    rows = trace.fidelity()["assumptions"]
    assert list(rows.op) == ["aten.randn.default", "aten._grouped_mm.default"]
    assert rows.calls.tolist() == [1, 2]
    first_grouped = int(trace.ops[trace.ops.op == "aten._grouped_mm.default"].seq.iloc[0])
    assert rows.seq.tolist() == [1, first_grouped]
    assert rows.assumption.iloc[0] == "a value assumed for the test"
    assert "every row is routed" in rows.assumption.iloc[1]
    assert rows.module.isna().all() and "test_fidelity_report.py" in rows.user_line.iloc[1]  # top level


def test_fake_cuda_api_stand_ins_are_assumptions() -> None:
    """What the fake torch.cuda API answers without a GPU (elapsed time, empty_cache) is listed, never silent."""
    import torch

    import fakeviz as fv

    with fv.record(device="cuda:0", gpu="H100") as trace:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        x = torch.ones(256, 256)
        (x @ x).sum()
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) == 0.0
        torch.cuda.empty_cache()
    rows = trace.fidelity()["assumptions"]
    timing = rows[rows.op == "torch.cuda.Event.elapsed_time"]
    assert len(timing) == 1 and int(timing.calls.iloc[0]) == 1 and int(timing.seq.iloc[0]) == -1
    cache = rows[rows.op == "torch.cuda.empty_cache"]
    assert len(cache) == 1 and int(cache.seq.iloc[0]) == trace.num_ops  # after the last op
    assert "reserved" in cache.assumption.iloc[0]
