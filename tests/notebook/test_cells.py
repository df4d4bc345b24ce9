"""``%%fake`` across cells through a real InteractiveShell: memory is one story (issue 15, item 1).

Cell 1 builds a model and its AdamW optimizer, cell 2 runs forward and backward, cell 3 steps. Each cell's
trace starts with the storages earlier cells left alive (carried in, category kept), so cell 3's curve is
the one-block record's over the same ops, and ``%fake_trace`` is the one-block record's whole curve; a real
CPU run of the same code gives the same curve.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fakeviz as fv
from fakeviz._analysis.memory import category_curves, live_bytes

IPython = pytest.importorskip("IPython")

CELLS = (
    "torch.manual_seed(0)\n"
    "m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))\n"
    "opt = torch.optim.AdamW(m.parameters(), lr=1e-3)\n",
    "x = torch.randn(8, 64)\nloss = m(x).pow(2).mean()\nloss.backward()\n",
    "opt.step()\nopt.zero_grad()\n",
)


def _one_block(fake: bool):
    ns = {"torch": torch}
    with fv.record(fake=fake) as trace:
        for code in CELLS:
            exec(compile(code, "<cells>", "exec"), ns)
    return trace


def _run_cells(ip):
    for i, code in enumerate(CELLS, 1):
        r = ip.run_cell(f"%%fake -o t{i} --no-display\n{code}", store_history=True)
        assert r.error_in_exec is None, r.error_in_exec
    return [ip.user_ns[f"t{i}"] for i in (1, 2, 3)]


def test_each_cell_starts_with_what_the_session_holds(ip):
    t1, t2, t3 = _run_cells(ip)
    one, real = _one_block(True), _run_real()
    curve = live_bytes(one)["cpu"]
    assert np.array_equal(curve, live_bytes(real)["cpu"])  # the one-block fake record is the real run's
    starts = np.cumsum([0, t1.num_ops, t2.num_ops])
    for t, start in zip((t1, t2, t3), starts):
        assert np.array_equal(live_bytes(t)["cpu"], curve[start : start + t.num_ops])
        assert np.array_equal(category_curves(t)["cpu"], category_curves(one)["cpu"][start : start + t.num_ops])
    # the optimizer cell: parameters and gradients of the earlier cells count, marked as carried in
    assert t3.peak()["cpu"].bytes == curve[starts[2] :].max() == live_bytes(real)["cpu"][starts[2] :].max()
    st = t3.storages
    carried = t3.col("st_carried") >= 0
    assert set(st.category[carried]) >= {"Parameter", "Gradient"}  # AdamW makes its state at the first step
    params = sum(p.numel() * 4 for p in ip.user_ns["m"].parameters())
    assert st.nbytes[carried & (st.category == "Parameter").to_numpy()].sum() == params
    assert set(st.name[carried & (st.category == "Parameter").to_numpy()]) == {
        "Sequential.0.weight", "Sequential.0.bias", "Sequential.2.weight", "Sequential.2.bias",
    }  # fmt: skip
    assert t3.meta["label"].startswith("Cell In[")


def _run_real():
    return _one_block(False)


def test_fake_trace_is_the_one_block_record(ip):
    t1, t2, t3 = _run_cells(ip)
    whole = ip.run_line_magic("fake_trace", "")
    one = _one_block(True)
    assert whole.num_ops == one.num_ops == t1.num_ops + t2.num_ops + t3.num_ops
    assert list(whole.ops.op) == list(one.ops.op)
    assert np.array_equal(live_bytes(whole)["cpu"], live_bytes(one)["cpu"])
    assert np.array_equal(category_curves(whole)["cpu"], category_curves(one)["cpu"])
    assert whole.peak()["cpu"].bytes == one.peak()["cpu"].bytes
    cells = whole.meta["cells"]
    assert [(c["start"], c["end"]) for c in cells] == [
        (0, t1.num_ops), (t1.num_ops, t1.num_ops + t2.num_ops), (t1.num_ops + t2.num_ops, whole.num_ops),
    ]  # fmt: skip
    assert [c["label"] for c in cells] == [t.meta["label"] for t in (t1, t2, t3)]
    # the ops table names cells as IPython does, never the shell's file names
    lines = set(whole.ops.user_line.dropna())
    assert lines and all(x.startswith("Cell In[") for x in lines), lines
    assert any(x.startswith(f"{cells[1]['label']}, line 3") for x in lines)
    assert not any("ipython-input" in x or "ipykernel" in x for x in whole.strings("lines"))
    # -o stores it; a saved session trace reads back the same
    ip.run_line_magic("fake_trace", "-o whole")
    assert isinstance(ip.user_ns["whole"], fv.Trace)


def test_fake_trace_without_cells_is_a_usage_error(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="no %%fake cell"):
        ip.run_line_magic("fake_trace", "--session nothing")


def test_storage_freed_between_cells_ends_at_the_boundary(ip):
    assert ip.run_cell("%%fake -o t1 --no-display\nx = torch.ones(1000)\nloss = torch.ones(10)\n").error_in_exec is None
    ip.run_cell("del x")  # a plain cell frees it between the two fake cells
    assert ip.run_cell("%%fake -o t2 --no-display\nloss = loss * 2\n").error_in_exec is None
    t2 = ip.user_ns["t2"]
    assert live_bytes(t2)["cpu"].tolist() == [80]  # the old loss (carried) and the new one
    whole = ip.run_line_magic("fake_trace", "")
    st = whole.storages
    big = st[st.nbytes == 4000]
    assert big.free_seq.tolist() == [2]  # freed where cell 2 starts
    assert live_bytes(whole)["cpu"].tolist() == [4000, 4040, 80]


def test_carried_column_reads_back_from_fvz(ip, tmp_path):
    _, _, t3 = _run_cells(ip)
    path = tmp_path / "cell3.fvz"
    t3.save(path)
    back = fv.load(path)
    assert np.array_equal(back.col("st_carried"), t3.col("st_carried"))
    assert back.peak()["cpu"].bytes == t3.peak()["cpu"].bytes
