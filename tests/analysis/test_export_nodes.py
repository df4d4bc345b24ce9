"""``export_nodes``: an exported program's graph as a table, checked against torch.export on real CPU tensors.

It is ``fx_nodes.node_table`` (the table of ``fakeviz.prop``) plus what the export knows: sizes are text.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from fakeviz._analysis.export_nodes import NODE_COLUMNS, export_nodes
from fakeviz._analysis.fx_nodes import COLUMNS, INT_COLUMNS, node_table
from fakeviz._engine.fx import propagate

THIS = str(Path(__file__).resolve())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x) * self.scale  # <- the line of fc and mul
        values, index = h.max(dim=1)
        return values.to(torch.float16), index


def _export(batch: int = 4, dynamic: bool = False) -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(batch, 6)
    shapes = {"x": {0: torch.export.Dim("batch")}} if dynamic else None
    return torch.export.export(Net(), (x,), dynamic_shapes=shapes), x


def test_one_row_per_node_with_the_values_metadata() -> None:
    ep, x = _export()
    nodes = export_nodes(ep)
    assert tuple(nodes.columns) == NODE_COLUMNS
    assert [c for c in NODE_COLUMNS if c != "kind"] == list(COLUMNS)  # fx_nodes' columns, plus kind
    assert NODE_COLUMNS.index("kind") == NODE_COLUMNS.index("target") + 1
    assert list(nodes["name"]) == [n.name for n in ep.graph.nodes]
    by = nodes.set_index("name")
    # placeholders: what they stand for
    assert by.loc["p_fc_weight", ["kind", "target", "module"]].tolist() == ["parameter", "fc.weight", "Net.fc"]
    assert by.loc["b_scale", ["kind", "target", "module"]].tolist() == ["buffer", "scale", "Net"]
    assert by.loc["x", ["kind", "target", "shape", "stride"]].tolist() == ["input", "x", "[4, 6]", "[6, 1]"]
    # ops: target, the value's metadata, module and the user's line
    line = next(i for i, s in enumerate(Path(THIS).read_text().splitlines(), 1) if "# <- the line of fc" in s)
    lin = by.loc["linear"]
    assert lin["target"] == "aten.linear.default" and lin["kind"] == "op" and lin["module"] == "Net.fc"
    assert lin["user_line"] == f"{THIS}:{line} in forward"
    assert by.loc["mul", "user_line"] == f"{THIS}:{line} in forward" and by.loc["mul", "module"] == "Net"
    assert by.loc["output", "kind"] == "output"


def test_shapes_dtypes_and_bytes_equal_the_real_run() -> None:
    ep, x = _export()
    by = export_nodes(ep).set_index("name")
    real = Net()
    real.load_state_dict(ep.state_dict)
    h = real.fc(x) * real.scale
    values, index = h.max(dim=1)
    half = values.to(torch.float16)
    for name, t in (("linear", real.fc(x)), ("mul", h), ("to", half)):
        row = by.loc[name]
        assert row["shape"] == str(list(t.shape)) and row["stride"] == str(list(t.stride())), name
        assert row["dtype"] == str(t.dtype).removeprefix("torch.") and row["device"] == str(t.device)
        assert row["bytes"] == row["bytes_hint"] == t.numel() * t.element_size()
    # a node with two values (max.dim): both shapes, both dtypes, the bytes of both
    multi = by.loc[by["target"] == "aten.max.dim"].iloc[0]
    assert multi["shape"] == f"({list(values.shape)}, {list(index.shape)})"
    assert multi["dtype"] == "float32, int64" and multi["device"] == "cpu"
    assert multi["bytes"] == values.numel() * 4 + index.numel() * 8
    assert by.loc["getitem_1", ["shape", "dtype"]].tolist() == ["[4]", "int64"]


def test_symbolic_sizes_stay_symbols() -> None:
    ep, _ = _export(dynamic=True)
    by = export_nodes(ep).set_index("name")
    m = re.fullmatch(r"\[(s\d+), 6\]", by.loc["x", "shape"])
    assert m, by.loc["x", "shape"]
    assert by.loc["linear", "bytes"] == -1 and by.loc["p_fc_weight", "bytes"] == 8 * 6 * 4
    assert by.loc["linear", "bytes_expr"] == f"32*{m[1]}" and by.loc["linear", "bytes_hint"] == 4 * 8 * 4
    assert by.loc["output", "bytes"] == -1  # no tensor of its own
    # reading the table did not specialise the program: it still runs at another batch size
    assert ep.module()(torch.randn(7, 6))[0].shape == (7,)


def test_no_program_is_an_empty_table_with_the_columns() -> None:
    nodes = export_nodes(None)
    assert nodes.empty and tuple(nodes.columns) == NODE_COLUMNS
    full = export_nodes(_export()[0])
    assert nodes.dtypes.to_dict() == full.dtypes.to_dict()
    assert all(str(nodes[c].dtype) == "int64" for c in INT_COLUMNS)


def test_the_same_facts_as_prop_writes_them() -> None:
    """One definition: the export's table and fakeviz.prop's table of the same graph agree on every value column."""
    ep, x = _export()
    ours = export_nodes(ep).set_index("name")
    gm = ep.module()
    theirs = node_table(propagate(gm, x)).set_index("name")
    same = ["shape", "dtype", "device", "stride", "bytes", "bytes_expr", "bytes_hint"]
    for name in ("linear", "mul", "max_1", "getitem_1", "to"):
        assert ours.loc[name, same].tolist() == theirs.loc[name, same].tolist(), name
    assert ours.loc["linear", "user_line"] == theirs.loc["linear", "user_line"]
